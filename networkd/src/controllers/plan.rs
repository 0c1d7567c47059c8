//! The per-layer link, address, route and operator candidates that the machine configuration,
//! the kernel command line and the defaults ask for: one pure function, [`plan`], shared by
//! the Link/Address/Route/OperatorConfig controllers so that they agree on which links are
//! configured.
//!
//! # Which links get the default DHCPv4 operator
//!
//! Upstream turns default DHCP off for *every* link as soon as any new-style link document
//! exists (a `LinkConfig` for `lo` alone cut nodes off, issue #12654), and off for a link as
//! soon as the configuration mentions it at all (an MTU-only entry leaves the link without an
//! address). Here the rule is per link and about addresses:
//!
//! - every physical link (LinkStatus `physical()`) gets `default/dhcp4/<link>`, unless
//! - it is ignored (`ignore: true`, `talos.network.interface.ignore=`), or
//! - it is a member of a bond or bridge (configuration or command line), or
//! - the configuration or the command line gives it an address of its own (static addresses,
//!   `dhcp: true` for either family, `ip=`), says `dhcp: false` explicitly, or puts VLANs on
//!   it (the operator then manages its tagged networks and the untagged one on purpose).
//!
//! An entry that only sets an MTU, routes or a VIP keeps default DHCP. A bond or bridge that
//! the configuration creates without any addressing (no addresses, no `dhcp:` key, no VLANs)
//! gets `default/dhcp4/<master>`: its members lost default DHCP by being enslaved, and the
//! node must stay reachable. So a partial configuration can only cut a node off by saying so.
//!
//! Default-layer candidates lose to every other layer in the merge, so a DHCP operator the
//! configuration asks for with other options simply overrides the default one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use machinery::resources::network::{
    layered_id, vlan_link_name, AddressFlags, AddressSpecSpec, BondSlave, BridgeSlave,
    ClientIdentifier, ConfigLayer, Dhcp4OperatorSpec, Dhcp6OperatorSpec, Family, LinkSpecSpec,
    LinkStatus, LinkType, Operator, OperatorSpecSpec, RouteProtocol, RouteSpecSpec, RouteType,
    RoutingTable, Scope, VipOperatorSpec, VlanProtocol, VlanSpec, DEFAULT_ROUTE_METRIC, KIND_BOND,
    KIND_BRIDGE, KIND_DUMMY, KIND_VLAN, KIND_WIREGUARD,
};

use super::cmdline::{bond_link, CmdlineNetwork};
use super::machine_network::{
    Addressing, DeviceConf, DeviceKind, LinkRef, MachineNetwork, Members, RouteConf,
};
use super::selector;

/// The loopback link.
pub const LOOPBACK: &str = "lo";

/// What the plan is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The machine configuration's network settings, if there is a configuration.
    pub machine: Option<&'a MachineNetwork>,
    /// The kernel command line's network settings.
    pub cmdline: &'a CmdlineNetwork,
    /// The links the node has.
    pub links: &'a [LinkStatus],
}

/// Candidates for `network-config`, by ID (`<layer>/<natural id>`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// LinkSpec candidates.
    pub links: BTreeMap<String, LinkSpecSpec>,
    /// AddressSpec candidates.
    pub addresses: BTreeMap<String, AddressSpecSpec>,
    /// RouteSpec candidates.
    pub routes: BTreeMap<String, RouteSpecSpec>,
    /// OperatorSpec candidates.
    pub operators: BTreeMap<String, OperatorSpecSpec>,
}

/// What the configuration and command line did to each link name, for the default rules.
#[derive(Default)]
struct Claims {
    /// Links ignored.
    ignored: BTreeSet<String>,
    /// Links enslaved to a bond or bridge.
    enslaved: BTreeSet<String>,
    /// Links given an address, an explicit `dhcp: false`, or VLANs.
    addressed: BTreeSet<String>,
    /// Bonds and bridges without addressing, which get default DHCP.
    bare_masters: BTreeSet<String>,
}

