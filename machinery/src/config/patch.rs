//! Machine configuration patches, as `talosctl machineconfig patch` applies them.
//!
//! Two formats:
//! - **JSON patch** (RFC 6902): a JSON array of operations, or the same as a YAML list. It applies
//!   to the raw configuration, which must consist of exactly one document.
//! - **Strategic merge patch**: a (multi-document) configuration fragment. Each patch document is
//!   merged into the configuration document with the same identity (v1alpha1, or
//!   `apiVersion`/`kind`/`name`), or appended if there is none. Merging follows upstream
//!   `config/merge`: mappings merge key by key; lists are appended to, except
//!   `cluster.network.podSubnets`/`serviceSubnets` and `cluster.apiServer.auditPolicy`, which are
//!   replaced, and `machine.network.interfaces` (merged by `interface` or `deviceSelector`), their
//!   `vlans` (by `vlanId`) and `cluster.apiServer.admissionControl` (by `name`), whose matching
//!   items are merged; in typed documents lists are appended to, except an
//!   `ExtensionServiceConfig`'s `configFiles` (merged by `mountPath`); a scalar replaces the old
//!   value unless it is null or a zero value (`""`, `0`); booleans always replace.
//!
//!   `$patch: delete` deletes: as the only content of a key's value (`hostname: {$patch: delete}`)
//!   the key; in a list item (`- {interface: eth0, $patch: delete}`) the item whose first other
//!   field matches; at the top of a typed document the whole document. Deletions of a patch
//!   document are applied before its content is merged; a deletion in a document the
//!   configuration does not have is a no-op, as upstream.
//!
//! Patches are decoded strictly (unknown fields are errors); the result is not validated: the
//! caller re-decodes and validates it.

use serde_yaml_ng::{Mapping, Value};

use super::document::{document_path, identify, split_documents, Config, DocumentId};
use super::error::{join_index, join_key, ConfigError, ConfigErrors};
use super::strict::{self, scalar_text};
use super::v1alpha1::DeviceSelector;

/// A problem parsing or applying a patch.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The text looked like a strategic merge patch but does not decode.
    #[error("invalid strategic merge patch:\n{0}")]
    InvalidStrategicMerge(ConfigErrors),
    /// The text looked like a JSON patch but is not a valid one.
    #[error("invalid JSON patch: {0}")]
    InvalidJsonPatch(String),
    /// The configuration to patch does not decode.
    #[error("invalid machine configuration:\n{0}")]
    InvalidConfig(ConfigErrors),
    /// JSON patches apply to single-document configurations only.
    #[error("JSON6902 patches are not supported for multi-document machine configuration (found {0} documents)")]
    JsonPatchDocumentCount(usize),
    /// A JSON patch operation failed.
    #[error("failure applying rfc6902 patches to talos machine config: {0}")]
    JsonPatchApply(#[from] json_patch::PatchError),
    /// The configuration could not be converted to or from JSON.
    #[error("failure converting talos machine config {0}")]
    Conversion(String),
    /// A `$patch: delete` names something that does not exist.
    #[error("patch delete: path '{path}' in document '{document}': lookup failed")]
    DeleteLookupFailed {
        /// The document (`v1alpha1` or `apiVersion/kind[/name]`).
        document: String,
        /// The path that was not found.
        path: String,
    },
    /// Two values of different shapes (e.g. a list and a mapping) meet in a merge.
    #[error("merge type mismatch in document '{document}' at '{path}': cannot merge {right} into {left}")]
    MergeTypeMismatch {
        /// The document (`v1alpha1` or `apiVersion/kind[/name]`).
        document: String,
        /// Where the values met.
        path: String,
        /// Shape of the configuration value.
        left: &'static str,
        /// Shape of the patch value.
        right: &'static str,
    },
    /// The patched configuration could not be encoded as YAML.
    #[error("failed to encode patched machine config: {0}")]
    Encode(#[from] serde_yaml_ng::Error),
}

/// A configuration patch: JSON (RFC 6902) or strategic merge.
#[derive(Debug, Clone, PartialEq)]
pub enum Patch {
    /// An RFC 6902 JSON patch.
    Json(json_patch::Patch),
    /// A strategic merge patch.
    StrategicMerge(StrategicMergePatch),
}

/// A parsed strategic merge patch: deletions and documents to merge, in patch order.
#[derive(Debug, Clone, PartialEq)]
pub struct StrategicMergePatch {
    ops: Vec<Op>,
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Delete(DeleteSelector),
    Merge { id: DocumentId, value: Value },
}

/// What a `$patch: delete` removes.
#[derive(Debug, Clone, PartialEq)]
struct DeleteSelector {
    doc: DocumentId,
    /// Keys down to the value; empty for the whole document.
    path: Vec<String>,
    /// For list items: the list is at `path`, remove the item whose `key` is `value`.
    item: Option<(String, String)>,
}

fn display_path(segments: &[String]) -> String {
    segments.iter().fold(String::new(), |acc, s| {
        match s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            Some(i) => match i.parse::<usize>() {
                Ok(i) => join_index(&acc, i),
                Err(_) => join_key(&acc, s),
            },
            None => join_key(&acc, s),
        }
    })
}

