//! LinkSpec: the desired state of one link (physical, or logical: bond, bridge, VLAN, dummy,
//! WireGuard).

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::nethelpers::{
    AdLacpActive, AdSelect, ArpAllTargets, ArpValidate, BondMode, BondXmitHashPolicy, FailOverMac,
    HardwareAddr, LacpRate, LinkType, PrimaryReselect, VlanProtocol,
};
use super::text;
use super::NAMESPACE;

/// Link kind (`IFLA_INFO_KIND`) of a VLAN.
pub const KIND_VLAN: &str = "vlan";
/// Link kind of a bond.
pub const KIND_BOND: &str = "bond";
/// Link kind of a bridge.
pub const KIND_BRIDGE: &str = "bridge";
/// Link kind of a VRF.
pub const KIND_VRF: &str = "vrf";
/// Link kind of a veth pair.
pub const KIND_VETH: &str = "veth";
/// Link kind of a WireGuard device.
pub const KIND_WIREGUARD: &str = "wireguard";
/// Link kind of a dummy link.
pub const KIND_DUMMY: &str = "dummy";

/// Desired state of one link: a candidate of one layer in `network-config`, or the merged
/// winner in `network` that the LinkSpec controller applies. Sensitive (WireGuard keys).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkSpecSpec {
    /// Link name (for a physical link also an alias or altname).
    pub name: String,
    /// Whether networkd creates (and deletes) the link; physical links are never created.
    pub logical: bool,
    /// Administratively up.
    pub up: bool,
    /// MTU; 0 leaves it alone.
    pub mtu: u32,
    /// `IFLA_INFO_KIND` of a logical link (`bond`, `vlan`, ...); empty for physical links.
    pub kind: String,
    /// Link type (`ARPHRD_*`).
    #[serde(rename = "type")]
    pub r#type: LinkType,
    /// Hardware address to set, if any.
    #[serde(
        rename = "hardwareAddr",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub hardware_address: Option<HardwareAddr>,
    /// Parent link of a VLAN.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_name: String,
    /// Enslavement to a bond (inline: `masterName`, `slaveIndex`).
    #[serde(flatten)]
    pub bond_slave: BondSlave,
    /// Enslavement to a bridge.
    #[serde(default, skip_serializing_if = "BridgeSlave::is_zero")]
    pub bridge_slave: BridgeSlave,
    /// VLAN settings of a VLAN link.
    #[serde(default, skip_serializing_if = "VlanSpec::is_zero")]
    pub vlan: VlanSpec,
    /// Bond settings of a bond.
    #[serde(default, skip_serializing_if = "BondMasterSpec::is_zero")]
    pub bond_master: BondMasterSpec,
    /// Bridge settings of a bridge.
    #[serde(default, skip_serializing_if = "BridgeMasterSpec::is_zero")]
    pub bridge_master: BridgeMasterSpec,
    /// WireGuard settings of a WireGuard device.
    #[serde(default, skip_serializing_if = "WireguardSpec::is_zero")]
    pub wireguard: WireguardSpec,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
    /// Multicast flag, if it is to be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multicast: Option<bool>,
}

impl LinkSpecSpec {
    /// Folds a higher-layer candidate into this one as upstream `LinkSpecSpec.Merge`: every
    /// non-zero field of `higher` overrides (so a higher layer cannot turn `up` back to false
    /// or clear an MTU), bond settings are replaced if set, the hardware address if set,
    /// WireGuard peers are unioned by public key, and the layer becomes `higher`'s.
    pub fn merge(&mut self, higher: &LinkSpecSpec) {
        fn set_str(dst: &mut String, src: &str) {
            if !src.is_empty() {
                *dst = src.to_string();
            }
        }
        set_str(&mut self.name, &higher.name);
        self.logical |= higher.logical;
        self.up |= higher.up;
        if higher.mtu != 0 {
            self.mtu = higher.mtu;
        }
        set_str(&mut self.kind, &higher.kind);
        if higher.r#type != LinkType::default() {
            self.r#type = higher.r#type;
        }
        if higher.hardware_address.is_some() {
            self.hardware_address.clone_from(&higher.hardware_address);
        }
        set_str(&mut self.parent_name, &higher.parent_name);
        if !higher.bond_slave.is_zero() {
            self.bond_slave = higher.bond_slave.clone();
        }
        if !higher.bridge_slave.is_zero() {
            self.bridge_slave = higher.bridge_slave.clone();
        }
        if !higher.vlan.is_zero() {
            self.vlan = higher.vlan;
        }
        if !higher.bond_master.is_zero() {
            self.bond_master = higher.bond_master.clone();
        }
        if !higher.bridge_master.is_zero() {
            self.bridge_master = higher.bridge_master;
        }
        self.wireguard.merge(&higher.wireguard);
        if higher.multicast.is_some() {
            self.multicast = higher.multicast;
        }
        self.layer = higher.layer;
    }
}