impl Plan {
    /// Adds a link candidate, merging it into one of the same layer and name (a bond member
    /// that is also described by its own entry, an `ip=` naming a `bond=`).
    fn link(&mut self, spec: LinkSpecSpec) {
        match self.links.entry(layered_id(spec.layer, &spec.name)) {
            std::collections::btree_map::Entry::Occupied(mut e) => e.get_mut().merge(&spec),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(spec);
            }
        }
    }

    fn address(&mut self, link: &str, address: IpNet, layer: ConfigLayer) {
        let spec = AddressSpecSpec {
            address,
            link_name: link.to_string(),
            family: Family::of(&address.addr()),
            scope: if address.addr().is_loopback() {
                Scope::Host
            } else {
                Scope::Global
            },
            flags: AddressFlags::PERMANENT,
            announce_with_arp: false,
            priority: 0,
            layer,
        };
        self.addresses.insert(layered_id(layer, &spec.id()), spec);
    }

    fn route(&mut self, mut spec: RouteSpecSpec) {
        spec.normalize();
        self.routes.insert(layered_id(spec.layer, &spec.id()), spec);
    }

    fn operator(&mut self, spec: OperatorSpecSpec) {
        self.operators
            .insert(layered_id(spec.layer, &spec.id()), spec);
    }

    fn dhcp4(&mut self, link: &str, metric: u32, client_id: ClientIdentifier, layer: ConfigLayer) {
        self.operator(OperatorSpecSpec {
            operator: Operator::Dhcp4,
            link_name: link.to_string(),
            require_up: true,
            dhcp4: Dhcp4OperatorSpec {
                route_metric: metric,
                client_identifier: client_id,
                ..Default::default()
            },
            layer,
            ..Default::default()
        });
    }
}

/// Computes every candidate of the configuration, command line and default layers.
pub fn plan(inputs: Inputs<'_>) -> Plan {
    let mut plan = Plan::default();
    let mut claims = Claims::default();
    claims.ignored.extend(inputs.cmdline.ignore.iter().cloned());
    if let Some(machine) = inputs.machine {
        for device in machine.devices.iter().filter(|d| d.ignore) {
            claims.ignored.extend(resolve(&device.link, inputs.links));
        }
        for device in machine.devices.iter().filter(|d| !d.ignore) {
            for name in resolve(&device.link, inputs.links) {
                if !claims.ignored.contains(&name) {
                    configure_device(&mut plan, &mut claims, device, &name, inputs.links);
                }
            }
        }
    }
    configure_cmdline(&mut plan, &mut claims, inputs);
    configure_defaults(&mut plan, &claims, inputs.links);
    plan
}

/// The link names a device applies to.
fn resolve(link: &LinkRef, links: &[LinkStatus]) -> Vec<String> {
    match link {
        LinkRef::Name(name) => vec![name.clone()],
        LinkRef::Selector(sel) => selector::select(sel, links)
            .into_iter()
            .map(str::to_string)
            .collect(),
    }
}

