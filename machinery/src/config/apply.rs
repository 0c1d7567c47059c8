//! What applying a new machine configuration needs beside validation: keeping the secrets a
//! client could not see, and the diff it is shown.
//!
//! A client that reads the configuration through apid reads it redacted (apid never holds the
//! full one), so what it sends back after a patch or an edit carries [`REDACTED`] where the
//! secrets were. [`restore_redacted`] puts the current values back there: a redacted value
//! means "keep the one the node has". Documents are matched by identity (the v1alpha1 document,
//! or apiVersion + kind + name), values by their path in the document (list items by index).

use serde_yaml_ng::Value;

use super::document::{identify, split_documents, DocumentId};
use super::{Config, ConfigErrors, REDACTED};

/// A redacted value that cannot be restored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    /// The new configuration does not decode (the validation that follows says why in full).
    #[error("the new configuration does not decode: {0}")]
    Decode(String),
    /// A value reads `******` where the node has no value to keep.
    #[error(
        "{path} is \"{REDACTED}\" (a redacted secret) but the node's configuration has no value there: \
         give the value itself"
    )]
    NoValue {
        /// The document and path, e.g. `v1alpha1: machine.token`.
        path: String,
    },
}

/// `new` with every value that reads [`REDACTED`] replaced by the value at the same place of
/// `current`; `None` when `new` holds no redacted value (it is then used as it is, comments and
/// layout included). The result is encoded again from the decoded documents.
pub fn restore_redacted(new: &str, current: Option<&str>) -> Result<Option<String>, RestoreError> {
    if !new.contains(REDACTED) {
        return Ok(None);
    }
    let decode = |e: ConfigErrors| RestoreError::Decode(e.to_string());
    let mut docs = split_documents(new).map_err(decode)?;
    let old = match current {
        Some(text) => split_documents(text).map_err(decode)?,
        None => Vec::new(),
    };
    let old: Vec<(Option<DocumentId>, &Value)> =
        old.iter().map(|(i, v)| (identify(*i, v).ok(), v)).collect();
    let mut found = false;
    for (index, doc) in &mut docs {
        let id = identify(*index, doc).ok();
        let same = old
            .iter()
            .find(|(o, _)| o.is_some() && *o == id)
            .map(|(_, v)| *v);
        let label = id
            .as_ref()
            .map_or_else(|| format!("document {index}"), label);
        restore(doc, same, &mut Vec::new(), &label, &mut found)?;
    }
    if !found {
        return Ok(None);
    }
    let mut parts = Vec::new();
    for (_, doc) in &docs {
        parts.push(serde_yaml_ng::to_string(doc).map_err(|e| RestoreError::Decode(e.to_string()))?);
    }
    Ok(Some(parts.join("---\n")))
}

fn label(id: &DocumentId) -> String {
    match id {
        DocumentId::V1Alpha1 => "v1alpha1".into(),
        DocumentId::Typed { kind, name, .. } if name.is_empty() => kind.clone(),
        DocumentId::Typed { kind, name, .. } => format!("{kind} {name}"),
    }
}

fn restore(
    new: &mut Value,
    old: Option<&Value>,
    path: &mut Vec<String>,
    doc: &str,
    found: &mut bool,
) -> Result<(), RestoreError> {
    match new {
        Value::String(s) if s == REDACTED => {
            *found = true;
            match old {
                Some(v) if !v.is_null() && v.as_str() != Some(REDACTED) => {
                    *new = v.clone();
                    Ok(())
                }
                _ => Err(RestoreError::NoValue {
                    path: format!("{doc}: {}", path.join(".")),
                }),
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = match k {
                    Value::String(s) => s.clone(),
                    other => serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                let sub = old.and_then(|o| o.get(k));
                path.push(key);
                restore(v, sub, path, doc, found)?;
                path.pop();
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                let sub = old.and_then(|o| o.get(i));
                path.push(format!("[{i}]"));
                restore(v, sub, path, doc, found)?;
                path.pop();
            }
            Ok(())
        }
        Value::Tagged(t) => restore(&mut t.value, old, path, doc, found),
        _ => Ok(()),
    }
}

/// A configuration as the diff compares it: every document decoded and encoded again, so that
/// only changes of content show (not of indentation, quoting or comments), as upstream compares
/// encoded configurations. Text that does not decode is compared as it is.
pub fn normalize(text: &str) -> String {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        match serde::Deserialize::deserialize(doc) {
            Ok(Value::Null) => {}
            Ok(v) => match serde_yaml_ng::to_string::<Value>(&v) {
                Ok(s) => docs.push(s),
                Err(_) => return text.to_string(),
            },
            Err(_) => return text.to_string(),
        }
    }
    docs.join("---\n")
}

/// The diff shown for a change from `old` (none: the node had no configuration) to `new`, both
/// redacted first so that no secret is in it: upstream's "Config diff:" text with a unified
/// diff, "No changes." when the content is the same, and a line saying so when only secrets
/// changed.
pub fn redacted_diff(old: Option<&Config>, new: &Config) -> String {
    let text = |c: &Config| c.redacted().to_yaml().unwrap_or_default();
    let full = |c: &Config| c.to_yaml().unwrap_or_default();
    let (old_red, new_red) = (old.map(text).unwrap_or_default(), text(new));
    let diff = similar::TextDiff::from_lines(normalize(&old_red).as_str(), &normalize(&new_red))
        .unified_diff()
        .context_radius(3)
        .header("current", "new")
        .to_string();
    if !diff.is_empty() {
        return format!("Config diff:\n\n{diff}");
    }
    if old.map(full) != Some(full(new)) {
        return "Config diff:\n\nOnly secrets changed (their values are not shown).".into();
    }
    "Config diff:\n\nNo changes.".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURRENT: &str = "version: v1alpha1\nmachine:\n  type: worker\n  token: abc.def\n  \
                           ca:\n    crt: CRT\n---\napiVersion: v1alpha1\nkind: WireguardConfig\n\
                           name: wg0\nprivateKey: KEY\n";

    #[test]
    fn a_redacted_value_keeps_the_nodes_own() {
        let new = "version: v1alpha1\nmachine:\n  type: controlplane\n  token: '******'\n  \
                   ca:\n    crt: CRT\n---\napiVersion: v1alpha1\nkind: WireguardConfig\n\
                   name: wg0\nprivateKey: '******'\n";
        let out = restore_redacted(new, Some(CURRENT)).unwrap().unwrap();
        assert!(out.contains("token: abc.def"), "{out}");
        assert!(out.contains("privateKey: KEY"), "{out}");
        assert!(out.contains("type: controlplane"), "{out}");
        assert!(!out.contains(REDACTED), "{out}");
    }

    #[test]
    fn text_without_a_redacted_value_is_used_as_it_is() {
        assert_eq!(
            restore_redacted("# c\nmachine: {}\n", Some(CURRENT)),
            Ok(None)
        );
    }

    #[test]
    fn a_redacted_value_with_nothing_to_keep_is_refused_with_its_path() {
        let new = "version: v1alpha1\nmachine:\n  token: abc\n  ca:\n    key: '******'\n";
        let e = restore_redacted(new, Some(CURRENT)).unwrap_err();
        assert_eq!(
            e,
            RestoreError::NoValue {
                path: "v1alpha1: machine.ca.key".into()
            }
        );
        assert!(restore_redacted(new, None).is_err());
        // Another document's value is never taken.
        let other =
            "apiVersion: v1alpha1\nkind: WireguardConfig\nname: wg1\nprivateKey: '******'\n";
        assert!(restore_redacted(other, Some(CURRENT)).is_err());
    }
}
