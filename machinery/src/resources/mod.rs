//! Typed resources of every namespace, with their definitions. One module per namespace; type
//! names, IDs and aliases follow Talos.

pub mod config;
pub mod network;
pub mod runtime;
pub mod secrets;

use cosi::ResourceDefinition;

/// Namespaces of a node: name, description, whether it survives reboot.
pub const NAMESPACES: &[(&str, &str, bool)] = &[
    ("config", "Machine configuration.", true),
    (
        "runtime",
        "Daemons, services and the observed state of the node.",
        false,
    ),
    (
        "network-config",
        "Network configuration candidates of every config layer.",
        false,
    ),
    (
        "network",
        "Merged network specs and the observed network state.",
        false,
    ),
    ("block", "Disks, volumes and mounts.", false),
    ("secrets", "CAs and certificates.", false),
    (
        "trustd",
        "trustd's own state (its dependency graph).",
        false,
    ),
    ("etcd", "etcd configuration and membership.", false),
    ("k8s", "Kubernetes control plane and kubelet.", false),
];

/// Definitions of every typed resource this crate knows.
pub fn definitions() -> Vec<ResourceDefinition> {
    use cosi::ResourceSpec;
    let mut defs = vec![config::MachineConfigSpec::definition()];
    defs.extend(runtime::definitions());
    defs.extend(network::definitions());
    defs.extend(secrets::definitions());
    defs
}
