//! The resource model: metadata, opaque and typed resources, and the self-describing spec
//! encoding (CBOR) that lets any client render any resource without knowing its type.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::definition::ResourceDefinition;
use crate::error::{ErrorKind, StateError};

/// Lifecycle phase of a resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Normal operation.
    #[default]
    Running,
    /// Being torn down: waiting for finalizers to be removed.
    TearingDown,
}

impl Phase {
    /// The wire form: `running` or `tearingDown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::TearingDown => "tearingDown",
        }
    }

    /// Parses the wire form; the empty string means running (proto3 default).
    pub fn parse(s: &str) -> Result<Self, StateError> {
        match s {
            "running" | "" => Ok(Phase::Running),
            "tearingDown" => Ok(Phase::TearingDown),
            other => Err(StateError::new(
                ErrorKind::InvalidArgument,
                format!("unknown phase {other:?}"),
            )),
        }
    }
}

/// Where a resource lives: namespace, type and ID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pointer {
    /// Namespace.
    pub namespace: String,
    /// Type, e.g. `AddressSpecs.net.talos.dev`.
    pub r#type: String,
    /// ID within namespace and type.
    pub id: String,
}

impl std::fmt::Display for Pointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.r#type, self.id)
    }
}

/// Metadata of a resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Namespace.
    pub namespace: String,
    /// Type.
    pub r#type: String,
    /// ID.
    pub id: String,
    /// Version assigned by stated; 0 when not yet stored.
    pub version: u64,
    /// Owner (controller name), or empty.
    pub owner: String,
    /// Phase.
    pub phase: Phase,
    /// Creation time, set by stated.
    pub created: Option<SystemTime>,
    /// Last update time, set by stated.
    pub updated: Option<SystemTime>,
    /// Finalizers (a set).
    pub finalizers: BTreeSet<String>,
    /// Labels (queryable).
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

impl Metadata {
    /// New metadata for a resource that is not stored yet.
    pub fn new(
        namespace: impl Into<String>,
        r#type: impl Into<String>,
        id: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            r#type: r#type.into(),
            id: id.into(),
            ..Self::default()
        }
    }

    /// The address of the resource.
    pub fn pointer(&self) -> Pointer {
        Pointer {
            namespace: self.namespace.clone(),
            r#type: self.r#type.clone(),
            id: self.id.clone(),
        }
    }

    /// Equal for the purpose of suppressing no-op writes: everything but timestamps and version.
    pub fn same_content(&self, other: &Metadata) -> bool {
        self.namespace == other.namespace
            && self.r#type == other.r#type
            && self.id == other.id
            && self.owner == other.owner
            && self.phase == other.phase
            && self.finalizers == other.finalizers
            && self.labels == other.labels
            && self.annotations == other.annotations
    }

    /// Converts to the wire form.
    pub fn to_proto(&self) -> proto::Metadata {
        proto::Metadata {
            namespace: self.namespace.clone(),
            r#type: self.r#type.clone(),
            id: self.id.clone(),
            version: version_to_wire(self.version),
            owner: self.owner.clone(),
            phase: self.phase.as_str().to_string(),
            created: self.created.map(to_timestamp),
            updated: self.updated.map(to_timestamp),
            finalizers: self.finalizers.iter().cloned().collect(),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            annotations: self
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// Converts from the wire form.
    pub fn from_proto(m: proto::Metadata) -> Result<Self, StateError> {
        Ok(Self {
            version: version_from_wire(&m.version)?,
            phase: Phase::parse(&m.phase)?,
            created: m.created.map(from_timestamp),
            updated: m.updated.map(from_timestamp),
            finalizers: m.finalizers.into_iter().collect(),
            labels: m.labels.into_iter().collect(),
            annotations: m.annotations.into_iter().collect(),
            namespace: m.namespace,
            r#type: m.r#type,
            id: m.id,
            owner: m.owner,
        })
    }
}

/// The wire form of a version: decimal, `undefined` when unset.
pub fn version_to_wire(v: u64) -> String {
    if v == 0 {
        "undefined".to_string()
    } else {
        v.to_string()
    }
}

/// Parses the wire form of a version.
pub fn version_from_wire(s: &str) -> Result<u64, StateError> {
    match s {
        "" | "undefined" => Ok(0),
        s => s.parse().map_err(|_| {
            StateError::new(ErrorKind::InvalidArgument, format!("invalid version {s:?}"))
        }),
    }
}

/// A protobuf timestamp from a system time.
pub fn to_timestamp(t: SystemTime) -> proto::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    proto::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A system time from a protobuf timestamp (clamped to the epoch).
pub fn from_timestamp(t: proto::Timestamp) -> SystemTime {
    let secs = u64::try_from(t.seconds).unwrap_or(0);
    let nanos = u32::try_from(t.nanos).unwrap_or(0).min(999_999_999);
    UNIX_EPOCH + Duration::new(secs, nanos)
}

/// A resource whose spec is opaque bytes: what stated stores and what generic tools handle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawResource {
    /// Metadata.
    pub metadata: Metadata,
    /// The encoded spec (CBOR for talos-rs types).
    pub spec: Vec<u8>,
    /// The optional YAML rendering that COSI carries beside the spec.
    pub yaml_spec: String,
}

