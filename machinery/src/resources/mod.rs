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
    let mut defs = vec![config::MachineConfigSpec::definition()];
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
    /// The daemon that defines a type: one per type group (networkd defines two).
    fn group(t: &str) -> &str {
        match t.split_once('.').map_or("", |(_, g)| g) {
            "files.talos.dev" => "net.talos.dev",
            g => g,
        }
    }

    #[test]
    fn no_name_belongs_to_two_daemons_types() {
        // stated refuses a definition that takes a name (alias, plural) of another owner's
        // type: a daemon whose definitions collide would run with its types undefined.
        let mut seen = std::collections::BTreeMap::new();
        let mut both = Vec::new();
        for d in super::definitions() {
            for a in &d.all_aliases {
                if let Some(other) = seen.insert(a.clone(), d.resource_type.clone()) {
                    if group(&other) != group(&d.resource_type) {
                        both.push(format!("{a}: {other} {}", d.resource_type));
                    }
                }
            }
        }
        assert!(both.is_empty(), "{both:#?}");
    }
}
