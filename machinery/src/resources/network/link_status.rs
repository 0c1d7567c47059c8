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