fn configure_device(
    plan: &mut Plan,
    claims: &mut Claims,
    device: &DeviceConf,
    name: &str,
    links: &[LinkStatus],
) {
    const LAYER: ConfigLayer = ConfigLayer::Configuration;
    let mut link = LinkSpecSpec {
        name: name.to_string(),
        up: true,
        mtu: device.mtu,
        layer: LAYER,
        ..Default::default()
    };
    let mut master = false;
    match &device.kind {
        DeviceKind::Physical => {}
        DeviceKind::Bond(bond) => {
            master = true;
            link.logical = true;
            link.kind = KIND_BOND.into();
            link.r#type = LinkType::ETHER;
            link.bond_master = bond.spec.clone();
            let members: Vec<String> = match &bond.members {
                Members::Names(names) => names.clone(),
                Members::Selectors(sels) => {
                    let mut out: Vec<String> = Vec::new();
                    for sel in sels {
                        for m in selector::select(sel, links) {
                            if m != name && !out.iter().any(|o| o == m) {
                                out.push(m.to_string());
                            }
                        }
                    }
                    out
                }
            };
            for (i, member) in members.iter().enumerate() {
                claims.enslaved.insert(member.clone());
                plan.link(LinkSpecSpec {
                    name: member.clone(),
                    up: true,
                    bond_slave: BondSlave {
                        master_name: name.to_string(),
                        slave_index: u32::try_from(i).unwrap_or(u32::MAX),
                    },
                    layer: LAYER,
                    ..Default::default()
                });
            }
        }
        DeviceKind::Bridge(bridge) => {
            master = true;
            link.logical = true;
            link.kind = KIND_BRIDGE.into();
            link.r#type = LinkType::ETHER;
            link.bridge_master = bridge.spec;
            for member in &bridge.members {
                claims.enslaved.insert(member.clone());
                plan.link(LinkSpecSpec {
                    name: member.clone(),
                    up: true,
                    bridge_slave: BridgeSlave {
                        master_name: name.to_string(),
                    },
                    layer: LAYER,
                    ..Default::default()
                });
            }
        }
        DeviceKind::Dummy => {
            link.logical = true;
            link.kind = KIND_DUMMY.into();
            link.r#type = LinkType::ETHER;
        }
        DeviceKind::Wireguard(wg) => {
            link.logical = true;
            link.kind = KIND_WIREGUARD.into();
            link.r#type = LinkType::NONE;
            link.wireguard = wg.clone();
        }
    }
    if let Some(bridge) = &device.bridge_port {
        claims.enslaved.insert(name.to_string());
        link.bridge_slave = BridgeSlave {
            master_name: bridge.clone(),
        };
    }
    plan.link(link);

    addressing(plan, name, &device.addressing, LAYER);
    if device.addressing.assigns_address()
        || device.addressing.dhcp == Some(false)
        || !device.vlans.is_empty()
    {
        claims.addressed.insert(name.to_string());
    } else if master {
        claims.bare_masters.insert(name.to_string());
    }

    for vlan in &device.vlans {
        let vlan_name = vlan_link_name(name, vlan.vid);
        plan.link(LinkSpecSpec {
            name: vlan_name.clone(),
            logical: true,
            up: true,
            mtu: vlan.mtu,
            kind: KIND_VLAN.into(),
            r#type: LinkType::ETHER,
            parent_name: name.to_string(),
            vlan: VlanSpec {
                vid: vlan.vid,
                protocol: VlanProtocol::Ieee8021q,
            },
            layer: LAYER,
            ..Default::default()
        });
        addressing(plan, &vlan_name, &vlan.addressing, LAYER);
    }
}

/// Addresses, routes, DHCP and VIP operators of one link.
fn addressing(plan: &mut Plan, link: &str, a: &Addressing, layer: ConfigLayer) {
    for address in &a.addresses {
        plan.address(link, *address, layer);
    }
    for r in &a.routes {
        plan.route(static_route(link, r, layer));
    }
    if let Some(dhcp) = a.dhcp() {
        if dhcp.ipv4 {
            plan.dhcp4(link, dhcp.route_metric, ClientIdentifier::None, layer);
        }
        if dhcp.ipv6 {
            plan.operator(OperatorSpecSpec {
                operator: Operator::Dhcp6,
                link_name: link.to_string(),
                require_up: true,
                dhcp6: Dhcp6OperatorSpec {
                    route_metric: dhcp.route_metric,
                    // As upstream: `duidv6` is the client identifier, else the MAC's DUID.
                    client_identifier: if dhcp.duid_v6.is_empty() {
                        ClientIdentifier::Mac
                    } else {
                        ClientIdentifier::Duid
                    },
                    duid_raw_hex: dhcp.duid_v6.clone(),
                    ..Default::default()
                },
                layer,
                ..Default::default()
            });
        }
    }
    if let Some(ip) = a.vip {
        plan.operator(OperatorSpecSpec {
            operator: Operator::Vip,
            link_name: link.to_string(),
            require_up: true,
            vip: VipOperatorSpec {
                ip: Some(ip),
                gratuitous_arp: true,
            },
            layer,
            ..Default::default()
        });
    }
}

