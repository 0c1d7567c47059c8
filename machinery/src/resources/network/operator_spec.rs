//! OperatorSpec: an operator (DHCPv4, DHCPv6, VIP) to run on a link.

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::id::{operator_id, vip_operator_id};
use super::nethelpers::{string_enum, ClientIdentifier};
use super::text;
use super::NAMESPACE;

string_enum! {
    /// Which operator.
    Operator: "operator" {
        /// DHCPv4 client.
        Dhcp4 = "dhcp4",
        /// DHCPv6 client.
        Dhcp6 = "dhcp6",
        /// Shared virtual IP.
        Vip = "vip",
    }
    default Dhcp4
}

/// An operator to run on a link: a candidate per layer in `network-config`
/// (`default/dhcp4/eth0`, `configuration/dhcp4/eth0`), the winner in `network` (`dhcp4/eth0`)
/// that the OperatorSpec controller runs. Sensitive (VIP API tokens).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSpecSpec {
    /// Which operator.
    pub operator: Operator,
    /// The link it runs on.
    pub link_name: String,
    /// Run only while the link is up (operstate up or unknown).
    pub require_up: bool,
    /// DHCPv4 settings.
    #[serde(default)]
    pub dhcp4: Dhcp4OperatorSpec,
    /// DHCPv6 settings.
    #[serde(default)]
    pub dhcp6: Dhcp6OperatorSpec,
    /// VIP settings.
    #[serde(default)]
    pub vip: VipOperatorSpec,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
}

impl OperatorSpecSpec {
    /// The natural ID: `dhcp4/eth0`, `dhcp6/eth0`, `vip/eth0/10.0.0.100` (upstream `OperatorID`).
    pub fn id(&self) -> String {
        match (self.operator, self.vip.ip) {
            (Operator::Vip, Some(ip)) => vip_operator_id(&self.link_name, &ip),
            (op, _) => operator_id(op, &self.link_name),
        }
    }

    /// Equal but for the layer (upstream `Equal`): a running operator is restarted only when
    /// this is false.
    pub fn same_operator(&self, other: &OperatorSpecSpec) -> bool {
        let mut a = self.clone();
        a.layer = other.layer;
        a == *other
    }
}

impl ResourceSpec for OperatorSpecSpec {
    const TYPE: &'static str = "OperatorSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).sensitive()
    }
}

impl cosi::generic::Layered for OperatorSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        self.id()
    }
}

/// An `OperatorSpec` resource.
pub type OperatorSpec = Resource<OperatorSpecSpec>;

/// DHCPv4 settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Dhcp4OperatorSpec {
    /// Metric of the routes and priority of the address from the lease (0 means 1024).
    pub route_metric: u32,
    /// Do not ask the server for a hostname.
    pub skip_hostname_request: bool,
    /// Client identifier (option 61).
    pub client_identifier: ClientIdentifier,
    /// The DUID as hex, for [`ClientIdentifier::Duid`].
    #[serde(rename = "duidRawHex", skip_serializing_if = "String::is_empty")]
    pub duid_raw_hex: String,
    /// Do not install routes from the lease.
    pub skip_routes: bool,
}

/// DHCPv6 settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Dhcp6OperatorSpec {
    /// Metric of the routes and priority of the address.
    pub route_metric: u32,
    /// Do not ask the server for a hostname.
    pub skip_hostname_request: bool,
    /// Client identifier.
    pub client_identifier: ClientIdentifier,
    /// The DUID as hex.
    #[serde(rename = "duidRawHex", skip_serializing_if = "String::is_empty")]
    pub duid_raw_hex: String,
}

/// Shared virtual IP settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VipOperatorSpec {
    /// The shared IP.
    #[serde(with = "text::opt", skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
    /// Announce with a gratuitous ARP when acquired (layer 2 VIPs).
    #[serde(rename = "gratuitousARP")]
    pub gratuitous_arp: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_equality() {
        let a = OperatorSpecSpec {
            operator: Operator::Dhcp4,
            link_name: "eth0".into(),
            require_up: true,
            layer: ConfigLayer::Default,
            ..Default::default()
        };
        assert_eq!(a.id(), "dhcp4/eth0");
        let mut b = a.clone();
        b.layer = ConfigLayer::Configuration;
        assert!(a.same_operator(&b));
        b.dhcp4.route_metric = 2048;
        assert!(!a.same_operator(&b));
        let vip = OperatorSpecSpec {
            operator: Operator::Vip,
            link_name: "eth0".into(),
            vip: VipOperatorSpec {
                ip: Some("10.0.0.100".parse().expect("ip")),
                gratuitous_arp: true,
            },
            ..Default::default()
        };
        assert_eq!(vip.id(), "vip/eth0/10.0.0.100");
    }
}