impl ResourceSpec for LinkSpecSpec {
    const TYPE: &'static str = "LinkSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).sensitive()
    }
}

impl cosi::generic::Layered for LinkSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        self.name.clone()
    }
}

/// A `LinkSpec` resource.
pub type LinkSpec = Resource<LinkSpecSpec>;

/// Enslavement of a link to a bond.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BondSlave {
    /// The bond; empty when not enslaved.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub master_name: String,
    /// Position among the bond's members (masters and members are applied in this order).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub slave_index: u32,
}

impl BondSlave {
    /// Whether the link is not a bond member.
    pub fn is_zero(&self) -> bool {
        self.master_name.is_empty() && self.slave_index == 0
    }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// Enslavement of a link to a bridge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BridgeSlave {
    /// The bridge; empty when not enslaved.
    pub master_name: String,
}

impl BridgeSlave {
    /// Whether the link is not a bridge port.
    pub fn is_zero(&self) -> bool {
        self.master_name.is_empty()
    }
}

/// VLAN settings (they cannot change in place: a change replaces the link).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VlanSpec {
    /// VLAN ID, 1..=4095.
    #[serde(rename = "vlanID")]
    pub vid: u16,
    /// Protocol.
    #[serde(rename = "vlanProtocol")]
    pub protocol: VlanProtocol,
}

impl VlanSpec {
    /// Whether unset.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// Bridge settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeMasterSpec {
    /// Spanning tree.
    pub stp: StpSpec,
    /// VLAN awareness.
    pub vlan: BridgeVlanSpec,
}

impl BridgeMasterSpec {
    /// Whether unset.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// Spanning tree settings of a bridge (`IFLA_BR_STP_STATE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StpSpec {
    /// STP on.
    pub enabled: bool,
}

/// VLAN settings of a bridge (`IFLA_BR_VLAN_FILTERING`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BridgeVlanSpec {
    /// VLAN filtering on.
    pub filtering_enabled: bool,
}

/// Bond settings (`IFLA_BOND_*`); see [`BondMasterSpec::fill_defaults`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BondMasterSpec {
    /// Mode.
    pub mode: BondMode,
    /// Transmit hash policy.
    pub xmit_hash_policy: BondXmitHashPolicy,
    /// LACP rate (802.3ad).
    pub lacp_rate: LacpRate,
    /// ARP validation.
    pub arp_validate: ArpValidate,
    /// ARP all targets.
    pub arp_all_targets: ArpAllTargets,
    /// Primary member by link name (what the config sets).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub primary: String,
    /// Primary member by index (resolved at apply time, by the LinkSpec controller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary_index: Option<u32>,
    /// Primary reselection policy.
    pub primary_reselect: PrimaryReselect,
    /// Fail-over MAC policy.
    pub fail_over_mac: FailOverMac,
    /// 802.3ad aggregation selection.
    pub ad_select: AdSelect,
    /// MII monitoring interval (ms).
    pub miimon: u32,
    /// Up delay (ms).
    pub updelay: u32,
    /// Down delay (ms).
    pub downdelay: u32,
    /// ARP monitoring interval (ms).
    pub arp_interval: u32,
    /// IGMP reports after failover.
    pub resend_igmp: u32,
    /// Minimum active links.
    pub min_links: u32,
    /// Learning packet interval.
    pub lp_interval: u32,
    /// Packets per member (round-robin).
    pub packets_per_slave: u32,
    /// Peer notifications after failover.
    pub num_peer_notif: u8,
    /// Dynamic TLB shuffling.
    #[serde(rename = "tlbLogicalLb")]
    pub tlb_dynamic_lb: u8,
    /// Deliver on inactive members.
    pub all_slaves_active: u8,
    /// Use carrier state for MII.
    pub use_carrier: bool,
    /// 802.3ad actor system priority.
    pub ad_actor_sys_prio: u16,
    /// 802.3ad user port key.
    pub ad_user_port_key: u16,
    /// Delay between peer notifications.
    pub peer_notify_delay: u32,
    /// ARP monitoring targets (IPv4, at most 16).
    #[serde(
        with = "text::vec",
        rename = "arpIpTargets",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub arp_ip_targets: Vec<IpAddr>,
    /// NS monitoring targets (IPv6, at most 16).
    #[serde(
        with = "text::vec",
        rename = "nsIp6Targets",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ns_ip6_targets: Vec<IpAddr>,
    /// LACP active (802.3ad); `None` is the kernel default (on).
    #[serde(rename = "adLacpActive", skip_serializing_if = "Option::is_none")]
    pub ad_lacp_active: Option<AdLacpActive>,
    /// Missed ARP/NS replies before a member is down.
    pub missed_max: u8,
}

