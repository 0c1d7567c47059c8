//! Types of the `v1alpha1` machine configuration document (upstream
//! `pkg/machinery/config/types/v1alpha1`), field for field.
//!
//! Every struct decodes strictly (`deny_unknown_fields`), has `#[serde(default)]` so that a
//! partial document (a patch) decodes, and skips absent values when serialized, so a decoded and
//! re-encoded document contains exactly what the input had. Which fields are required is a
//! matter of [`validation`](crate::config::Config::validate), not of decoding.
//! Free-form sections (kubelet `extraConfig`, audit policy, static pods, ...) are kept as
//! [`serde_yaml_ng::Value`].

mod cluster;
mod machine;
mod network;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use cluster::*;
pub use machine::*;
pub use network::*;

/// The schema version this document type carries in its `version` field.
pub const VERSION: &str = "v1alpha1";

/// The `v1alpha1` document: the legacy, kind-less document of a machine configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct V1Alpha1 {
    /// Schema version, `v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Verbose logging to the console.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug: Option<bool>,
    /// Deprecated; must be true when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist: Option<bool>,
    /// Machine-specific configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineConfig>,
    /// Cluster-wide configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

impl V1Alpha1 {
    /// The machine type, if `machine.type` is set to a known value.
    pub fn machine_type(&self) -> Option<MachineType> {
        self.machine
            .as_ref()
            .and_then(|m| m.machine_type.as_deref())
            .and_then(MachineType::parse)
    }
}

/// Role of a machine in the cluster (`machine.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MachineType {
    /// `controlplane`: runs etcd and the Kubernetes control plane.
    ControlPlane,
    /// `worker`: a compute node.
    Worker,
    /// `init`: legacy name of the first control plane node; treated as a control plane.
    Init,
}

impl MachineType {
    /// Parses the `machine.type` value; the legacy `join` is accepted as a worker.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "controlplane" => Some(Self::ControlPlane),
            "worker" | "join" => Some(Self::Worker),
            "init" => Some(Self::Init),
            _ => None,
        }
    }

    /// The canonical name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControlPlane => "controlplane",
            Self::Worker => "worker",
            Self::Init => "init",
        }
    }

    /// True for control plane (and legacy init) machines.
    pub fn is_control_plane(self) -> bool {
        matches!(self, Self::ControlPlane | Self::Init)
    }
}

impl fmt::Display for MachineType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A base64-encoded PEM certificate and its (optional) key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CertificateAndKey {
    /// Base64 of the PEM certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crt: Option<String>,
    /// Base64 of the PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl CertificateAndKey {
    /// True if a non-empty certificate is set.
    pub fn has_crt(&self) -> bool {
        self.crt.as_deref().is_some_and(|s| !s.is_empty())
    }

    /// True if a non-empty key is set.
    pub fn has_key(&self) -> bool {
        self.key.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// A base64-encoded PEM certificate without a key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Certificate {
    /// Base64 of the PEM certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crt: Option<String>,
}

/// A base64-encoded PEM private key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrivateKey {
    /// Base64 of the PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Resource requests and limits of a control plane static pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourcesConfig {
    /// Reserved cpu/memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<serde_yaml_ng::Value>,
    /// Maximum cpu/memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<serde_yaml_ng::Value>,
}
