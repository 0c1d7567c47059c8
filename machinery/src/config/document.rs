//! The multi-document machine configuration: the kind-less `v1alpha1` document plus typed
//! documents (`apiVersion: v1alpha1`, `kind: X`, optional `name`).

use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use super::error::{ConfigError, ConfigErrors};
use super::strict::{self, describe, scalar_text};
use super::v1alpha1::{self, ClusterConfig, MachineConfig, MachineType, V1Alpha1};

/// Keys whose presence in a kind-less document marks it as the v1alpha1 document.
const V1ALPHA1_KEYS: [&str; 5] = ["version", "machine", "cluster", "debug", "persist"];

/// Identity of a document in a configuration: duplicates are rejected and patches are merged by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DocumentId {
    /// The kind-less v1alpha1 document.
    V1Alpha1,
    /// A typed document.
    Typed {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
        /// `name`, empty for unnamed kinds.
        name: String,
    },
}

impl fmt::Display for DocumentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V1Alpha1 => f.write_str(v1alpha1::VERSION),
            Self::Typed {
                api_version,
                kind,
                name,
            } if name.is_empty() => write!(f, "{api_version}/{kind}"),
            Self::Typed {
                api_version,
                kind,
                name,
            } => write!(f, "{api_version}/{kind}/{name}"),
        }
    }
}

/// Path used for problems about the whole `index`-th YAML document.
pub(crate) fn document_path(index: usize) -> String {
    format!("document[{index}]")
}

/// Splits a YAML stream into its documents, skipping empty (null) ones, and resolves `<<` merge
/// keys. Returns each document with its 0-based position in the stream.
pub(crate) fn split_documents(text: &str) -> Result<Vec<(usize, Value)>, ConfigErrors> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let mut value = Value::deserialize(doc).map_err(|e| {
            ConfigErrors::single(document_path(index), format!("decode error: {e}"))
        })?;
        if value.is_null() {
            continue;
        }
        value.apply_merge().map_err(|e| {
            ConfigErrors::single(document_path(index), format!("decode error: {e}"))
        })?;
        out.push((index, value));
    }
    Ok(out)
}

fn string_field(map: &Mapping, key: &str) -> Option<String> {
    map.get(key).and_then(scalar_text)
}

/// Works out which document a mapping is, from its `apiVersion`, `kind`, `name` and v1alpha1 keys.
pub(crate) fn identify(index: usize, value: &Value) -> Result<DocumentId, ConfigError> {
    let path = document_path(index);
    let Value::Mapping(map) = value else {
        return Err(ConfigError::new(
            path,
            format!(
                "expected a YAML mapping as a configuration document, found {}",
                describe(value)
            ),
        ));
    };
    let kind = string_field(map, "kind").filter(|k| !k.is_empty());
    let api_version = string_field(map, "apiVersion").filter(|v| !v.is_empty());
    match (kind, api_version) {
        (Some(kind), Some(api_version)) => Ok(DocumentId::Typed {
            api_version,
            kind,
            name: string_field(map, "name").unwrap_or_default(),
        }),
        (Some(kind), None) => Err(ConfigError::new(
            path,
            format!("missing apiVersion in document of kind {kind:?}"),
        )),
        (None, Some(_)) => Err(ConfigError::new(path, "missing kind")),
        (None, None) => {
            if !V1ALPHA1_KEYS.iter().any(|k| map.contains_key(*k)) {
                return Err(ConfigError::new(
                    path,
                    "missing kind (a document is either the v1alpha1 document or has apiVersion and kind)",
                ));
            }
            match map.get("version") {
                None => Ok(DocumentId::V1Alpha1),
                Some(v) if scalar_text(v).as_deref() == Some(v1alpha1::VERSION) => {
                    Ok(DocumentId::V1Alpha1)
                }
                Some(v) => Err(ConfigError::new(
                    "version",
                    format!(
                        "unsupported config version {}, expected {:?}",
                        describe(v),
                        v1alpha1::VERSION
                    ),
                )),
            }
        }
    }
}

/// A typed document the crate does not model, kept as raw YAML so that it round-trips.
#[derive(Debug, Clone, PartialEq)]
pub struct RawDocument {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `name`, if the kind is named.
    pub name: Option<String>,
    /// The whole document, including `apiVersion`, `kind` and `name`.
    pub value: Mapping,
}

