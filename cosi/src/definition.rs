//! Resource definitions and namespaces: the `meta` namespace that lets `talosctl get` resolve
//! aliases and print columns for types it was not compiled with.

use serde::{Deserialize, Serialize};

use crate::resource::ResourceSpec;

/// The namespace of Namespace and ResourceDefinition resources.
pub const META_NAMESPACE: &str = "meta";

/// A column that `talosctl get` prints for a type, from a JSONPath-like expression on the spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrintColumn {
    /// Column header.
    pub name: String,
    /// Path into the spec, as `{.field.sub}`.
    pub json_path: String,
}

/// Whether a type may carry secrets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sensitivity {
    /// Anyone with read access may read it.
    #[default]
    #[serde(rename = "")]
    NonSensitive,
    /// Admin only.
    Sensitive,
}

/// The spec of a `ResourceDefinitions.meta.cosi.dev` resource (COSI's ResourceDefinitionSpec).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDefinition {
    /// Full type name, e.g. `AddressSpecs.net.talos.dev`.
    pub resource_type: String,
    /// Singular display name, e.g. `AddressSpec`.
    pub display_type: String,
    /// Namespace the type lives in by default.
    pub default_namespace: String,
    /// Short aliases shown in listings.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Every name that resolves to this type.
    #[serde(default)]
    pub all_aliases: Vec<String>,
    /// Extra columns for table output.
    #[serde(default)]
    pub print_columns: Vec<PrintColumn>,
    /// Sensitivity.
    #[serde(default)]
    pub sensitivity: Sensitivity,
}

impl ResourceSpec for ResourceDefinition {
    const TYPE: &'static str = "ResourceDefinitions.meta.cosi.dev";
    const DEFAULT_NAMESPACE: &'static str = META_NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, META_NAMESPACE)
            .with_aliases(&["api-resources"])
            .with_columns(&[("Aliases", "{.aliases}")])
    }
}

/// The spec of a `Namespaces.meta.cosi.dev` resource.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSpec {
    /// What the namespace holds.
    #[serde(default)]
    pub description: String,
}

impl ResourceSpec for NamespaceSpec {
    const TYPE: &'static str = "Namespaces.meta.cosi.dev";
    const DEFAULT_NAMESPACE: &'static str = META_NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, META_NAMESPACE).with_aliases(&["ns"])
    }
}

impl ResourceDefinition {
    /// The definition of `resource_type` with COSI's automatic aliases: the lowercase singular,
    /// the acronym of its capitals, the lowercase plural and every `plural.suffix` prefix.
    ///
    /// Unlike COSI, a `…Spec` or `…Status` type gets no acronym: the acronym of one names its
    /// sibling too (`AddressSpec` and `AddressStatus` are both `as`), and a name must name one
    /// type (stated refuses a definition that takes another's name; upstream's talosctl calls
    /// such a name ambiguous).
    pub fn new(resource_type: &str, default_namespace: &str) -> Self {
        let (plural, suffix) = resource_type.split_once('.').unwrap_or((resource_type, ""));
        let singular = singular(plural);
        let mut aliases = vec![singular.to_lowercase()];
        let acronym: String = singular
            .chars()
            .filter(char::is_ascii_uppercase)
            .collect::<String>()
            .to_lowercase();
        let paired = singular.ends_with("Spec") || singular.ends_with("Status");
        if acronym.len() > 1 && !aliases.contains(&acronym) && !paired {
            aliases.push(acronym.clone());
            aliases.push(format!("{acronym}s"));
        }
        let mut all = aliases.clone();
        let lp = plural.to_lowercase();
        all.push(lp.clone());
        let mut prefix = lp;
        for part in suffix.split('.').filter(|p| !p.is_empty()) {
            prefix = format!("{prefix}.{part}");
            all.push(prefix.clone());
        }
        all.dedup();
        Self {
            resource_type: resource_type.to_string(),
            display_type: singular,
            default_namespace: default_namespace.to_string(),
            aliases,
            all_aliases: all,
            print_columns: Vec::new(),
            sensitivity: Sensitivity::NonSensitive,
        }
    }