impl Patch {
    /// Parses a patch, trying (like upstream `LoadPatch`) a strategic merge patch first, then a
    /// JSON patch as JSON, then a JSON patch as a YAML list of operations.
    pub fn parse(text: &str) -> Result<Self, PatchError> {
        let strategic_err = match StrategicMergePatch::parse(text) {
            Ok(p) => return Ok(Self::StrategicMerge(p)),
            Err(e) => e,
        };
        let json_err = match serde_json::from_str::<json_patch::Patch>(text) {
            Ok(p) => return Ok(Self::Json(p)),
            Err(e) => e,
        };
        match serde_yaml_ng::from_str::<Value>(text) {
            Ok(Value::Sequence(ops)) => {
                let json = serde_json::to_value(Value::Sequence(ops))
                    .map_err(|e| PatchError::InvalidJsonPatch(e.to_string()))?;
                serde_json::from_value::<json_patch::Patch>(json)
                    .map(Self::Json)
                    .map_err(|e| PatchError::InvalidJsonPatch(e.to_string()))
            }
            _ if text.trim_start().starts_with('[') => {
                Err(PatchError::InvalidJsonPatch(json_err.to_string()))
            }
            _ => Err(PatchError::InvalidStrategicMerge(strategic_err)),
        }
    }

    /// True for a JSON patch.
    pub fn is_json(&self) -> bool {
        matches!(self, Self::Json(_))
    }
}