impl RawDocument {
    /// The identity of this document.
    pub fn id(&self) -> DocumentId {
        DocumentId::Typed {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone().unwrap_or_default(),
        }
    }
}

/// A decoded machine configuration: the v1alpha1 document and any typed documents.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// The v1alpha1 document, if present.
    pub v1alpha1: Option<V1Alpha1>,
    /// Typed documents, in input order.
    pub documents: Vec<RawDocument>,
}

impl Config {
    /// Decodes a (multi-document) YAML machine configuration strictly.
    ///
    /// Every problem is reported, each with its path: unknown fields anywhere in the v1alpha1
    /// document, values of the wrong type, documents without `kind`/`apiVersion`, duplicate
    /// documents, a `version` other than `v1alpha1`.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigErrors> {
        Self::from_documents(split_documents(text)?)
    }

    /// Decodes already split documents (position in the stream, value).
    pub(crate) fn from_documents(docs: Vec<(usize, Value)>) -> Result<Self, ConfigErrors> {
        let mut errors = Vec::new();
        let mut seen = HashSet::new();
        let mut config = Self::default();
        for (index, value) in docs {
            let id = match identify(index, &value) {
                Ok(id) => id,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if !seen.insert(id.clone()) {
                errors.push(ConfigError::new(
                    document_path(index),
                    format!("duplicate document {id} is not allowed"),
                ));
                continue;
            }
            match id {
                DocumentId::V1Alpha1 => match strict::decode::<V1Alpha1>(&value, "") {
                    Ok(doc) => config.v1alpha1 = Some(doc),
                    Err(errs) => errors.extend(errs),
                },
                DocumentId::Typed {
                    api_version,
                    kind,
                    name,
                } => {
                    if let Value::Mapping(map) = value {
                        config.documents.push(RawDocument {
                            api_version,
                            kind,
                            name: (!name.is_empty()).then_some(name),
                            value: map,
                        });
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors::new(errors))
        }
    }

    /// Encodes the configuration as a multi-document YAML stream, the v1alpha1 document first.
    pub fn to_yaml(&self) -> Result<String, serde_yaml_ng::Error> {
        let mut parts = Vec::new();
        if let Some(doc) = &self.v1alpha1 {
            if *doc == V1Alpha1::default() {
                // Nothing set (`machine: ~`) would encode as `{}`, which is no v1alpha1
                // document: name its version, so that the text decodes to one again.
                let named = V1Alpha1 {
                    version: Some(v1alpha1::VERSION.to_string()),
                    ..V1Alpha1::default()
                };
                parts.push(serde_yaml_ng::to_string(&named)?);
            } else {
                parts.push(serde_yaml_ng::to_string(doc)?);
            }
        }
        for doc in &self.documents {
            parts.push(serde_yaml_ng::to_string(&doc.value)?);
        }
        Ok(parts.join("---\n"))
    }

    /// The `machine` section.
    pub fn machine(&self) -> Option<&MachineConfig> {
        self.v1alpha1.as_ref().and_then(|d| d.machine.as_ref())
    }

    /// The `cluster` section.
    pub fn cluster(&self) -> Option<&ClusterConfig> {
        self.v1alpha1.as_ref().and_then(|d| d.cluster.as_ref())
    }

    /// The machine type, if set to a known value.
    pub fn machine_type(&self) -> Option<MachineType> {
        self.v1alpha1.as_ref().and_then(V1Alpha1::machine_type)
    }

    /// The typed document with this `apiVersion`, `kind` and (optional) `name`.
    pub fn document(
        &self,
        api_version: &str,
        kind: &str,
        name: Option<&str>,
    ) -> Option<&RawDocument> {
        self.documents
            .iter()
            .find(|d| d.api_version == api_version && d.kind == kind && d.name.as_deref() == name)
    }

    /// All typed documents of a kind.
    pub fn documents_of_kind<'a>(
        &'a self,
        kind: &'a str,
    ) -> impl Iterator<Item = &'a RawDocument> + 'a {
        self.documents.iter().filter(move |d| d.kind == kind)
    }
}