impl RawResource {
    /// Converts to the wire form.
    pub fn to_proto(&self) -> proto::Resource {
        proto::Resource {
            metadata: Some(self.metadata.to_proto()),
            spec: Some(proto::Spec {
                proto_spec: self.spec.clone(),
                yaml_spec: self.yaml_spec.clone(),
            }),
        }
    }

    /// Converts from the wire form; a resource without metadata is invalid.
    pub fn from_proto(r: proto::Resource) -> Result<Self, StateError> {
        let metadata = r.metadata.ok_or_else(|| {
            StateError::new(ErrorKind::InvalidArgument, "resource has no metadata")
        })?;
        let spec = r.spec.unwrap_or_default();
        Ok(Self {
            metadata: Metadata::from_proto(metadata)?,
            spec: spec.proto_spec,
            yaml_spec: spec.yaml_spec,
        })
    }

    /// The spec decoded into a generic JSON value (for rendering without the type).
    pub fn spec_value(&self) -> Result<serde_json::Value, SpecError> {
        spec_to_value(&self.spec)
    }

    /// Decodes into a typed resource.
    pub fn decode<S: ResourceSpec>(&self) -> Result<Resource<S>, SpecError> {
        Ok(Resource {
            metadata: self.metadata.clone(),
            spec: decode_spec(&self.spec)?,
        })
    }
}

/// A spec could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Encoding failed.
    #[error("cannot encode spec")]
    Encode(#[source] ciborium::ser::Error<std::io::Error>),
    /// Decoding failed.
    #[error("cannot decode spec")]
    Decode(#[source] ciborium::de::Error<std::io::Error>),
    /// The resource is of another type.
    #[error("resource is of type {found}, expected {expected}")]
    WrongType {
        /// What the caller asked for.
        expected: &'static str,
        /// What the resource is.
        found: String,
    },
}

/// Encodes a spec as CBOR.
pub fn encode_spec<S: Serialize>(spec: &S) -> Result<Vec<u8>, SpecError> {
    let mut out = Vec::with_capacity(64);
    ciborium::into_writer(spec, &mut out).map_err(SpecError::Encode)?;
    Ok(out)
}

/// Decodes a CBOR spec.
pub fn decode_spec<S: DeserializeOwned>(bytes: &[u8]) -> Result<S, SpecError> {
    ciborium::from_reader(bytes).map_err(SpecError::Decode)
}

/// Decodes any CBOR spec into a JSON value; an empty spec is `null`.
pub fn spec_to_value(bytes: &[u8]) -> Result<serde_json::Value, SpecError> {
    if bytes.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    ciborium::from_reader(bytes).map_err(SpecError::Decode)
}

/// A typed spec: its type name, default namespace and definition.
pub trait ResourceSpec:
    Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// The resource type, e.g. `AddressSpecs.net.talos.dev`.
    const TYPE: &'static str;
    /// The namespace resources of this type live in by default.
    const DEFAULT_NAMESPACE: &'static str;

    /// The resource definition (aliases, print columns, sensitivity).
    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, Self::DEFAULT_NAMESPACE)
    }
}

/// A resource with a typed spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource<S> {
    /// Metadata.
    pub metadata: Metadata,
    /// Spec.
    pub spec: S,
}

impl<S: ResourceSpec> Resource<S> {
    /// A new resource of type `S` in `namespace` with `id`.
    pub fn new(namespace: impl Into<String>, id: impl Into<String>, spec: S) -> Self {
        Self {
            metadata: Metadata::new(namespace, S::TYPE, id),
            spec,
        }
    }

    /// A new resource in the type's default namespace.
    pub fn new_default(id: impl Into<String>, spec: S) -> Self {
        Self::new(S::DEFAULT_NAMESPACE, id, spec)
    }

    /// The resource ID.
    pub fn id(&self) -> &str {
        &self.metadata.id
    }

    /// Encodes into an opaque resource.
    pub fn to_raw(&self) -> Result<RawResource, SpecError> {
        Ok(RawResource {
            metadata: self.metadata.clone(),
            spec: encode_spec(&self.spec)?,
            yaml_spec: String::new(),
        })
    }

    /// Decodes from an opaque resource, checking its type.
    pub fn from_raw(raw: &RawResource) -> Result<Self, SpecError> {
        if raw.metadata.r#type != S::TYPE {
            return Err(SpecError::WrongType {
                expected: S::TYPE,
                found: raw.metadata.r#type.clone(),
            });
        }
        raw.decode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct S {
        a: u32,
        b: Vec<String>,
    }

    #[test]
    fn spec_round_trip_and_generic_render() {
        let s = S {
            a: 7,
            b: vec!["x".into()],
        };
        let bytes = encode_spec(&s).unwrap();
        assert_eq!(decode_spec::<S>(&bytes).unwrap(), s);
        assert_eq!(
            spec_to_value(&bytes).unwrap(),
            serde_json::json!({"a": 7, "b": ["x"]})
        );
    }

    #[test]
    fn metadata_wire_round_trip() {
        let mut m = Metadata::new("ns", "T.x.dev", "id");
        m.version = 3;
        m.phase = Phase::TearingDown;
        m.labels.insert("k".into(), "v".into());
        m.finalizers.insert("f".into());
        m.created = Some(UNIX_EPOCH + Duration::from_millis(1500));
        assert_eq!(Metadata::from_proto(m.to_proto()).unwrap(), m);
        assert!(Metadata::from_proto(proto::Metadata {
            phase: "bogus".into(),
            ..Default::default()
        })
        .is_err());
    }
}