impl StrategicMergePatch {
    /// Parses a strategic merge patch: a strictly decoded (multi-document) configuration fragment
    /// that may contain `$patch: delete` directives.
    pub fn parse(text: &str) -> Result<Self, ConfigErrors> {
        let docs = split_documents(text)?;
        let mut errors = Vec::new();
        let mut ops = Vec::new();
        let mut remaining = Vec::new();
        for (index, mut value) in docs {
            let id = match identify(index, &value) {
                Ok(id) => id,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let mut found = Vec::new();
            if value.as_mapping().is_some_and(is_delete_directive) {
                if id == DocumentId::V1Alpha1 {
                    errors.push(ConfigError::new(
                        document_path(index),
                        "can't delete the root of the v1alpha1 document",
                    ));
                } else {
                    ops.push(Op::Delete(DeleteSelector {
                        doc: id,
                        path: Vec::new(),
                        item: None,
                    }));
                }
                continue;
            }
            // A document emptied by its deletions is dropped below (only identity keys remain).
            extract_deletes(&mut value, &mut Vec::new(), false, &mut found, &mut errors);
            let had_deletes = !found.is_empty();
            ops.extend(found.into_iter().map(|(path, item)| {
                Op::Delete(DeleteSelector {
                    doc: id.clone(),
                    path,
                    item,
                })
            }));
            if had_deletes && only_identity_keys(&value) {
                continue;
            }
            remaining.push((index, value.clone()));
            ops.push(Op::Merge { id, value });
        }
        if let Err(e) = Config::from_documents(remaining) {
            errors.extend(e);
        }
        if errors.is_empty() {
            Ok(Self { ops })
        } else {
            Err(ConfigErrors::new(errors))
        }
    }
}

fn only_identity_keys(value: &Value) -> bool {
    match value {
        Value::Mapping(m) => m
            .keys()
            .all(|k| matches!(k.as_str(), Some("version" | "apiVersion" | "kind" | "name"))),
        _ => false,
    }
}

fn is_delete_directive(map: &Mapping) -> bool {
    map.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// A `$patch: delete` found in a patch document: the path of the deleted value (or of the list),
/// and for list items the `key: value` that identifies the item.
type FoundDelete = (Vec<String>, Option<(String, String)>);

/// Finds and removes `$patch: delete` directives below `value`, recording what they delete.
/// Returns true if `value` itself is to be deleted by its parent.
fn extract_deletes(
    value: &mut Value,
    path: &mut Vec<String>,
    list_item: bool,
    found: &mut Vec<FoundDelete>,
    errors: &mut Vec<ConfigError>,
) -> bool {
    match value {
        Value::Mapping(map) => {
            if is_delete_directive(map) {
                if list_item {
                    let list_path = path[..path.len().saturating_sub(1)].to_vec();
                    let matcher = map.iter().find_map(|(k, v)| {
                        let key = k.as_str()?;
                        (key != "$patch")
                            .then(|| scalar_text(v).map(|v| (key.to_owned(), v)))
                            .flatten()
                    });
                    match matcher {
                        Some(item) => found.push((list_path, Some(item))),
                        None => errors.push(ConfigError::new(
                            display_path(path),
                            "$patch: delete in a list item needs a key: value to match the item",
                        )),
                    }
                } else if path.iter().any(|s| s.starts_with('[')) {
                    errors.push(ConfigError::new(
                        display_path(path),
                        "cannot delete an inner key of a list item",
                    ));
                } else {
                    found.push((path.clone(), None));
                }
                return true;
            }
            let mut removed = false;
            let keys: Vec<Value> = map.keys().cloned().collect();
            for key in keys {
                let segment = scalar_text(&key).unwrap_or_default();
                path.push(segment);
                let delete = map
                    .get_mut(&key)
                    .is_some_and(|child| extract_deletes(child, path, false, found, errors));
                path.pop();
                if delete {
                    map.shift_remove(&key);
                    removed = true;
                }
            }
            removed && map.is_empty()
        }
        Value::Sequence(items) => {
            let mut removed = false;
            let mut i = 0;
            let mut original = 0;
            while i < items.len() {
                path.push(format!("[{original}]"));
                let delete = extract_deletes(&mut items[i], path, true, found, errors);
                path.pop();
                original += 1;
                if delete {
                    items.remove(i);
                    removed = true;
                } else {
                    i += 1;
                }
            }
            removed && items.is_empty()
        }
        _ => false,
    }
}

/// A document of the configuration being patched.
struct Doc {
    id: DocumentId,
    value: Value,
}

/// Applies patches in order to a (multi-document) YAML configuration and returns the patched YAML.
///
/// The input is decoded strictly before each strategic merge patch; JSON patches apply to the raw
/// text and require a single-document configuration. The result is not validated.
pub fn apply_patches(config_text: &str, patches: &[Patch]) -> Result<String, PatchError> {
    let mut docs: Vec<(usize, Value)> =
        split_documents(config_text).map_err(PatchError::InvalidConfig)?;
    for patch in patches {
        match patch {
            Patch::Json(p) => {
                if docs.len() != 1 {
                    return Err(PatchError::JsonPatchDocumentCount(docs.len()));
                }
                let (index, value) = docs.remove(0);
                let mut json = serde_json::to_value(&value)
                    .map_err(|e| PatchError::Conversion(format!("to json: {e}")))?;
                json_patch::patch(&mut json, &p.0)?;
                let value = serde_yaml_ng::to_value(&json)
                    .map_err(|e| PatchError::Conversion(format!("from json to yaml: {e}")))?;
                docs.push((index, value));
            }
            Patch::StrategicMerge(p) => {
                Config::from_documents(docs.clone()).map_err(PatchError::InvalidConfig)?;
                let mut current = Vec::with_capacity(docs.len());
                for (index, value) in docs {
                    let id = identify(index, &value)
                        .map_err(|e| PatchError::InvalidConfig(ConfigErrors::new(vec![e])))?;
                    current.push(Doc { id, value });
                }
                apply_strategic(&mut current, p)?;
                docs = current
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| (i, d.value))
                    .collect();
            }
        }
    }
    let mut parts = Vec::with_capacity(docs.len());
    for (_, value) in &docs {
        parts.push(serde_yaml_ng::to_string(value)?);
    }
    Ok(parts.join("---\n"))
}

fn apply_strategic(docs: &mut Vec<Doc>, patch: &StrategicMergePatch) -> Result<(), PatchError> {
    for op in &patch.ops {
        match op {
            Op::Delete(selector) => apply_delete(docs, selector)?,
            Op::Merge { id, value } => match docs.iter_mut().find(|d| d.id == *id) {
                Some(doc) => {
                    let mut merger = Merger {
                        doc: id,
                        path: Vec::new(),
                    };
                    merger.merge(&mut doc.value, value)?;
                }
                None if *id == DocumentId::V1Alpha1 => docs.insert(
                    0,
                    Doc {
                        id: id.clone(),
                        value: value.clone(),
                    },
                ),
                None => docs.push(Doc {
                    id: id.clone(),
                    value: value.clone(),
                }),
            },
        }
    }
    Ok(())
}

fn apply_delete(docs: &mut Vec<Doc>, selector: &DeleteSelector) -> Result<(), PatchError> {
    // Upstream applies a delete selector only to a document that is there: deleting (in) a
    // document the configuration does not have changes nothing.
    let Some(position) = docs.iter().position(|d| d.id == selector.doc) else {
        return Ok(());
    };
    if selector.path.is_empty() {
        docs.remove(position);
        return Ok(());
    }
    let lookup_failed = || PatchError::DeleteLookupFailed {
        document: selector.doc.to_string(),
        path: display_path(&selector.path),
    };
    let doc = &mut docs[position].value;
    let (parents, last) = match &selector.item {
        Some(_) => (selector.path.as_slice(), None),
        None => match selector.path.split_last() {
            Some((last, parents)) => (parents, Some(last)),
            None => return Err(lookup_failed()),
        },
    };
    let mut node = doc;
    for key in parents {
        node = match node {
            Value::Mapping(m) => m.get_mut(key.as_str()).ok_or_else(lookup_failed)?,
            _ => return Err(lookup_failed()),
        };
    }
    match (&selector.item, last) {
        (None, Some(last)) => match node {
            // Deleting a key that is already absent is a no-op (upstream zeroes the field).
            Value::Mapping(m) => {
                m.shift_remove(last.as_str());
                Ok(())
            }
            _ => Err(lookup_failed()),
        },
        (Some((key, value)), _) => {
            let Value::Sequence(items) = node else {
                return Err(lookup_failed());
            };
            let found = items.iter().position(|item| {
                item.as_mapping()
                    .and_then(|m| m.get(key.as_str()))
                    .and_then(scalar_text)
                    .as_deref()
                    == Some(value.as_str())
            });
            match found {
                Some(i) => {
                    items.remove(i);
                    Ok(())
                }
                None => Err(lookup_failed()),
            }
        }
        (None, None) => Err(lookup_failed()),
    }
}

/// How a list (or free-form value) at a given path of a document merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListRule {
    Append,
    Replace,
    Devices,
    Vlans,
    ByName,
    /// Items are merged by `mountPath`; an item without one matches another without one, as
    /// upstream compares the (empty) Go field values.
    ByMountPath,
}

