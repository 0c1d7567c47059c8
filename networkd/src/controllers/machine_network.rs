//! The network-relevant part of a machine configuration, decoded whole into typed values
//! before anything is derived from it: either every address, route, bond option ... parses,
//! or nothing is used (networkd never applies half of a configuration).

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use machinery::config::v1alpha1::{self, DeviceSelector};
use machinery::config::{Config, ValidationMode};
use machinery::resources::network::{
    BondMasterSpec, BridgeMasterSpec, BridgeVlanSpec, Family, NodeAddressSortAlgorithm, StpSpec,
    WireguardPeer, WireguardSpec, DEFAULT_ROUTE_METRIC,
};

/// Talos's default pod network, used for the k8s address filters when the config has none.
pub const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
/// Talos's default service network.
pub const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";

/// The network settings of a machine configuration, all parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineNetwork {
    /// `machine.network.hostname` (an FQDN or a short name).
    pub hostname: Option<String>,
    /// `machine.network.interfaces`, in order.
    pub devices: Vec<DeviceConf>,
    /// `machine.network.nameservers`.
    pub nameservers: Vec<IpAddr>,
    /// `machine.network.searchDomains`.
    pub search_domains: Vec<String>,
    /// `machine.network.disableSearchDomain`.
    pub disable_search_domain: bool,
    /// `machine.network.extraHostEntries`: address and names.
    pub extra_hosts: Vec<(IpAddr, Vec<String>)>,
    /// `machine.time.servers`.
    pub time_servers: Vec<String>,
    /// `machine.features.nodeAddressSortAlgorithm`.
    pub sort_algorithm: NodeAddressSortAlgorithm,
    /// `machine.features.stableHostname`.
    pub stable_hostname: bool,
    /// `cluster.network.podSubnets` (Talos's default if unset).
    pub pod_subnets: Vec<IpNet>,
    /// `cluster.network.serviceSubnets` (Talos's default if unset).
    pub service_subnets: Vec<IpNet>,
    /// Network documents of kinds networkd does not implement, as `kind/name`.
    pub unsupported_documents: Vec<String>,
}

/// How a device names its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkRef {
    /// By name (or alias).
    Name(String),
    /// By hardware attributes; expands to every matching link.
    Selector(DeviceSelector),
}

/// What kind of link a device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// An existing (physical) link.
    Physical,
    /// A bond networkd creates.
    Bond(BondConf),
    /// A bridge networkd creates.
    Bridge(BridgeConf),
    /// A dummy link networkd creates.
    Dummy,
    /// A WireGuard device networkd creates.
    Wireguard(WireguardSpec),
}

/// Members of a bond or bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Members {
    /// By link name.
    Names(Vec<String>),
    /// By selectors, each expanding to the matching physical links.
    Selectors(Vec<DeviceSelector>),
}

/// A bond.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BondConf {
    /// Members, in order (the order is the slave index).
    pub members: Members,
    /// Settings, with the kernel's defaults filled in.
    pub spec: BondMasterSpec,
}

/// A bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConf {
    /// Member link names.
    pub members: Vec<String>,
    /// Settings.
    pub spec: BridgeMasterSpec,
}

/// DHCP settings of a device or VLAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpConf {
    /// Run DHCPv4.
    pub ipv4: bool,
    /// Run DHCPv6.
    pub ipv6: bool,
    /// Metric of the routes from the lease.
    pub route_metric: u32,
    /// `dhcpOptions.duidv6`: the DHCPv6 client DUID as hex (empty: DUID-LL of the MAC).
    pub duid_v6: String,
}

/// A static route of a device or VLAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConf {
    /// Family (of the gateway, else of the destination).
    pub family: Family,
    /// Destination; `None` is the default route.
    pub destination: Option<IpNet>,
    /// Gateway; `None` makes a link-scope route.
    pub gateway: Option<IpAddr>,
    /// Preferred source.
    pub source: Option<IpAddr>,
    /// Metric (1024 when unset).
    pub metric: u32,
    /// Route MTU.
    pub mtu: u32,
}

/// A VLAN on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanConf {
    /// VLAN ID.
    pub vid: u16,
    /// Addressing and routes of the VLAN link.
    pub addressing: Addressing,
    /// MTU.
    pub mtu: u32,
}

