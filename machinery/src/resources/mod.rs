//! Typed resources of every namespace, with their definitions. One module per namespace; type
//! names, IDs and aliases follow Talos.

pub mod apid;
pub mod block;
pub mod config;
pub mod etcd;
pub mod network;
pub mod runtime;
pub mod secrets;
pub mod trustd;

use cosi::ResourceDefinition;

/// Definitions of every typed resource this crate knows.
pub fn definitions() -> Vec<ResourceDefinition> {
    use cosi::ResourceSpec;
    let mut defs = vec![config::MachineConfigSpec::definition()];
    defs.extend(runtime::definitions());
    defs.extend(block::definitions());
    defs.extend(network::definitions());
    defs.extend(secrets::definitions());
    defs.extend(trustd::definitions());
    defs.extend(apid::definitions());
    defs.extend(etcd::definitions());
    defs
}