    /// Adds explicit aliases (also to `all_aliases`).
    #[must_use]
    pub fn with_aliases(mut self, aliases: &[&str]) -> Self {
        for a in aliases {
            let a = a.to_string();
            if !self.aliases.contains(&a) {
                self.aliases.push(a.clone());
            }
            if !self.all_aliases.contains(&a) {
                self.all_aliases.push(a);
            }
        }
        self
    }

    /// Removes aliases (explicit or automatic), e.g. an automatic acronym that another
    /// owner's type has already: stated refuses a definition that takes another owner's name.
    #[must_use]
    pub fn without_aliases(mut self, aliases: &[&str]) -> Self {
        self.aliases.retain(|a| !aliases.contains(&a.as_str()));
        self.all_aliases.retain(|a| !aliases.contains(&a.as_str()));
        self
    }

    /// Every name this type answers to, lowercase: type, display type and aliases (what
    /// stated keeps from being taken by another owner's definition).
    pub fn names(&self) -> std::collections::BTreeSet<String> {
        std::iter::once(&self.resource_type)
            .chain(std::iter::once(&self.display_type))
            .chain(&self.aliases)
            .chain(&self.all_aliases)
            .map(|n| n.to_lowercase())
            .collect()
    }

    /// Adds print columns `(name, json_path)`.
    #[must_use]
    pub fn with_columns(mut self, columns: &[(&str, &str)]) -> Self {
        self.print_columns
            .extend(columns.iter().map(|(n, p)| PrintColumn {
                name: n.to_string(),
                json_path: p.to_string(),
            }));
        self
    }

    /// Marks the type sensitive.
    #[must_use]
    pub fn sensitive(mut self) -> Self {
        self.sensitivity = Sensitivity::Sensitive;
        self
    }

    /// The ID of this definition's resource: the lowercase type.
    pub fn id(&self) -> String {
        self.resource_type.to_lowercase()
    }

    /// Whether `name` (type, alias, any case) names this type.
    pub fn matches(&self, name: &str) -> bool {
        let n = name.to_lowercase();
        self.resource_type.to_lowercase() == n || self.all_aliases.contains(&n)
    }
}

/// `Addresses` → `Address`, `LinkStatuses` → `LinkStatus`, `Routes` → `Route`.
fn singular(plural: &str) -> String {
    for suffix in ["sses", "uses", "xes", "shes", "ches"] {
        if let Some(stem) = plural.strip_suffix(suffix) {
            return format!("{stem}{}", &suffix[..suffix.len() - 2]);
        }
    }
    if let Some(stem) = plural.strip_suffix("ies") {
        return format!("{stem}y");
    }
    plural.strip_suffix('s').unwrap_or(plural).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_aliases() {
        let rd = ResourceDefinition::new("AddressStatuses.net.talos.dev", "network");
        assert_eq!(rd.display_type, "AddressStatus");
        assert!(rd.matches("addressstatus"));
        assert!(rd.matches("addressstatuses"));
        assert!(rd.matches("AddressStatuses.net.talos.dev"));
        assert!(rd.matches("addressstatuses.net"));
        // Its acronym would name AddressSpecs too.
        assert!(!rd.matches("as"));
        assert!(!rd.matches("address"));
        let rd = ResourceDefinition::new("MountStatuses.block.talos.dev", "block");
        assert!(!rd.matches("ms"));
        let rd = ResourceDefinition::new("VIPElections.etcd.talos.dev", "etcd");
        assert!(rd.matches("vipe") && rd.matches("vipes"));
        assert_eq!(singular("Addresses"), "Address");
        assert_eq!(singular("Routes"), "Route");
        assert_eq!(singular("Identities"), "Identity");
        assert_eq!(
            ResourceDefinition::new("AddressStatuses.net.talos.dev", "network").id(),
            "addressstatuses.net.talos.dev"
        );
    }
}