/// Addresses, routes, DHCP and VIP of a link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addressing {
    /// Static addresses.
    pub addresses: Vec<IpNet>,
    /// Static routes.
    pub routes: Vec<RouteConf>,
    /// `dhcp:` as written (`None` when absent), with its options.
    pub dhcp: Option<bool>,
    /// DHCP options (defaults: IPv4 on, IPv6 off, metric 1024).
    pub dhcp_options: Option<DhcpConf>,
    /// Shared virtual IP.
    pub vip: Option<IpAddr>,
}

impl Addressing {
    /// The DHCP families to run, if `dhcp: true`.
    pub fn dhcp(&self) -> Option<DhcpConf> {
        (self.dhcp == Some(true)).then(|| {
            self.dhcp_options.clone().unwrap_or(DhcpConf {
                ipv4: true,
                ipv6: false,
                route_metric: DEFAULT_ROUTE_METRIC,
                duid_v6: String::new(),
            })
        })
    }

    /// Whether the link gets an address of its own from this configuration: static
    /// addresses or DHCP (a VIP needs another address on the link and does not count).
    pub fn assigns_address(&self) -> bool {
        !self.addresses.is_empty() || self.dhcp().is_some_and(|d| d.ipv4 || d.ipv6)
    }
}

/// One entry of `machine.network.interfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConf {
    /// The link(s) it configures.
    pub link: LinkRef,
    /// `ignore: true`: networkd leaves the link alone.
    pub ignore: bool,
    /// What the link is.
    pub kind: DeviceKind,
    /// MTU (0: leave alone).
    pub mtu: u32,
    /// Addressing.
    pub addressing: Addressing,
    /// VLANs on top.
    pub vlans: Vec<VlanConf>,
    /// Bridge this link is a port of.
    pub bridge_port: Option<String>,
}

/// Collects problems with their paths.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, path: &str, message: impl std::fmt::Display) {
        self.0.push(format!("{path}: {message}"));
    }

    fn parse<T: FromStr>(&mut self, path: &str, text: &str, what: &str) -> Option<T> {
        match text.parse() {
            Ok(v) => Some(v),
            Err(_) => {
                self.push(path, format!("invalid {what} {text:?}"));
                None
            }
        }
    }
}