impl BondMasterSpec {
    /// Whether unset.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Sets the values the kernel would report for unset fields, so that a spec compares equal
    /// to the kernel's view and is never re-applied (upstream `FillDefaults`).
    pub fn fill_defaults(&mut self) {
        let lacp_like = matches!(self.mode, BondMode::Lacp | BondMode::Alb | BondMode::Tlb);
        self.use_carrier = true;
        if self.resend_igmp == 0 {
            self.resend_igmp = 1;
        }
        if self.lp_interval == 0 {
            self.lp_interval = 1;
        }
        if self.packets_per_slave == 0 {
            self.packets_per_slave = 1;
        }
        if self.num_peer_notif == 0 {
            self.num_peer_notif = 1;
        }
        if !matches!(self.mode, BondMode::Alb | BondMode::Tlb) && self.tlb_dynamic_lb == 0 {
            self.tlb_dynamic_lb = 1;
        }
        if self.mode == BondMode::Lacp && self.ad_actor_sys_prio == 0 {
            self.ad_actor_sys_prio = 65535;
        }
        if !lacp_like && self.missed_max == 0 {
            self.missed_max = 2;
        }
    }
}

/// WireGuard settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WireguardSpec {
    /// Base64 private key (spec only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub private_key: String,
    /// Base64 public key (status only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub public_key: String,
    /// Listen port; 0 means any.
    pub listen_port: u16,
    /// Firewall mark.
    pub firewall_mark: u32,
    /// Peers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<WireguardPeer>,
}

impl WireguardSpec {
    /// Whether unset.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Folds a higher-layer spec in: set scalars override, peers are appended by unique
    /// public key.
    pub fn merge(&mut self, higher: &WireguardSpec) {
        if !higher.private_key.is_empty() {
            self.private_key.clone_from(&higher.private_key);
        }
        if !higher.public_key.is_empty() {
            self.public_key.clone_from(&higher.public_key);
        }
        if higher.listen_port != 0 {
            self.listen_port = higher.listen_port;
        }
        if higher.firewall_mark != 0 {
            self.firewall_mark = higher.firewall_mark;
        }
        for peer in &higher.peers {
            if !self.peers.iter().any(|p| p.public_key == peer.public_key) {
                self.peers.push(peer.clone());
            }
        }
    }
}

/// A WireGuard peer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WireguardPeer {
    /// Base64 public key.
    pub public_key: String,
    /// Base64 preshared key.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub preshared_key: String,
    /// `host:port`; empty means "don't care".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// Keepalive interval in seconds; 0 is off.
    pub persistent_keepalive_interval_seconds: u32,
    /// Allowed IPs.
    #[serde(with = "text::vec", rename = "allowedIPs")]
    pub allowed_ips: Vec<IpNet>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_overrides_only_non_zero_fields() {
        let mut low = LinkSpecSpec {
            name: "eth0".into(),
            up: true,
            mtu: 1500,
            r#type: LinkType::ETHER,
            layer: ConfigLayer::Default,
            ..Default::default()
        };
        let high = LinkSpecSpec {
            name: "eth0".into(),
            up: false,
            mtu: 0,
            bond_slave: BondSlave {
                master_name: "bond0".into(),
                slave_index: 1,
            },
            layer: ConfigLayer::Configuration,
            ..Default::default()
        };
        low.merge(&high);
        assert!(low.up, "a higher layer cannot turn up back to false");
        assert_eq!(low.mtu, 1500);
        assert_eq!(low.bond_slave.master_name, "bond0");
        assert_eq!(low.layer, ConfigLayer::Configuration);
    }

    #[test]
    fn bond_defaults_match_the_kernel() {
        let mut b = BondMasterSpec {
            mode: BondMode::Lacp,
            ..Default::default()
        };
        b.fill_defaults();
        assert_eq!(b.ad_actor_sys_prio, 65535);
        assert_eq!(b.missed_max, 0);
        assert_eq!(b.tlb_dynamic_lb, 1);
        let mut b = BondMasterSpec {
            mode: BondMode::Alb,
            ..Default::default()
        };
        b.fill_defaults();
        assert_eq!(b.tlb_dynamic_lb, 0);
        assert!(b.use_carrier);
    }

    #[test]
    fn bond_slave_is_inline_on_the_wire() {
        let spec = LinkSpecSpec {
            name: "eth1".into(),
            bond_slave: BondSlave {
                master_name: "bond0".into(),
                slave_index: 2,
            },
            ..Default::default()
        };
        let bytes = cosi::resource::encode_spec(&spec).expect("encode");
        let value = cosi::resource::spec_to_value(&bytes).expect("value");
        assert_eq!(value["masterName"], "bond0");
        assert_eq!(value["slaveIndex"], 2);
        assert_eq!(value["type"], "netrom");
        let back: LinkSpecSpec = cosi::resource::decode_spec(&bytes).expect("decode");
        assert_eq!(back, spec);
    }
}
