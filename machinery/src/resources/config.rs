//! The `config` namespace: the machine configuration (durable).

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// The namespace of machine configuration.
pub const NAMESPACE: &str = "config";
/// The namespace of the machine configuration without its secrets
/// ([`Config::redact`](crate::config::Config::redact)): what every daemon but the key holders
/// reads. init keeps it equal to `config`, resource for resource.
pub const REDACTED_NAMESPACE: &str = "config-redacted";
/// ID of the active machine configuration.
pub const ACTIVE_ID: &str = "v1alpha1";
/// The annotation of a redacted copy that holds the version of the configuration it was made
/// from: what a client that read the copy sends back as `expected_version` when it applies a
/// change of it (so that a change made in between is not undone).
pub const SOURCE_VERSION_ANNOTATION: &str = "config.talos-rs.dev/source-version";

/// The version of the configuration `r` holds: its own for one of `config`, the one it was
/// made from for a redacted copy (`None` when the copy does not say: made by an older init).
pub fn source_version(r: &MachineConfig) -> Option<u64> {
    if r.metadata.namespace == REDACTED_NAMESPACE {
        r.metadata
            .annotations
            .get(SOURCE_VERSION_ANNOTATION)
            .and_then(|v| v.parse().ok())
    } else {
        Some(r.metadata.version)
    }
}

/// The machine configuration as applied: the multi-document YAML text, validated before it was
/// written. Sensitive (it carries keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MachineConfigSpec(pub String);

impl ResourceSpec for MachineConfigSpec {
    const TYPE: &'static str = "MachineConfigs.config.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["mc"])
            .sensitive()
    }
}

/// A `MachineConfig` resource.
pub type MachineConfig = Resource<MachineConfigSpec>;

/// ID of [`MachineTypeSpec`].
pub const MACHINE_TYPE_ID: &str = "machine-type";

/// The node's machine type (upstream's `MachineTypes.config.talos.dev`, ID `machine-type`):
/// `controlplane`, `worker` or `init` (the spec is the bare name, as upstream's YAML). Not
/// sensitive: what a reader needs to know which checks a node takes (`talosctl health`)
/// without reading the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MachineTypeSpec(pub String);

impl ResourceSpec for MachineTypeSpec {
    const TYPE: &'static str = "MachineTypes.config.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("Type", "{@}")])
    }
}

impl MachineTypeSpec {
    /// Whether the node is a control plane (`controlplane`, or the legacy `init`).
    pub fn is_control_plane(&self) -> bool {
        crate::config::v1alpha1::MachineType::parse(&self.0)
            .is_some_and(crate::config::v1alpha1::MachineType::is_control_plane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_follows_talos() {
        let rd = MachineConfigSpec::definition();
        assert!(rd.matches("mc"));
        assert!(rd.matches("machineconfig"));
        assert!(rd.matches("machineconfigs"));
        assert_eq!(rd.display_type, "MachineConfig");
        assert_eq!(rd.sensitivity, cosi::definition::Sensitivity::Sensitive);
    }
}