/// An address with a prefix, or a bare address as a host prefix (`/32`, `/128`).
pub fn parse_prefix(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

impl MachineNetwork {
    /// Decodes and checks the network settings of a machine configuration YAML.
    ///
    /// # Errors
    ///
    /// Every problem, each with its path: the YAML does not decode, a network value does not
    /// parse, or the upstream validation rules for `machine.network` fail.
    pub fn from_yaml(yaml: &str) -> Result<Self, Vec<String>> {
        let config = Config::from_yaml(yaml)
            .map_err(|e| e.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
        Self::from_config(&config)
    }

    /// Checks and converts a decoded configuration.
    ///
    /// # Errors
    ///
    /// As [`from_yaml`](Self::from_yaml).
    pub fn from_config(config: &Config) -> Result<Self, Vec<String>> {
        let mut p = Problems::default();
        // Upstream's rules for the sections networkd reads (bond options, MTU ranges, VLAN IDs,
        // exclusive sections ...); problems elsewhere in the document are apid's to reject.
        if let Err(errors) = config.validate(ValidationMode::Container) {
            for e in errors.errors {
                if e.path.starts_with("machine.network") || e.path.starts_with("machine.time") {
                    p.0.push(e.to_string());
                }
            }
        }
        let mut out = MachineNetwork {
            pod_subnets: Vec::new(),
            service_subnets: Vec::new(),
            ..Default::default()
        };
        let machine = config.machine();
        if let Some(net) = machine.and_then(|m| m.network.as_ref()) {
            convert_network(net, &mut out, &mut p);
        }
        if let Some(time) = machine.and_then(|m| m.time.as_ref()) {
            out.time_servers.clone_from(&time.servers);
        }
        if let Some(features) = machine.and_then(|m| m.features.as_ref()) {
            out.stable_hostname = features.stable_hostname == Some(true);
            if let Some(alg) = features.node_address_sort_algorithm.as_deref() {
                if let Some(a) = p.parse(
                    "machine.features.nodeAddressSortAlgorithm",
                    alg,
                    "sort algorithm",
                ) {
                    out.sort_algorithm = a;
                }
            }
        }
        let cluster_net = config.cluster().and_then(|c| c.network.as_ref());
        let subnets = |list: Option<&Vec<String>>, default: &str, path: &str, p: &mut Problems| {
            let list: Vec<String> = match list {
                Some(l) if !l.is_empty() => l.clone(),
                _ => vec![default.to_string()],
            };
            list.iter()
                .enumerate()
                .filter_map(|(i, s)| p.parse::<IpNet>(&format!("{path}[{i}]"), s, "subnet"))
                .collect::<Vec<_>>()
        };
        out.pod_subnets = subnets(
            cluster_net.map(|n| &n.pod_subnets),
            DEFAULT_POD_SUBNET,
            "cluster.network.podSubnets",
            &mut p,
        );
        out.service_subnets = subnets(
            cluster_net.map(|n| &n.service_subnets),
            DEFAULT_SERVICE_SUBNET,
            "cluster.network.serviceSubnets",
            &mut p,
        );
        out.unsupported_documents = config
            .documents
            .iter()
            .filter(|d| {
                machinery::config::UNAPPLIED_NETWORK_DOCUMENTS
                    .iter()
                    .any(|(kind, _)| *kind == d.kind)
            })
            .map(|d| format!("{}/{}", d.kind, d.name.as_deref().unwrap_or_default()))
            .collect();
        if p.0.is_empty() {
            Ok(out)
        } else {
            Err(p.0)
        }
    }
}

fn convert_network(net: &v1alpha1::NetworkConfig, out: &mut MachineNetwork, p: &mut Problems) {
    let base = "machine.network";
    out.hostname = net.hostname.clone().filter(|h| !h.is_empty());
    if let Some(h) = &out.hostname {
        if machinery::resources::network::HostnameSpecSpec::parse_fqdn(
            h,
            machinery::resources::network::ConfigLayer::Configuration,
        )
        .is_err()
        {
            p.push(
                &format!("{base}.hostname"),
                format!("invalid hostname {h:?}"),
            );
        }
    }
    out.nameservers = net
        .nameservers
        .iter()
        .enumerate()
        .filter_map(|(i, s)| p.parse(&format!("{base}.nameservers[{i}]"), s, "address"))
        .collect();
    out.search_domains.clone_from(&net.search_domains);
    out.disable_search_domain = net.disable_search_domain == Some(true);
    for (i, h) in net.extra_host_entries.iter().enumerate() {
        let path = format!("{base}.extraHostEntries[{i}].ip");
        if let Some(ip) = p.parse(&path, h.ip.as_deref().unwrap_or_default(), "address") {
            out.extra_hosts.push((ip, h.aliases.clone()));
        }
    }
    for (i, d) in net.interfaces.iter().enumerate() {
        let path = format!("{base}.interfaces[{i}]");
        if let Some(dev) = convert_device(d, &path, p) {
            out.devices.push(dev);
        }
    }
}

fn convert_device(d: &v1alpha1::Device, path: &str, p: &mut Problems) -> Option<DeviceConf> {
    let link = match (
        d.interface.as_deref().filter(|n| !n.is_empty()),
        &d.device_selector,
    ) {
        (Some(name), None) => LinkRef::Name(name.to_string()),
        (None, Some(sel)) => LinkRef::Selector(sel.clone()),
        _ => {
            p.push(
                path,
                "exactly one of interface and deviceSelector is required",
            );
            return None;
        }
    };
    let mut addresses = d.addresses.clone();
    addresses.extend(d.cidr.clone().filter(|c| !c.is_empty()));
    let addressing = convert_addressing(
        &addresses,
        &d.routes,
        d.dhcp,
        d.dhcp_options.as_ref(),
        d.vip.as_ref(),
        path,
        p,
    );
    let kind = match (&d.bond, &d.bridge, d.dummy, &d.wireguard) {
        (Some(bond), None, _, None) => {
            DeviceKind::Bond(convert_bond(bond, &format!("{path}.bond"), p)?)
        }
        (None, Some(bridge), _, None) => DeviceKind::Bridge(BridgeConf {
            members: bridge.interfaces.clone(),
            spec: BridgeMasterSpec {
                stp: StpSpec {
                    enabled: bridge.stp.as_ref().and_then(|s| s.enabled) == Some(true),
                },
                vlan: BridgeVlanSpec {
                    filtering_enabled: bridge.vlan.as_ref().and_then(|v| v.vlan_filtering)
                        == Some(true),
                },
            },
        }),
        (None, None, Some(true), None) => DeviceKind::Dummy,
        (None, None, _, Some(wg)) => {
            DeviceKind::Wireguard(convert_wireguard(wg, &format!("{path}.wireguard"), p))
        }
        (None, None, _, None) => DeviceKind::Physical,
        _ => {
            p.push(path, "bond, bridge and wireguard are mutually exclusive");
            return None;
        }
    };
    let vlans = d
        .vlans
        .iter()
        .enumerate()
        .filter_map(|(j, v)| {
            let vpath = format!("{path}.vlans[{j}]");
            let vid = match v.vlan_id {
                Some(id @ 1..=4095) => id,
                other => {
                    p.push(
                        &format!("{vpath}.vlanId"),
                        format!("invalid VLAN ID {other:?}"),
                    );
                    return None;
                }
            };
            let mut addresses = v.addresses.clone();
            addresses.extend(v.cidr.clone().filter(|c| !c.is_empty()));
            Some(VlanConf {
                vid,
                addressing: convert_addressing(
                    &addresses,
                    &v.routes,
                    v.dhcp,
                    v.dhcp_options.as_ref(),
                    v.vip.as_ref(),
                    &vpath,
                    p,
                ),
                mtu: v.mtu.unwrap_or(0),
            })
        })
        .collect();
    Some(DeviceConf {
        link,
        ignore: d.is_ignored(),
        kind,
        mtu: d.mtu.unwrap_or(0),
        addressing,
        vlans,
        bridge_port: d
            .bridge_port
            .as_ref()
            .and_then(|b| b.master.clone())
            .filter(|m| !m.is_empty()),
    })
}

fn convert_addressing(
    addresses: &[String],
    routes: &[v1alpha1::Route],
    dhcp: Option<bool>,
    options: Option<&v1alpha1::DhcpOptions>,
    vip: Option<&v1alpha1::DeviceVipConfig>,
    path: &str,
    p: &mut Problems,
) -> Addressing {
    let addresses = addresses
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let parsed = parse_prefix(a);
            if parsed.is_none() {
                p.push(
                    &format!("{path}.addresses[{i}]"),
                    format!("invalid address {a:?}"),
                );
            }
            parsed
        })
        .collect();
    let routes = routes
        .iter()
        .enumerate()
        .filter_map(|(i, r)| convert_route(r, &format!("{path}.routes[{i}]"), p))
        .collect();
    let dhcp_options = options.map(|o| DhcpConf {
        ipv4: o.ipv4.unwrap_or(true),
        ipv6: o.ipv6.unwrap_or(false),
        route_metric: o
            .route_metric
            .filter(|m| *m != 0)
            .unwrap_or(DEFAULT_ROUTE_METRIC),
        duid_v6: o.duidv6.clone().unwrap_or_default(),
    });
    let vip = vip.and_then(|v| {
        let text = v.ip.as_deref().unwrap_or_default();
        p.parse(&format!("{path}.vip.ip"), text, "address")
    });
    Addressing {
        addresses,
        routes,
        dhcp,
        dhcp_options,
        vip,
    }
}

