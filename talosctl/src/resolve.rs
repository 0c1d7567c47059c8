//! Turning what the user typed (`hostname`, `rd`, `AddressSpecs.net.talos.dev`) into a resource
//! type, namespace and columns, through the ResourceDefinitions in `meta`.

use anyhow::{bail, Context as _};
use cosi::{Client, Query, ResourceDefinition, ResourceSpec as _, META_NAMESPACE};

use crate::jsonpath::Template;
use crate::output::Column;

/// A resolved resource kind.
#[derive(Clone, Debug)]
pub struct Kind {
    /// Full type name.
    pub r#type: String,
    /// What the table's TYPE column shows.
    pub display_type: String,
    /// Namespace to read.
    pub namespace: String,
    /// Extra table columns.
    pub columns: Vec<Column>,
}

/// Resolves `name` (type, display type or alias, any case) against the definitions stated holds.
/// A name no definition knows is taken as a type name verbatim, which needs `namespace`.
pub async fn resolve(client: &Client, name: &str, namespace: Option<&str>) -> anyhow::Result<Kind> {
    let raws = client
        .list(META_NAMESPACE, ResourceDefinition::TYPE, &Query::default())
        .await
        .with_context(|| format!("cannot list resource definitions from {}", client.peer()))?;
    let definitions: Vec<ResourceDefinition> = raws
        .iter()
        .filter_map(|raw| match raw.decode::<ResourceDefinition>() {
            Ok(r) => Some(r.spec),
            Err(e) => {
                tracing::warn!(id = %raw.metadata.id, error = %cosi::error::Chain(&e), "skipping undecodable resource definition");
                None
            }
        })
        .collect();
    // Types this talosctl was built with fill in for definitions no daemon has registered yet
    // (the node's definitions win).
    let mut definitions = definitions;
    for rd in machinery::resources::definitions() {
        if !definitions
            .iter()
            .any(|d| d.resource_type == rd.resource_type)
        {
            definitions.push(rd);
        }
    }
    match pick(&definitions, name)? {
        Some(rd) => Ok(Kind {
            r#type: rd.resource_type.clone(),
            display_type: rd.display_type.clone(),
            namespace: namespace
                .map(str::to_string)
                .unwrap_or_else(|| rd.default_namespace.clone()),
            columns: columns(rd),
        }),
        None => {
            let Some(namespace) = namespace else {
                bail!(
                    "resource type {name:?} is not defined in namespace {META_NAMESPACE:?} \
                     (see `talosctl get rd`); to read it anyway give its full type name and --namespace"
                );
            };
            Ok(Kind {
                r#type: name.to_string(),
                display_type: name.to_string(),
                namespace: namespace.to_string(),
                columns: Vec::new(),
            })
        }
    }
}

/// The definition `name` means: an exact type name first, then aliases. Several definitions
/// sharing an alias is an error naming them.
fn pick<'a>(
    definitions: &'a [ResourceDefinition],
    name: &str,
) -> anyhow::Result<Option<&'a ResourceDefinition>> {
    if let Some(rd) = definitions
        .iter()
        .find(|rd| rd.resource_type.eq_ignore_ascii_case(name))
    {
        return Ok(Some(rd));
    }
    let lower = name.to_lowercase();
    let matching: Vec<&ResourceDefinition> = definitions
        .iter()
        .filter(|rd| {
            rd.matches(name)
                || rd.display_type.to_lowercase() == lower
                || rd.aliases.iter().any(|a| a.to_lowercase() == lower)
        })
        .collect();
    match matching.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => bail!(
            "resource type {name:?} is ambiguous: it names {}",
            many.iter()
                .map(|rd| rd.resource_type.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn columns(rd: &ResourceDefinition) -> Vec<Column> {
    rd.print_columns
        .iter()
        .map(|c| Column {
            header: c.name.to_uppercase(),
            template: match Template::parse(&c.json_path) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(column = %c.name, r#type = %rd.resource_type, "bad print column: {e}");
                    None
                }
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_by_type_alias_and_display_name() {
        let defs = vec![
            ResourceDefinition::new("HostnameStatuses.net.talos.dev", "network")
                .with_aliases(&["hostname"]),
            ResourceDefinition::new("HostnameSpecs.net.talos.dev", "network"),
            ResourceDefinition::new("Routes.net.talos.dev", "network").with_aliases(&["rt"]),
        ];
        let t = |n: &str| pick(&defs, n).unwrap().map(|rd| rd.resource_type.clone());
        assert_eq!(
            t("hostname").as_deref(),
            Some("HostnameStatuses.net.talos.dev")
        );
        assert_eq!(
            t("HOSTNAMESPEC").as_deref(),
            Some("HostnameSpecs.net.talos.dev")
        );
        assert_eq!(
            t("hostnamespecs.net.talos.dev").as_deref(),
            Some("HostnameSpecs.net.talos.dev")
        );
        assert_eq!(t("RT").as_deref(), Some("Routes.net.talos.dev"));
        assert_eq!(t("nothing"), None);
        // A spec and a status have no acronym (`hs` would name both).
        assert_eq!(t("hs"), None);
        // A name two definitions share (stated refuses the second; an older node may have
        // both) is ambiguous, never one of them at random.
        let defs = vec![
            ResourceDefinition::new("Routes.net.talos.dev", "network").with_aliases(&["rt"]),
            ResourceDefinition::new("RouteTables.net.talos.dev", "network").with_aliases(&["rt"]),
        ];
        let err = pick(&defs, "rt").unwrap_err().to_string();
        assert!(err.contains("ambiguous"), "{err}");
    }
}