fn rule_for(path: &[String]) -> ListRule {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["machine", "network", "interfaces"] => ListRule::Devices,
        ["machine", "network", "interfaces", "[]", "vlans"] => ListRule::Vlans,
        ["cluster", "apiServer", "admissionControl"] => ListRule::ByName,
        ["cluster", "network", "podSubnets" | "serviceSubnets"]
        | ["cluster", "apiServer", "auditPolicy"] => ListRule::Replace,
        _ => ListRule::Append,
    }
}

/// The list rules of typed documents: upstream's `merge` package appends lists unless the
/// document type has its own `Merge` (or a `merge:"replace"` tag). Of the kinds checked against
/// upstream (`ExtensionServiceConfig` and the network kinds networkd reads), only this one does.
fn typed_rule_for(api_version: &str, kind: &str, path: &[String]) -> ListRule {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match (api_version, kind, p.as_slice()) {
        ("v1alpha1", "ExtensionServiceConfig", ["configFiles"]) => ListRule::ByMountPath,
        _ => ListRule::Append,
    }
}

/// Identity of a list item for keyed merges.
#[derive(Debug, PartialEq)]
enum ItemKey {
    Name(String),
    Selector(DeviceSelector),
    Id(u64),
}

fn item_key(rule: ListRule, item: &Value) -> Option<ItemKey> {
    let map = item.as_mapping()?;
    match rule {
        ListRule::Devices => {
            if let Some(name) = map
                .get("interface")
                .and_then(scalar_text)
                .filter(|n| !n.is_empty())
            {
                return Some(ItemKey::Name(name));
            }
            let selector = map.get("deviceSelector")?;
            strict::decode::<DeviceSelector>(selector, "")
                .ok()
                .map(ItemKey::Selector)
        }
        ListRule::Vlans => map.get("vlanId").and_then(Value::as_u64).map(ItemKey::Id),
        ListRule::ByName => map.get("name").and_then(scalar_text).map(ItemKey::Name),
        ListRule::ByMountPath => match map.get("mountPath") {
            None | Some(Value::Null) => Some(ItemKey::Name(String::new())),
            Some(v) => scalar_text(v).map(ItemKey::Name),
        },
        ListRule::Append | ListRule::Replace => None,
    }
}