fn convert_route(r: &v1alpha1::Route, path: &str, p: &mut Problems) -> Option<RouteConf> {
    let network = r.network.as_deref().unwrap_or_default();
    let destination = if network.is_empty() {
        None
    } else {
        Some(p.parse::<IpNet>(&format!("{path}.network"), network, "network")?)
    };
    let gateway = match r.gateway.as_deref().filter(|g| !g.is_empty()) {
        Some(g) => Some(p.parse::<IpAddr>(&format!("{path}.gateway"), g, "gateway")?),
        None => None,
    };
    let source = match r.source.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(p.parse::<IpAddr>(&format!("{path}.source"), s, "source")?),
        None => None,
    };
    if destination.is_none() && gateway.is_none() {
        p.push(path, "either network or gateway is required");
        return None;
    }
    if let (Some(d), Some(g)) = (&destination, &gateway) {
        if d.addr().is_ipv4() != g.is_ipv4() {
            p.push(path, "network and gateway are of different families");
            return None;
        }
    }
    let family = gateway
        .or(destination.map(|d| d.addr()))
        .map_or(Family::Inet4, |a| Family::of(&a));
    // `0.0.0.0/0` and `::/0` are the default route, as an empty network.
    let destination = destination.filter(|d| d.prefix_len() != 0);
    Some(RouteConf {
        family,
        destination,
        gateway,
        source,
        metric: r.metric.filter(|m| *m != 0).unwrap_or(DEFAULT_ROUTE_METRIC),
        mtu: r.mtu.unwrap_or(0),
    })
}

