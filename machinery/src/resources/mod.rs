//! Typed resources of every namespace, with their definitions. One module per namespace; type
//! names, IDs and aliases follow Talos.

pub mod apid;
pub mod block;
pub mod config;
pub mod etcd;
pub mod k8s;
pub mod network;
pub mod runtime;
pub mod secrets;
pub mod trustd;

use cosi::ResourceDefinition;

/// Definitions of every typed resource this crate knows.
pub fn definitions() -> Vec<ResourceDefinition> {
    use cosi::ResourceSpec;
    let mut defs = vec![
        config::MachineConfigSpec::definition(),
        config::MachineTypeSpec::definition(),
    ];
    defs.extend(runtime::definitions());
    defs.extend(block::definitions());
    defs.extend(network::definitions());
    defs.extend(secrets::definitions());
    defs.extend(trustd::definitions());
    defs.extend(apid::definitions());
    defs.extend(etcd::definitions());
    defs.extend(k8s::definitions());
    defs
}

#[cfg(test)]
mod tests {
    use cosi::definition::Sensitivity;

    #[test]
    fn no_name_belongs_to_two_types() {
        // stated refuses a definition that takes a name (type, display type, alias, plural)
        // of another type, whoever defined it: a daemon whose definitions collide would run
        // with a type undefined, and `talosctl get` would find a name ambiguous.
        let mut seen = std::collections::BTreeMap::new();
        let mut both = Vec::new();
        for d in super::definitions() {
            for a in d.names() {
                if let Some(other) = seen.insert(a.clone(), d.resource_type.clone()) {
                    both.push(format!("{a}: {other} {}", d.resource_type));
                }
            }
        }
        assert!(both.is_empty(), "{both:#?}");
    }

    #[test]
    fn what_a_reader_must_not_have_is_sensitive() {
        // Upstream's sensitive types that talos-rs has, and ours that carry keys, tokens, a
        // configuration with secrets or an etcd backup.
        let must = [
            "MachineConfigs.config.talos.dev",
            "VolumeConfigs.block.talos.dev",
            "LinkSpecs.net.talos.dev",
            "OperatorSpecs.net.talos.dev",
            "EtcFileSpecs.files.talos.dev",
            "APIServerConfigs.kubernetes.talos.dev",
            "KubeletConfigs.kubernetes.talos.dev",
            "KubeletSpecs.kubernetes.talos.dev",
            "Manifests.kubernetes.talos.dev",
            "MaintenanceServerCertificates.apid.talos.dev",
            "EtcdSnapshotChunks.etcd.talos.dev",
            "EtcdRecoverChunks.apid.talos.dev",
        ];
        let defs = super::definitions();
        for t in must {
            let d = defs
                .iter()
                .find(|d| d.resource_type == t)
                .unwrap_or_else(|| panic!("{t} is not defined"));
            assert_eq!(d.sensitivity, Sensitivity::Sensitive, "{t}");
        }
        for d in defs
            .iter()
            .filter(|d| d.resource_type.contains(".secrets."))
        {
            assert_eq!(d.sensitivity, Sensitivity::Sensitive, "{}", d.resource_type);
        }
    }
}
