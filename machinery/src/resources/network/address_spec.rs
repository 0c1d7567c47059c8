//! AddressSpec: the desired state of one address on one link.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::id::address_id;
use super::nethelpers::{AddressFlags, Family, Scope};
use super::text;
use super::NAMESPACE;

/// Desired state of one address on one link: a candidate of one layer in `network-config`,
/// or the merged winner in `network` that the AddressSpec controller applies to the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressSpecSpec {
    /// The address with its prefix length (host bits kept: `10.0.0.2/24`).
    #[serde(with = "text")]
    pub address: IpNet,
    /// The link (name, alias or altname; resolved at apply time).
    pub link_name: String,
    /// Address family.
    pub family: Family,
    /// Scope.
    pub scope: Scope,
    /// Flags; only [`AddressFlags::MANAGED`] ones are applied.
    pub flags: AddressFlags,
    /// Send a gratuitous ARP after adding it (VIPs).
    #[serde(rename = "announceWithARP")]
    pub announce_with_arp: bool,
    /// Route priority of the prefix route (`IFA_RT_PRIORITY`); 0 leaves the kernel default.
    pub priority: u32,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
}

impl AddressSpecSpec {
    /// The natural ID, `eth0/10.0.0.2/24`.
    pub fn id(&self) -> String {
        address_id(&self.link_name, &self.address)
    }
}

impl ResourceSpec for AddressSpecSpec {
    const TYPE: &'static str = "AddressSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

impl cosi::generic::Layered for AddressSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        self.id()
    }
}

/// An `AddressSpec` resource.
pub type AddressSpec = Resource<AddressSpecSpec>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_form_is_readable() {
        let spec = AddressSpecSpec {
            address: "10.0.0.2/24".parse().expect("prefix"),
            link_name: "eth0".into(),
            family: Family::Inet4,
            scope: Scope::Global,
            flags: AddressFlags::PERMANENT,
            announce_with_arp: false,
            priority: 0,
            layer: ConfigLayer::Configuration,
        };
        assert_eq!(spec.id(), "eth0/10.0.0.2/24");
        let bytes = cosi::resource::encode_spec(&spec).expect("encode");
        let value = cosi::resource::spec_to_value(&bytes).expect("value");
        assert_eq!(
            value,
            serde_json::json!({
                "address": "10.0.0.2/24", "linkName": "eth0", "family": "inet4",
                "scope": "global", "flags": "permanent", "announceWithARP": false,
                "priority": 0, "layer": "configuration"
            })
        );
        let back: AddressSpecSpec = cosi::resource::decode_spec(&bytes).expect("decode");
        assert_eq!(back, spec);
    }
}