fn convert_bond(b: &v1alpha1::Bond, path: &str, p: &mut Problems) -> Option<BondConf> {
    let members = if b.device_selectors.is_empty() {
        Members::Names(b.interfaces.clone())
    } else {
        Members::Selectors(b.device_selectors.clone())
    };
    let mut spec = BondMasterSpec::default();
    macro_rules! enum_field {
        ($field:ident, $key:literal, $what:literal) => {
            if let Some(v) = b.$field.as_deref().filter(|v| !v.is_empty()) {
                spec.$field = p.parse(&format!("{path}.{}", $key), v, $what)?;
            }
        };
    }
    match b.mode.as_deref() {
        Some(m) => spec.mode = p.parse(&format!("{path}.mode"), m, "bond mode")?,
        None => {
            p.push(&format!("{path}.mode"), "bond mode is required");
            return None;
        }
    }
    enum_field!(xmit_hash_policy, "xmitHashPolicy", "transmit hash policy");
    enum_field!(lacp_rate, "lacpRate", "LACP rate");
    enum_field!(arp_validate, "arpValidate", "ARP validate");
    enum_field!(arp_all_targets, "arpAllTargets", "ARP all targets");
    enum_field!(primary_reselect, "primaryReselect", "primary reselect");
    enum_field!(fail_over_mac, "failOverMac", "fail over MAC");
    enum_field!(ad_select, "adSelect", "AD select");
    spec.primary = b.primary.clone().unwrap_or_default();
    spec.miimon = b.miimon.unwrap_or(0);
    spec.updelay = b.updelay.unwrap_or(0);
    spec.downdelay = b.downdelay.unwrap_or(0);
    spec.arp_interval = b.arp_interval.unwrap_or(0);
    spec.resend_igmp = b.resend_igmp.unwrap_or(0);
    spec.min_links = b.min_links.unwrap_or(0);
    spec.lp_interval = b.lp_interval.unwrap_or(0);
    spec.packets_per_slave = b.packets_per_slave.unwrap_or(0);
    spec.num_peer_notif = b.num_peer_notif.unwrap_or(0);
    spec.tlb_dynamic_lb = b.tlb_dynamic_lb.unwrap_or(0);
    spec.all_slaves_active = b.all_slaves_active.unwrap_or(0);
    spec.use_carrier = b.use_carrier.unwrap_or(true);
    spec.ad_actor_sys_prio = b.ad_actor_sys_prio.unwrap_or(0);
    spec.ad_user_port_key = b.ad_user_port_key.unwrap_or(0);
    spec.peer_notify_delay = b.peer_notify_delay.unwrap_or(0);
    for (i, t) in b.arp_ip_target.iter().enumerate() {
        spec.arp_ip_targets
            .push(p.parse(&format!("{path}.arpIPTarget[{i}]"), t, "address")?);
    }
    spec.fill_defaults();
    Some(BondConf { members, spec })
}

