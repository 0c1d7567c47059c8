//! LinkStatus: one link as the kernel (rtnetlink, ethtool, sysfs) reports it.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::link_spec::{BondMasterSpec, BridgeMasterSpec, VlanSpec, WireguardSpec};
use super::nethelpers::{HardwareAddr, LinkFlags, LinkType, OperationalState};
use super::NAMESPACE;

/// One link as observed (ID: the kernel link name).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinkStatusSpec {
    /// `IFLA_IFALIAS`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub alias: String,
    /// Alternative names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alt_names: Vec<String>,
    /// Interface index.
    pub index: u32,
    /// Link type.
    #[serde(rename = "type")]
    pub r#type: LinkType,
    /// `IFLA_LINK`: the parent (VLAN) or peer (veth) index.
    pub link_index: u32,
    /// `IFF_*` flags.
    pub flags: LinkFlags,
    /// Current hardware address.
    pub hardware_addr: HardwareAddr,
    /// Permanent (burnt-in) hardware address.
    pub permanent_addr: HardwareAddr,
    /// Broadcast address.
    pub broadcast_addr: HardwareAddr,
    /// MTU.
    pub mtu: u32,
    /// Queueing discipline.
    pub queue_disc: String,
    /// Index of the master (bond, bridge, VRF); 0 if none.
    pub master_index: u32,
    /// Operational state.
    pub operational_state: OperationalState,
    /// `IFLA_INFO_KIND`; empty for physical links.
    pub kind: String,
    /// `IFLA_INFO_SLAVE_KIND`.
    pub slave_kind: String,
    /// Bus path (`pci-0000:00:1f.6`, sysfs).
    pub bus_path: String,
    /// PCI `vendor:product` ID.
    #[serde(rename = "pciID")]
    pub pci_id: String,
    /// Kernel driver.
    pub driver: String,
    /// Driver version.
    pub driver_version: String,
    /// Firmware version.
    pub firmware_version: String,
    /// Product ID.
    #[serde(rename = "productID")]
    pub product_id: String,
    /// Vendor ID.
    #[serde(rename = "vendorID")]
    pub vendor_id: String,
    /// Product name.
    pub product: String,
    /// Vendor name.
    pub vendor: String,
    /// Carrier (ethtool link state).
    pub link_state: bool,
    /// Speed in Mbit/s.
    pub speed_megabits: i64,
    /// Port type (ethtool).
    pub port: String,
    /// Duplex (ethtool).
    pub duplex: String,
    /// Decoded VLAN data.
    #[serde(skip_serializing_if = "VlanSpec::is_zero")]
    pub vlan: VlanSpec,
    /// Decoded bridge data.
    #[serde(skip_serializing_if = "BridgeMasterSpec::is_zero")]
    pub bridge_master: BridgeMasterSpec,
    /// Decoded bond data.
    #[serde(skip_serializing_if = "BondMasterSpec::is_zero")]
    pub bond_master: BondMasterSpec,
    /// WireGuard device (public key only).
    #[serde(skip_serializing_if = "WireguardSpec::is_zero")]
    pub wireguard: WireguardSpec,
}

impl LinkStatusSpec {
    /// A physical link: Ethernet with no kind (upstream `Physical()`). Decides default DHCP,
    /// default up, and the carrier requirement of node addresses.
    pub fn physical(&self) -> bool {
        self.r#type == LinkType::ETHER && self.kind.is_empty()
    }

    /// Whether a DHCP client may start on the link: [`oper_up`](Self::oper_up), or already
    /// administratively up with carrier (`IFF_UP` and `IFF_LOWER_UP`, which the kernel sets in
    /// the first link event after `ip link set up`). Ours, on purpose: upstream waits for
    /// operstate UP, which the kernel's linkwatch reports up to a second later for every
    /// device whose ifindex equals its iflink (every physical NIC), and a DISCOVER sent on
    /// carrier is answered just the same.
    pub fn dhcp_ready(&self) -> bool {
        self.oper_up()
            || (self.flags.contains(LinkFlags::UP) && self.flags.contains(LinkFlags::LOWER_UP))
    }

    /// Whether the link counts as up for operators and node addresses: operstate up or unknown.
    pub fn oper_up(&self) -> bool {
        matches!(
            self.operational_state,
            OperationalState::Up | OperationalState::Unknown
        )
    }
}

impl ResourceSpec for LinkStatusSpec {
    const TYPE: &'static str = "LinkStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["link", "links"])
            .with_columns(&[
                ("Alias", "{.alias}"),
                ("Type", "{.type}"),
                ("Kind", "{.kind}"),
                ("Hw Addr", "{.hardwareAddr}"),
                ("Oper State", "{.operationalState}"),
                ("Link State", "{.linkState}"),
            ])
    }
}

/// A `LinkStatus` resource.
pub type LinkStatus = Resource<LinkStatusSpec>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dhcp_may_start_on_carrier_before_operstate_up() {
        let link = |state, flags| LinkStatusSpec {
            operational_state: state,
            flags,
            ..LinkStatusSpec::default()
        };
        // The first event after `ip link set up`: carrier, operstate not yet up.
        let carrier = link(OperationalState::Down, LinkFlags::UP | LinkFlags::LOWER_UP);
        assert!(!carrier.oper_up() && carrier.dhcp_ready());
        assert!(link(OperationalState::Up, LinkFlags::UP | LinkFlags::LOWER_UP).dhcp_ready());
        assert!(link(OperationalState::Unknown, LinkFlags::UP).dhcp_ready());
        // Up without carrier, or carrier while administratively down: not yet.
        assert!(!link(OperationalState::Down, LinkFlags::UP).dhcp_ready());
        assert!(!link(OperationalState::Down, LinkFlags::LOWER_UP).dhcp_ready());
    }
}