fn static_route(link: &str, r: &RouteConf, layer: ConfigLayer) -> RouteSpecSpec {
    RouteSpecSpec {
        family: r.family,
        destination: r.destination,
        source: r.source,
        gateway: r.gateway,
        out_link_name: link.to_string(),
        table: RoutingTable::MAIN,
        priority: r.metric,
        r#type: RouteType::Unicast,
        protocol: RouteProtocol::STATIC,
        layer,
        mtu: r.mtu,
        ..Default::default()
    }
}

fn configure_cmdline(plan: &mut Plan, claims: &mut Claims, inputs: Inputs<'_>) {
    const LAYER: ConfigLayer = ConfigLayer::Cmdline;
    let cmdline = inputs.cmdline;
    for bond in &cmdline.bonds {
        plan.link(bond_link(bond));
        claims.bare_masters.insert(bond.name.clone());
        for (i, slave) in bond.slaves.iter().enumerate() {
            claims.enslaved.insert(slave.clone());
            plan.link(LinkSpecSpec {
                name: slave.clone(),
                up: true,
                bond_slave: BondSlave {
                    master_name: bond.name.clone(),
                    slave_index: u32::try_from(i).unwrap_or(u32::MAX),
                },
                layer: LAYER,
                ..Default::default()
            });
        }
    }
    for vlan in &cmdline.vlans {
        plan.link(LinkSpecSpec {
            name: vlan.link.clone(),
            logical: true,
            up: true,
            kind: KIND_VLAN.into(),
            r#type: LinkType::ETHER,
            parent_name: vlan.parent.clone(),
            vlan: VlanSpec {
                vid: vlan.vid,
                protocol: VlanProtocol::Ieee8021q,
            },
            layer: LAYER,
            ..Default::default()
        });
    }
    for (idx, ip) in cmdline.ips.iter().enumerate() {
        // An empty device means the alphabetically first physical link.
        let device = match &ip.device {
            Some(d) => d.clone(),
            None => match first_physical(inputs.links) {
                Some(d) => d.to_string(),
                None => continue,
            },
        };
        if claims.ignored.contains(&device) {
            continue;
        }
        plan.link(LinkSpecSpec {
            name: device.clone(),
            up: true,
            layer: LAYER,
            ..Default::default()
        });
        claims.addressed.insert(device.clone());
        claims.bare_masters.remove(&device);
        if ip.dhcp {
            plan.dhcp4(&device, DEFAULT_ROUTE_METRIC, ClientIdentifier::None, LAYER);
        }
        if let Some(address) = ip.address {
            plan.address(&device, address, LAYER);
        }
        if let Some(gateway) = ip.gateway {
            let metric = DEFAULT_ROUTE_METRIC + u32::try_from(idx).unwrap_or(0);
            plan.route(RouteSpecSpec {
                family: Family::of(&gateway),
                gateway: Some(gateway),
                out_link_name: device.clone(),
                priority: metric,
                protocol: RouteProtocol::BOOT,
                layer: LAYER,
                ..Default::default()
            });
            // An IPv4 gateway outside the address's prefix is reachable only through an
            // explicit link-scope route (upstream issues #4320, #7020).
            if let (IpAddr::V4(_), Some(address)) = (gateway, ip.address) {
                if !address.contains(&gateway) {
                    plan.route(RouteSpecSpec {
                        family: Family::Inet4,
                        destination: Some(IpNet::from(gateway)),
                        source: Some(address.addr()),
                        out_link_name: device.clone(),
                        priority: metric,
                        protocol: RouteProtocol::BOOT,
                        layer: LAYER,
                        ..Default::default()
                    });
                }
            }
        }
    }
}

/// The alphabetically first physical link (the device of an `ip=` without one).
fn first_physical(links: &[LinkStatus]) -> Option<&str> {
    links
        .iter()
        .filter(|l| l.spec.physical() && l.id() != LOOPBACK)
        .map(LinkStatus::id)
        .min()
}

/// Whether a configured name designates the link: its name, alias or an altname.
fn names(link: &LinkStatus, name: &str) -> bool {
    link.id() == name || link.spec.alias == name || link.spec.alt_names.iter().any(|a| a == name)
}

