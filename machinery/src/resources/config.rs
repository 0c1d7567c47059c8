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
