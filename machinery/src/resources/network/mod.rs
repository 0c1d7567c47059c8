//! The network namespaces: per-layer spec candidates in `network-config`, merged specs and
//! observed statuses in `network` (written by networkd). Type names, IDs, aliases and print
//! columns follow Talos (`pkg/machinery/resources/network`).
//!
//! One module per type; every ID is built in [`id`]; the enums of upstream `nethelpers` are in
//! [`nethelpers`] and serialize as upstream's strings.

mod address_spec;
mod address_status;
mod config_layer;
mod etc_file;
mod hostname_spec;
mod hostname_status;
pub mod id;
mod link_spec;
mod link_status;
pub mod nethelpers;
mod node_address;
mod node_address_filter;
mod operator_spec;
mod resolver_spec;
mod resolver_status;
mod route_spec;
mod route_status;
mod status;
pub mod text;
mod time_server_spec;
mod time_server_status;

pub use address_spec::{AddressSpec, AddressSpecSpec};
pub use address_status::{AddressStatus, AddressStatusSpec};
pub use config_layer::ConfigLayer;
pub use etc_file::{EtcFileSpec, EtcFileSpecSpec, EtcFileStatus, EtcFileStatusSpec};
pub use hostname_spec::{HostnameError, HostnameSpec, HostnameSpecSpec};
pub use hostname_status::{HostnameStatus, HostnameStatusSpec};
pub use id::*;
pub use link_spec::{
    BondMasterSpec, BondSlave, BridgeMasterSpec, BridgeSlave, BridgeVlanSpec, LinkSpec,
    LinkSpecSpec, StpSpec, VlanSpec, WireguardPeer, WireguardSpec, KIND_BOND, KIND_BRIDGE,
    KIND_DUMMY, KIND_VETH, KIND_VLAN, KIND_VRF, KIND_WIREGUARD,
};
pub use link_status::{LinkStatus, LinkStatusSpec};
pub use nethelpers::*;
pub use node_address::{NodeAddress, NodeAddressSpec};
pub use node_address_filter::{NodeAddressFilter, NodeAddressFilterSpec};
pub use operator_spec::{
    Dhcp4OperatorSpec, Dhcp6OperatorSpec, Operator, OperatorSpec, OperatorSpecSpec, VipOperatorSpec,
};
pub use resolver_spec::{ResolverSpec, ResolverSpecSpec};
pub use resolver_status::{ResolverStatus, ResolverStatusSpec};
pub use route_spec::{RouteSpec, RouteSpecSpec};
pub use route_status::{RouteStatus, RouteStatusSpec};
pub use status::{Status, StatusSpec};
pub use time_server_spec::{TimeServerSpec, TimeServerSpecSpec};
pub use time_server_status::{TimeServerStatus, TimeServerStatusSpec};

/// The namespace of merged specs and statuses (upstream `NamespaceName`).
pub const NAMESPACE: &str = "network";
/// The namespace of per-layer spec candidates (upstream `ConfigNamespaceName`).
pub const CONFIG_NAMESPACE: &str = "network-config";

/// Definitions of every network type.
pub fn definitions() -> Vec<cosi::ResourceDefinition> {
    use cosi::ResourceSpec;
    vec![
        AddressSpecSpec::definition(),
        AddressStatusSpec::definition(),
        LinkSpecSpec::definition(),
        LinkStatusSpec::definition(),
        RouteSpecSpec::definition(),
        RouteStatusSpec::definition(),
        HostnameSpecSpec::definition(),
        HostnameStatusSpec::definition(),
        ResolverSpecSpec::definition(),
        ResolverStatusSpec::definition(),
        TimeServerSpecSpec::definition(),
        TimeServerStatusSpec::definition(),
        OperatorSpecSpec::definition(),
        NodeAddressSpec::definition(),
        NodeAddressFilterSpec::definition(),
        StatusSpec::definition(),
        EtcFileSpecSpec::definition(),
        EtcFileStatusSpec::definition(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use cosi::definition::Sensitivity;

    #[test]
    fn definitions_follow_talos() {
        let defs = definitions();
        let get = |t: &str| {
            defs.iter()
                .find(|d| d.resource_type == t)
                .unwrap_or_else(|| panic!("{t} defined"))
        };
        assert!(get("AddressStatuses.net.talos.dev").matches("addresses"));
        assert!(get("LinkStatuses.net.talos.dev").matches("links"));
        assert!(get("RouteStatuses.net.talos.dev").matches("route"));
        assert!(get("HostnameStatuses.net.talos.dev").matches("hostname"));
        assert!(get("NetworkStatuses.net.talos.dev").matches("netstatus"));
        assert!(get("NodeAddresses.net.talos.dev").matches("nodeaddresses"));
        assert!(get("AddressSpecs.net.talos.dev").matches("addressspecs"));
        assert_eq!(
            get("LinkSpecs.net.talos.dev").sensitivity,
            Sensitivity::Sensitive
        );
        assert_eq!(
            get("OperatorSpecs.net.talos.dev").sensitivity,
            Sensitivity::Sensitive
        );
        let links = get("LinkStatuses.net.talos.dev");
        assert_eq!(
            links
                .print_columns
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            [
                "Alias",
                "Type",
                "Kind",
                "Hw Addr",
                "Oper State",
                "Link State"
            ]
        );
        for d in &defs {
            assert_eq!(d.default_namespace, NAMESPACE, "{}", d.resource_type);
        }
        let mut ids: Vec<_> = defs.iter().map(|d| d.id()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), defs.len(), "no type twice");
    }
}