fn convert_wireguard(
    wg: &v1alpha1::DeviceWireguardConfig,
    path: &str,
    p: &mut Problems,
) -> WireguardSpec {
    WireguardSpec {
        private_key: wg.private_key.clone().unwrap_or_default(),
        public_key: String::new(),
        listen_port: wg.listen_port.unwrap_or(0),
        firewall_mark: wg.firewall_mark.unwrap_or(0),
        peers: wg
            .peers
            .iter()
            .enumerate()
            .map(|(i, peer)| WireguardPeer {
                public_key: peer.public_key.clone().unwrap_or_default(),
                preshared_key: String::new(),
                endpoint: peer.endpoint.clone().unwrap_or_default(),
                persistent_keepalive_interval_seconds: peer
                    .persistent_keepalive_interval
                    .as_deref()
                    .map_or(0, |d| {
                        go_duration_seconds(d).unwrap_or_else(|| {
                            p.push(
                                &format!("{path}.peers[{i}].persistentKeepaliveInterval"),
                                format!("invalid duration {d:?}"),
                            );
                            0
                        })
                    }),
                allowed_ips: peer
                    .allowed_ips
                    .iter()
                    .enumerate()
                    .filter_map(|(j, a)| {
                        let parsed = parse_prefix(a);
                        if parsed.is_none() {
                            p.push(
                                &format!("{path}.peers[{i}].allowedIPs[{j}]"),
                                format!("invalid prefix {a:?}"),
                            );
                        }
                        parsed
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Whole seconds of a Go duration such as `25s`, `1m30s`, `0.5h`.
fn go_duration_seconds(s: &str) -> Option<u32> {
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * scale;
    }
    let secs = total.floor();
    (0.0..=f64::from(u32::MAX))
        .contains(&secs)
        .then(|| format!("{secs:.0}").parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_network_section() {
        let yaml = r#"
version: v1alpha1
machine:
  type: worker
  network:
    hostname: node-1.example.com
    nameservers: [10.0.0.53, "2001:db8::53"]
    extraHostEntries:
      - {ip: 10.0.0.10, aliases: [registry.local]}
    interfaces:
      - interface: eth0
        addresses: [10.0.0.2/24, 10.0.0.3]
        routes:
          - {network: 0.0.0.0/0, gateway: 10.0.0.1}
          - {network: 192.168.0.0/16, gateway: 10.0.0.254, metric: 100}
        mtu: 9000
        vlans:
          - {vlanId: 20, addresses: [192.168.20.2/24]}
          - {vlanId: 30, dhcp: true, dhcpOptions: {routeMetric: 2048}}
      - interface: bond0
        bond:
          mode: 802.3ad
          interfaces: [eth1, eth2]
          miimon: 100
        dhcp: true
  time:
    servers: [pool.ntp.org]
"#;
        let m = MachineNetwork::from_yaml(yaml).expect("valid");
        assert_eq!(m.hostname.as_deref(), Some("node-1.example.com"));
        assert_eq!(m.nameservers.len(), 2);
        assert_eq!(m.devices.len(), 2);
        let eth0 = &m.devices[0];
        assert_eq!(eth0.addressing.addresses[1].to_string(), "10.0.0.3/32");
        assert_eq!(eth0.addressing.routes[0].destination, None);
        assert_eq!(eth0.addressing.routes[0].metric, 1024);
        assert_eq!(
            eth0.vlans[1].addressing.dhcp().map(|d| d.route_metric),
            Some(2048)
        );
        let DeviceKind::Bond(bond) = &m.devices[1].kind else {
            panic!("bond")
        };
        assert_eq!(bond.spec.ad_actor_sys_prio, 65535, "kernel defaults filled");
        assert_eq!(m.time_servers, ["pool.ntp.org"]);
        assert_eq!(m.pod_subnets[0].to_string(), DEFAULT_POD_SUBNET);
    }

    #[test]
    fn every_problem_is_reported_and_nothing_is_returned() {
        let yaml = r#"
version: v1alpha1
machine:
  network:
    nameservers: [not-an-ip]
    interfaces:
      - interface: eth0
        addresses: [10.0.0.300/24]
        routes:
          - {network: 10.1.0.0/16, gateway: bogus}
      - interface: bond0
        bond: {mode: fastest, interfaces: [eth1]}
"#;
        let errors = MachineNetwork::from_yaml(yaml).expect_err("invalid");
        let all = errors.join("\n");
        assert!(all.contains("machine.network.nameservers[0]"), "{all}");
        assert!(
            all.contains("machine.network.interfaces[0].addresses[0]"),
            "{all}"
        );
        assert!(
            all.contains("machine.network.interfaces[0].routes[0]"),
            "{all}"
        );
        assert!(
            all.contains("machine.network.interfaces[1].bond.mode"),
            "{all}"
        );
        assert!(MachineNetwork::from_yaml("version: v1alpha1\nmachine: [").is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_seconds("25s"), Some(25));
        assert_eq!(go_duration_seconds("1m30s"), Some(90));
        assert_eq!(go_duration_seconds("x"), None);
        assert_eq!(go_duration_seconds(""), None);
    }
}