fn configure_defaults(plan: &mut Plan, claims: &Claims, links: &[LinkStatus]) {
    const LAYER: ConfigLayer = ConfigLayer::Default;
    plan.link(LinkSpecSpec {
        name: LOOPBACK.into(),
        up: true,
        r#type: LinkType::LOOPBACK,
        layer: LAYER,
        ..Default::default()
    });
    for lo in ["127.0.0.1/8", "::1/128"] {
        if let Ok(net) = lo.parse::<IpNet>() {
            plan.address(LOOPBACK, net, LAYER);
        }
    }
    let claimed = |set: &BTreeSet<String>, link: &LinkStatus| set.iter().any(|n| names(link, n));
    for link in links.iter().filter(|l| l.spec.physical()) {
        if claimed(&claims.ignored, link) {
            continue;
        }
        plan.link(LinkSpecSpec {
            name: link.id().to_string(),
            up: true,
            layer: LAYER,
            ..Default::default()
        });
        if !claimed(&claims.enslaved, link) && !claimed(&claims.addressed, link) {
            plan.dhcp4(
                link.id(),
                DEFAULT_ROUTE_METRIC,
                ClientIdentifier::Mac,
                LAYER,
            );
        }
    }
    for master in &claims.bare_masters {
        if !claims.addressed.contains(master) && !claims.ignored.contains(master) {
            plan.dhcp4(master, DEFAULT_ROUTE_METRIC, ClientIdentifier::Mac, LAYER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cosi::Resource;
    use machinery::resources::network::{HardwareAddr, LinkStatusSpec};

    fn phys(name: &str, mac: &str) -> LinkStatus {
        Resource::new_default(
            name,
            LinkStatusSpec {
                r#type: LinkType::ETHER,
                hardware_addr: mac.parse::<HardwareAddr>().expect("mac"),
                ..Default::default()
            },
        )
    }

    fn lo() -> LinkStatus {
        Resource::new_default(
            "lo",
            LinkStatusSpec {
                r#type: LinkType::LOOPBACK,
                ..Default::default()
            },
        )
    }

    fn machine(yaml: &str) -> MachineNetwork {
        MachineNetwork::from_yaml(yaml).expect("valid config")
    }

    fn keys<V>(m: &BTreeMap<String, V>) -> Vec<&str> {
        m.keys().map(String::as_str).collect()
    }

    #[test]
    fn defaults_without_config() {
        let links = [
            lo(),
            phys("eth0", "aa:00:00:00:00:01"),
            phys("eth1", "aa:00:00:00:00:02"),
        ];
        let p = plan(Inputs {
            machine: None,
            cmdline: &CmdlineNetwork::default(),
            links: &links,
        });
        assert_eq!(
            keys(&p.links),
            ["default/eth0", "default/eth1", "default/lo"]
        );
        assert_eq!(
            keys(&p.addresses),
            ["default/lo/127.0.0.1/8", "default/lo/::1/128"]
        );
        assert_eq!(p.addresses["default/lo/127.0.0.1/8"].scope, Scope::Host);
        assert_eq!(
            keys(&p.operators),
            ["default/dhcp4/eth0", "default/dhcp4/eth1"]
        );
        assert_eq!(
            p.operators["default/dhcp4/eth0"].dhcp4.client_identifier,
            ClientIdentifier::Mac
        );
    }

    #[test]
    fn partial_configs_keep_dhcp_where_nothing_else_addresses_a_link() {
        let links = [
            lo(),
            phys("eth0", "aa:00:00:00:00:01"),
            phys("eth1", "aa:00:00:00:00:02"),
            phys("eth2", "aa:00:00:00:00:03"),
            phys("eth3", "aa:00:00:00:00:04"),
            phys("eth4", "aa:00:00:00:00:05"),
        ];
        let m = machine(
            r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth0, addresses: [10.0.0.2/24]}
      - {interface: eth1, mtu: 9000}
      - {interface: eth2, ignore: true}
      - interface: bond0
        bond: {mode: active-backup, interfaces: [eth3, eth4]}
"#,
        );
        let p = plan(Inputs {
            machine: Some(&m),
            cmdline: &CmdlineNetwork::default(),
            links: &links,
        });
        assert_eq!(
            keys(&p.operators),
            ["default/dhcp4/bond0", "default/dhcp4/eth1"],
            "static eth0, ignored eth2 and enslaved eth3/4 get no default DHCP; the MTU-only \
             eth1 and the bare bond keep the node reachable"
        );
        assert_eq!(p.links["configuration/eth1"].mtu, 9000);
        assert_eq!(p.links["configuration/eth4"].bond_slave.slave_index, 1);
        assert!(!p.links.contains_key("default/eth2"));
        assert_eq!(p.links["configuration/bond0"].kind, "bond");
    }

    #[test]
    fn vlans_bridges_dummies_and_selectors() {
        let links = [
            lo(),
            phys("enp1s0", "0c:c4:7a:00:00:01"),
            phys("enp2s0", "0c:c4:7a:00:00:02"),
            phys("eth9", "aa:00:00:00:00:09"),
        ];
        let m = machine(
            r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        bond:
          mode: 802.3ad
          deviceSelectors: [{hardwareAddr: "0c:c4:7a:*"}]
        addresses: [10.0.0.2/24]
        routes: [{network: 0.0.0.0/0, gateway: 10.0.0.1}]
        vlans:
          - {vlanId: 20, addresses: [192.168.20.2/24], mtu: 1400}
      - interface: br0
        bridge: {interfaces: [eth9], stp: {enabled: true}}
        dhcp: true
      - {interface: dummy0, dummy: true, addresses: [169.254.1.1/32]}
"#,
        );
        let p = plan(Inputs {
            machine: Some(&m),
            cmdline: &CmdlineNetwork::default(),
            links: &links,
        });
        assert_eq!(
            p.links["configuration/enp1s0"].bond_slave.master_name,
            "bond0"
        );
        assert_eq!(p.links["configuration/enp2s0"].bond_slave.slave_index, 1);
        let vlan = &p.links["configuration/bond0.20"];
        assert_eq!(
            (
                vlan.kind.as_str(),
                vlan.parent_name.as_str(),
                vlan.vlan.vid,
                vlan.mtu
            ),
            ("vlan", "bond0", 20, 1400)
        );
        assert!(p
            .addresses
            .contains_key("configuration/bond0.20/192.168.20.2/24"));
        assert!(p.routes.contains_key("configuration/inet4/10.0.0.1//1024"));
        assert_eq!(
            p.routes["configuration/inet4/10.0.0.1//1024"].protocol,
            RouteProtocol::STATIC
        );
        assert!(p.links["configuration/br0"].bridge_master.stp.enabled);
        assert_eq!(
            p.links["configuration/eth9"].bridge_slave.master_name,
            "br0"
        );
        assert_eq!(p.links["configuration/dummy0"].kind, "dummy");
        assert_eq!(keys(&p.operators), ["configuration/dhcp4/br0"]);
    }

    #[test]
    fn cmdline_ip_and_off_subnet_gateway() {
        let links = [
            lo(),
            phys("eth0", "aa:00:00:00:00:01"),
            phys("eth1", "aa:00:00:00:00:02"),
        ];
        let cmdline = CmdlineNetwork::parse(
            "ip=10.0.0.5:::255.255.255.255::::8.8.4.4 ip=172.20.0.2::172.20.0.1:24::eth1:dhcp",
        )
        .expect("valid");
        let mut c2 = cmdline.clone();
        c2.ips[0].gateway = Some("10.0.0.1".parse().expect("ip"));
        let p = plan(Inputs {
            machine: None,
            cmdline: &c2,
            links: &links,
        });
        assert!(
            p.addresses.contains_key("cmdline/eth0/10.0.0.5/32"),
            "empty device → first physical link"
        );
        assert!(p.routes.contains_key("cmdline/inet4/10.0.0.1//1024"));
        let onlink = &p.routes["cmdline/inet4//10.0.0.1/32/1024"];
        assert_eq!(
            (onlink.scope, onlink.source),
            (Scope::Link, Some("10.0.0.5".parse().expect("ip")))
        );
        assert!(p.routes.contains_key("cmdline/inet4/172.20.0.1//1025"));
        assert_eq!(keys(&p.operators), ["cmdline/dhcp4/eth1"]);
    }
}