fn shape(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn is_zero_scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

struct Merger<'a> {
    doc: &'a DocumentId,
    path: Vec<String>,
}

impl Merger<'_> {
    fn rule(&self) -> ListRule {
        match self.doc {
            DocumentId::V1Alpha1 => rule_for(&self.path),
            DocumentId::Typed {
                api_version, kind, ..
            } => typed_rule_for(api_version, kind, &self.path),
        }
    }

    fn mismatch(&self, left: &Value, right: &Value) -> PatchError {
        let shown: Vec<String> = self
            .path
            .iter()
            .map(|s| {
                if s == "[]" {
                    "[*]".to_owned()
                } else {
                    s.clone()
                }
            })
            .collect();
        PatchError::MergeTypeMismatch {
            document: self.doc.to_string(),
            path: display_path(&shown),
            left: shape(left),
            right: shape(right),
        }
    }

    fn merge(&mut self, left: &mut Value, right: &Value) -> Result<(), PatchError> {
        if right.is_null() {
            return Ok(());
        }
        let rule = self.rule();
        match (&mut *left, right) {
            (Value::Null, _) => *left = right.clone(),
            (Value::Mapping(_), Value::Mapping(r)) if rule == ListRule::Replace => {
                if !r.is_empty() {
                    *left = right.clone();
                }
            }
            (Value::Mapping(l), Value::Mapping(r)) => {
                for (key, rv) in r {
                    self.path.push(scalar_text(key).unwrap_or_default());
                    let result = match l.get_mut(key) {
                        Some(lv) => self.merge(lv, rv),
                        None => {
                            if !rv.is_null() {
                                l.insert(key.clone(), rv.clone());
                            }
                            Ok(())
                        }
                    };
                    self.path.pop();
                    result?;
                }
            }
            (Value::Sequence(l), Value::Sequence(r)) => match rule {
                ListRule::Replace => {
                    if !r.is_empty() {
                        *l = r.clone();
                    }
                }
                ListRule::Append => l.extend(r.iter().cloned()),
                keyed => {
                    self.path.push("[]".to_owned());
                    for item in r {
                        let key = item_key(keyed, item);
                        let existing = key.as_ref().and_then(|k| {
                            l.iter()
                                .position(|li| item_key(keyed, li).as_ref() == Some(k))
                        });
                        match existing {
                            Some(i) => {
                                if let Err(e) = self.merge(&mut l[i], item) {
                                    self.path.pop();
                                    return Err(e);
                                }
                            }
                            None => l.push(item.clone()),
                        }
                    }
                    self.path.pop();
                }
            },
            (Value::Mapping(_) | Value::Sequence(_), _)
            | (_, Value::Mapping(_) | Value::Sequence(_)) => {
                return Err(self.mismatch(left, right));
            }
            (l, r) => {
                if !is_zero_scalar(r) {
                    *l = r.clone();
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(config: &str, patch: &str) -> Result<String, PatchError> {
        let patch = Patch::parse(patch)?;
        apply_patches(config, &[patch])
    }

    fn value(text: &str) -> Value {
        serde_yaml_ng::from_str(text).expect("yaml")
    }

    #[test]
    fn parse_detects_formats() {
        assert!(matches!(
            Patch::parse("machine:\n  network:\n    hostname: x\n"),
            Ok(Patch::StrategicMerge(_))
        ));
        assert!(matches!(
            Patch::parse(r#"[{"op": "add", "path": "/machine/network/hostname", "value": "x"}]"#),
            Ok(Patch::Json(_))
        ));
        assert!(matches!(
            Patch::parse("- op: remove\n  path: /machine/network\n"),
            Ok(Patch::Json(_))
        ));
        assert!(matches!(
            Patch::parse("- op: frobnicate\n  path: /x\n"),
            Err(PatchError::InvalidJsonPatch(_))
        ));
        assert!(matches!(
            Patch::parse("[{\"op\": \"add\""),
            Err(PatchError::InvalidJsonPatch(_))
        ));
        match Patch::parse("machine:\n  netwrk: {}\n") {
            Err(PatchError::InvalidStrategicMerge(e)) => {
                assert!(e.has_path("machine.netwrk"), "{e}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn scalars_merge_unless_zero() {
        let out = apply(
            "machine:\n  type: worker\n  token: abc\n  install:\n    wipe: true\n",
            "machine:\n  token: \"\"\n  install:\n    wipe: false\n    disk: /dev/sda\n",
        )
        .expect("patched");
        assert_eq!(
            value(&out),
            value("machine:\n  type: worker\n  token: abc\n  install:\n    wipe: false\n    disk: /dev/sda\n")
        );
    }

    #[test]
    fn lists_append_or_replace() {
        let out = apply(
            "machine:\n  certSANs: [a]\ncluster:\n  network:\n    podSubnets: [10.244.0.0/16]\n",
            "machine:\n  certSANs: [b]\ncluster:\n  network:\n    podSubnets: [10.32.0.0/12]\n",
        )
        .expect("patched");
        assert_eq!(
            value(&out),
            value("machine:\n  certSANs: [a, b]\ncluster:\n  network:\n    podSubnets: [10.32.0.0/12]\n")
        );
    }

    #[test]
    fn interfaces_merge_by_name_selector_and_vlan() {
        let base = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        addresses: [10.0.0.2/24]\n        vlans:\n          - vlanId: 10\n            mtu: 1500\n      - deviceSelector: {driver: virtio*}\n        dhcp: false\n";
        let patch = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 9000\n        vlans:\n          - vlanId: 10\n            dhcp: true\n          - vlanId: 20\n      - deviceSelector: {driver: virtio*}\n        dhcp: true\n      - interface: eth1\n        dhcp: true\n";
        let out = apply(base, patch).expect("patched");
        let expected = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        addresses: [10.0.0.2/24]\n        vlans:\n          - vlanId: 10\n            mtu: 1500\n            dhcp: true\n          - vlanId: 20\n        mtu: 9000\n      - deviceSelector: {driver: virtio*}\n        dhcp: true\n      - interface: eth1\n        dhcp: true\n";
        assert_eq!(value(&out), value(expected));
    }

    #[test]
    fn patch_delete() {
        let base = "machine:\n  network:\n    hostname: h\n    interfaces:\n      - interface: eth0\n        dhcp: true\n      - interface: eth1\n  nodeLabels:\n    a: b\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n";
        let patch = "machine:\n  network:\n    hostname:\n      $patch: delete\n    interfaces:\n      - interface: eth0\n        $patch: delete\n  nodeLabels:\n    a:\n      $patch: delete\n---\napiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n";
        let out = apply(base, patch).expect("patched");
        assert_eq!(
            value(&out),
            value("machine:\n  network:\n    interfaces:\n      - interface: eth1\n  nodeLabels: {}\n")
        );
    }

    #[test]
    fn config_files_merge_by_mount_path_even_when_absent() {
        // Upstream compares the Go field values, so two files without a mountPath match.
        let base = "machine: {}\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: x\nconfigFiles:\n  - content: a\n  - content: b\n    mountPath: /b\n";
        let patch = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: x\nconfigFiles:\n  - content: a2\n  - content: b2\n    mountPath: /b\n";
        let out = apply(base, patch).expect("patched");
        assert_eq!(
            value(out.split("---\n").nth(1).expect("second document")),
            value("apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: x\nconfigFiles:\n  - content: a2\n  - content: b2\n    mountPath: /b\n")
        );
    }

    #[test]
    fn patch_delete_missing_parent_fails() {
        let err = apply(
            "machine:\n  type: worker\n",
            "machine:\n  network:\n    hostname:\n      $patch: delete\n",
        )
        .expect_err("lookup fails");
        assert_eq!(
            err.to_string(),
            "patch delete: path 'machine.network.hostname' in document 'v1alpha1': lookup failed"
        );
    }

    #[test]
    fn patch_delete_errors_at_parse() {
        let err = Patch::parse("version: v1alpha1\n$patch: delete\n").expect_err("root delete");
        assert!(err.to_string().contains("root of the v1alpha1"), "{err}");
        let err = Patch::parse(
            "machine:\n  network:\n    interfaces:\n      - vlans:\n          $patch: delete\n",
        )
        .expect_err("inner delete");
        assert!(err.to_string().contains("inner key"), "{err}");
    }

    #[test]
    fn json_patch_requires_single_document() {
        let patch = Patch::parse(r#"[{"op": "add", "path": "/machine/token", "value": "x"}]"#)
            .expect("json");
        let err = apply_patches(
            "machine: {}\n---\napiVersion: v1alpha1\nkind: X\n",
            std::slice::from_ref(&patch),
        )
        .expect_err("multi");
        assert!(matches!(err, PatchError::JsonPatchDocumentCount(2)));
        let out = apply_patches("machine: {type: worker}\n", &[patch]).expect("single");
        assert_eq!(value(&out), value("machine: {type: worker, token: x}\n"));
    }

    #[test]
    fn type_mismatch_in_free_form_is_reported() {
        let err = apply(
            "machine:\n  kubelet:\n    extraConfig:\n      a: [1]\n",
            "machine:\n  kubelet:\n    extraConfig:\n      a: {b: 1}\n",
        )
        .expect_err("mismatch");
        assert!(
            err.to_string().contains("machine.kubelet.extraConfig.a"),
            "{err}"
        );
    }
}
