//! EtcFileSpec and EtcFileStatus: the rendered `/etc/hosts`, `/etc/resolv.conf` and
//! `/etc/hostname` of the node.
//!
//! Upstream keeps them in a `files` namespace written by a separate controller; here networkd
//! renders and writes them itself, so they live in `network` (networkd writes no other
//! namespace), under upstream's type names.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::NAMESPACE;

/// The contents of one file under `/etc` (ID: the file name, `hosts`, `resolv.conf`,
/// `hostname`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcFileSpecSpec {
    /// File contents.
    pub contents: String,
    /// File mode (permission bits).
    pub mode: u32,
}

impl ResourceSpec for EtcFileSpecSpec {
    const TYPE: &'static str = "EtcFileSpecs.files.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // Sensitive, as upstream's (a file under /etc may hold credentials).
        ResourceDefinition::new(Self::TYPE, NAMESPACE).sensitive()
    }
}

/// An `EtcFileSpec` resource.
pub type EtcFileSpec = Resource<EtcFileSpecSpec>;

/// A file under `/etc` that was written (ID as its spec's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcFileStatusSpec {
    /// Version of the EtcFileSpec that was written.
    pub spec_version: String,
    /// Where it was written.
    pub path: String,
}

impl ResourceSpec for EtcFileStatusSpec {
    const TYPE: &'static str = "EtcFileStatuses.files.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

/// An `EtcFileStatus` resource.
pub type EtcFileStatus = Resource<EtcFileStatusSpec>;
