//! `machine.network` section of the v1alpha1 document (legacy network configuration).

use serde::{Deserialize, Serialize};

/// `machine.network`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Static hostname.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Interfaces (links) to configure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Device>,
    /// Static nameservers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Static search domains.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub search_domains: Vec<String>,
    /// Extra `/etc/hosts` entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_host_entries: Vec<ExtraHost>,
    /// KubeSpan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubespan: Option<NetworkKubeSpan>,
    /// Do not derive a search domain from the hostname.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_search_domain: Option<bool>,
}

/// An `/etc/hosts` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtraHost {
    /// IP address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Host names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

/// One interface of `machine.network.interfaces`, selected by `interface` name or `deviceSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Device {
    /// Link name or alias; exclusive with `deviceSelector`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Selects the link by hardware attributes (globs); exclusive with `interface`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<DeviceSelector>,
    /// Static addresses, CIDR or bare IP.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Deprecated single address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// Static routes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// Makes this link a bond.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bond: Option<Bond>,
    /// Makes this link a bridge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<Bridge>,
    /// Enslaves this link to a bridge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge_port: Option<BridgePort>,
    /// VLANs on top of this link.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vlans: Vec<Vlan>,
    /// MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Run DHCP on this link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<bool>,
    /// Leave this link alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore: Option<bool>,
    /// Create a dummy link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dummy: Option<bool>,
    /// DHCP options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp_options: Option<DhcpOptions>,
    /// Makes this link a WireGuard device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wireguard: Option<DeviceWireguardConfig>,
    /// Shared virtual IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip: Option<DeviceVipConfig>,
}

impl Device {
    /// True if `ignore: true`.
    pub fn is_ignored(&self) -> bool {
        self.ignore == Some(true)
    }

    /// The interface name, or `""` when selected by `deviceSelector`.
    pub fn name(&self) -> &str {
        self.interface.as_deref().unwrap_or("")
    }
}

/// Selects a link by its attributes; every set field must match (globs allowed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceSelector {
    /// PCI/USB bus path prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_path: Option<String>,
    /// MAC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware_addr: Option<String>,
    /// Permanent MAC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permanent_addr: Option<String>,
    /// PCI vendor:product ID.
    #[serde(rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    /// Kernel driver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Only physical links.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical: Option<bool>,
}

impl DeviceSelector {
    /// True if no criterion is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A static route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Route {
    /// Destination CIDR; empty or `0.0.0.0/0` is the default route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Gateway; empty creates a link-scope route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Preferred source address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Metric (0 means 1024).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// Route MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// Bond options (kernel bonding driver names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Bond {
    /// Member links by name; exclusive with `deviceSelectors`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// Member links by selector.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_selectors: Vec<DeviceSelector>,
    /// Not supported.
    #[serde(rename = "arpIPTarget", skip_serializing_if = "Vec::is_empty")]
    pub arp_ip_target: Vec<String>,
    /// Bond mode, e.g. `802.3ad`, `active-backup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Transmit hash policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xmit_hash_policy: Option<String>,
    /// LACP rate (`slow`, `fast`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lacp_rate: Option<String>,
    /// Not supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ad_actor_system: Option<String>,
    /// ARP validation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arp_validate: Option<String>,
    /// ARP all targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arp_all_targets: Option<String>,
    /// Primary member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Primary reselection policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary_reselect: Option<String>,
    /// Fail-over MAC policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_over_mac: Option<String>,
    /// 802.3ad aggregation selection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ad_select: Option<String>,
    /// MII monitoring interval (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub miimon: Option<u32>,
    /// Up delay (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updelay: Option<u32>,
    /// Down delay (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downdelay: Option<u32>,
    /// ARP monitoring interval (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arp_interval: Option<u32>,
    /// IGMP reports after failover.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resend_igmp: Option<u32>,
    /// Minimum active links.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_links: Option<u32>,
    /// Learning packet interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lp_interval: Option<u32>,
    /// Packets per member in round-robin mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packets_per_slave: Option<u32>,
    /// Peer notifications after failover.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_peer_notif: Option<u8>,
    /// Dynamic TLB shuffling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tlb_dynamic_lb: Option<u8>,
    /// Deliver on inactive members.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_slaves_active: Option<u8>,
    /// Use carrier state for MII.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_carrier: Option<bool>,
    /// 802.3ad actor system priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ad_actor_sys_prio: Option<u16>,
    /// 802.3ad user port key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ad_user_port_key: Option<u16>,
    /// Delay between peer notifications.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_notify_delay: Option<u32>,
}

/// Bridge options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Bridge {
    /// Member links.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// Spanning tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stp: Option<Stp>,
    /// VLAN awareness.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<BridgeVlan>,
}

/// Spanning tree options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Stp {
    /// STP enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Bridge VLAN options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct BridgeVlan {
    /// VLAN filtering enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan_filtering: Option<bool>,
}

/// Bridge port options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BridgePort {
    /// Name of the bridge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
}

/// A VLAN on top of an interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Vlan {
    /// Static addresses.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Deprecated single address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// Static routes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// Run DHCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<bool>,
    /// VLAN ID, 1..=4095.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
    /// MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Shared virtual IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip: Option<DeviceVipConfig>,
    /// DHCP options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp_options: Option<DhcpOptions>,
}

/// DHCP options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DhcpOptions {
    /// Metric of the routes received by DHCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_metric: Option<u32>,
    /// DHCPv4 (default on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<bool>,
    /// DHCPv6 (default off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<bool>,
    /// DUID (hex).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duidv6: Option<String>,
}

/// WireGuard device options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceWireguardConfig {
    /// Base64 private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// Listen port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<u16>,
    /// Firewall mark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firewall_mark: Option<u32>,
    /// Peers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<DeviceWireguardPeer>,
}

/// A WireGuard peer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceWireguardPeer {
    /// Base64 public key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// `host:port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Keepalive interval (Go duration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_keepalive_interval: Option<String>,
    /// Allowed IPs (CIDR).
    #[serde(rename = "allowedIPs", skip_serializing_if = "Vec::is_empty")]
    pub allowed_ips: Vec<String>,
}

/// A shared virtual IP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceVipConfig {
    /// The IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Equinix Metal API assignment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub equinix_metal: Option<VipApiToken>,
    /// Hetzner Cloud API assignment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hcloud: Option<VipApiToken>,
}

/// Cloud API credentials of a VIP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct VipApiToken {
    /// API token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_token: Option<String>,
}

/// Deprecated `machine.network.kubespan`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkKubeSpan {
    /// Enabled (needs cluster discovery).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Route pod CIDRs over KubeSpan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_kubernetes_networks: Option<bool>,
    /// Bypass down peers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_down_peer_bypass: Option<bool>,
    /// Publish extra endpoints learned from WireGuard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harvest_extra_endpoints: Option<bool>,
    /// Link MTU (default 1420).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Address filters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filters: Option<KubeSpanFilters>,
}

/// KubeSpan filters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeSpanFilters {
    /// Endpoints advertised (CIDRs, `!` excludes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// Networks not advertised.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exclude_advertised_networks: Vec<String>,
}
