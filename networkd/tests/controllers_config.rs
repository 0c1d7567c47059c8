//! The Config and Merge families against a real stated and the real runtime: machine config,
//! kernel command line and defaults become per-layer candidates in `network-config` and merged
//! specs in `network`, with upstream's IDs and precedence.

mod controllers_support;

use std::collections::BTreeMap;

use controllers_support::{settle, Node};
use cosi::ResourceSpec;
use machinery::resources::network::{
    AddressFlags, AddressSpecSpec, ConfigLayer, Family, HostnameSpecSpec, LinkSpecSpec,
    LinkStatusSpec, LinkType, OperatorSpecSpec, ResolverSpecSpec, ResolverStatusSpec,
    RouteSpecSpec, Scope, TimeServerSpecSpec, TimeServerStatusSpec, CONFIG_NAMESPACE, NAMESPACE,
};

const STATIC: &str = r#"
version: v1alpha1
machine:
  type: worker
  network:
    hostname: node-1.example.com
    nameservers: [10.0.0.53]
    searchDomains: [corp.example]
    interfaces:
      - interface: eth0
        addresses: [10.0.0.2/24]
        routes:
          - {network: 0.0.0.0/0, gateway: 10.0.0.1}
          - {network: 192.168.0.0/16, gateway: 10.0.0.254, metric: 100}
        mtu: 9000
  time:
    servers: [pool.ntp.org]
"#;

async fn node_with_links() -> Node {
    let node = Node::start().await;
    node.put(
        NAMESPACE,
        "lo",
        LinkStatusSpec {
            r#type: LinkType::LOOPBACK,
            ..Default::default()
        },
    )
    .await;
    node.physical_link("eth0", "52:54:00:00:00:01").await;
    node.physical_link("eth1", "52:54:00:00:00:02").await;
    node
}

#[tokio::test]
async fn static_config_becomes_merged_specs_with_upstream_ids() {
    let node = node_with_links().await;
    node.config(STATIC).await;

    node.expect_ids::<AddressSpecSpec>(
        CONFIG_NAMESPACE,
        &[
            "configuration/eth0/10.0.0.2/24",
            "default/lo/127.0.0.1/8",
            "default/lo/::1/128",
        ],
    )
    .await;
    node.expect_ids::<AddressSpecSpec>(
        NAMESPACE,
        &["eth0/10.0.0.2/24", "lo/127.0.0.1/8", "lo/::1/128"],
    )
    .await;
    let a = node
        .expect::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.2/24", |_| true)
        .await;
    assert_eq!(a.spec.family, Family::Inet4);
    assert_eq!(a.spec.scope, Scope::Global);
    assert_eq!(a.spec.flags, AddressFlags::PERMANENT);
    assert_eq!(a.spec.layer, ConfigLayer::Configuration);
    let lo = node
        .expect::<AddressSpecSpec>(NAMESPACE, "lo/127.0.0.1/8", |_| true)
        .await;
    assert_eq!(
        (lo.spec.scope, lo.spec.layer),
        (Scope::Host, ConfigLayer::Default)
    );

    node.expect_ids::<RouteSpecSpec>(
        NAMESPACE,
        &[
            "inet4/10.0.0.1//1024",
            "inet4/10.0.0.254/192.168.0.0/16/100",
        ],
    )
    .await;
    let r = node
        .expect::<RouteSpecSpec>(NAMESPACE, "inet4/10.0.0.254/192.168.0.0/16/100", |_| true)
        .await;
    assert_eq!(r.spec.out_link_name, "eth0");
    assert_eq!(r.spec.scope, Scope::Global);

    node.expect_ids::<LinkSpecSpec>(NAMESPACE, &["eth0", "eth1", "lo"])
        .await;
    let eth0 = node
        .expect::<LinkSpecSpec>(NAMESPACE, "eth0", |s| s.layer == ConfigLayer::Configuration)
        .await;
    assert!(eth0.spec.up);
    assert_eq!(eth0.spec.mtu, 9000);
    assert_eq!(eth0.spec.layer, ConfigLayer::Configuration);
    assert!(!eth0.spec.logical);
    let lo = node.expect::<LinkSpecSpec>(NAMESPACE, "lo", |_| true).await;
    assert!(lo.spec.up);

    node.expect::<HostnameSpecSpec>(NAMESPACE, "hostname", |h| {
        h.hostname == "node-1"
            && h.domainname == "example.com"
            && h.layer == ConfigLayer::Configuration
    })
    .await;
    node.expect::<ResolverSpecSpec>(NAMESPACE, "resolvers", |r| {
        r.dns_servers == ["10.0.0.53".parse::<std::net::IpAddr>().expect("ip")]
            && r.search_domains == ["corp.example"]
    })
    .await;
    node.expect::<ResolverStatusSpec>(NAMESPACE, "resolvers", |r| r.dns_servers.len() == 1)
        .await;
    node.expect::<TimeServerSpecSpec>(NAMESPACE, "timeservers", |t| {
        t.ntp_servers == ["pool.ntp.org"]
    })
    .await;
    node.expect::<TimeServerStatusSpec>(NAMESPACE, "timeservers", |t| {
        t.ntp_servers == ["pool.ntp.org"]
    })
    .await;
    // eth0 is static: only the unconfigured eth1 gets default DHCP.
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth1"])
        .await;
    node.expect_ids::<OperatorSpecSpec>(CONFIG_NAMESPACE, &["default/dhcp4/eth1"])
        .await;
}

#[tokio::test]
async fn static_address_beats_an_operator_candidate_of_the_same_address() {
    let node = node_with_links().await;
    node.config(STATIC).await;
    node.expect::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.2/24", |_| true)
        .await;

    // What a DHCP operator on eth0 writes: its own address and, by chance, the static one.
    let dhcp = |addr: &str| AddressSpecSpec {
        address: addr.parse().expect("prefix"),
        link_name: "eth0".into(),
        family: Family::Inet4,
        scope: Scope::Global,
        flags: AddressFlags::PERMANENT,
        announce_with_arp: false,
        priority: 1024,
        layer: ConfigLayer::Operator,
    };
    node.put(
        CONFIG_NAMESPACE,
        "dhcp4/eth0/eth0/10.0.0.2/24",
        dhcp("10.0.0.2/24"),
    )
    .await;
    node.put(
        CONFIG_NAMESPACE,
        "dhcp4/eth0/eth0/10.0.0.99/24",
        dhcp("10.0.0.99/24"),
    )
    .await;

    node.expect::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.99/24", |a| {
        a.layer == ConfigLayer::Operator
    })
    .await;
    let merged = settle(|| async {
        node.get::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.2/24")
            .await
            .map(|a| (a.spec.layer, a.spec.priority))
    })
    .await;
    assert_eq!(
        merged,
        Some((ConfigLayer::Configuration, 0)),
        "configuration wins by layer"
    );

    // Without the static address, the operator's candidate takes over.
    node.config(&STATIC.replace("addresses: [10.0.0.2/24]", "addresses: [10.0.0.3/24]"))
        .await;
    node.expect::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.2/24", |a| {
        a.layer == ConfigLayer::Operator && a.priority == 1024
    })
    .await;
    node.expect::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.3/24", |_| true)
        .await;
}

#[tokio::test]
async fn cmdline_specs_lose_to_configuration() {
    let node = node_with_links().await;
    node.cmdline("console=ttyS0 ip=10.0.0.5::10.0.0.1:24:ip-host:eth0::10.0.0.53 talos.hostname=cmd-host.example.org")
        .await;

    node.expect::<AddressSpecSpec>(CONFIG_NAMESPACE, "cmdline/eth0/10.0.0.5/24", |a| {
        a.layer == ConfigLayer::Cmdline
    })
    .await;
    node.expect::<RouteSpecSpec>(CONFIG_NAMESPACE, "cmdline/inet4/10.0.0.1//1024", |_| true)
        .await;
    node.expect::<HostnameSpecSpec>(CONFIG_NAMESPACE, "cmdline/hostname", |h| {
        h.hostname == "cmd-host"
    })
    .await;
    node.expect::<HostnameSpecSpec>(NAMESPACE, "hostname", |h| {
        h.hostname == "cmd-host" && h.domainname == "example.org" && h.layer == ConfigLayer::Cmdline
    })
    .await;
    node.expect::<ResolverSpecSpec>(NAMESPACE, "resolvers", |r| {
        r.layer == ConfigLayer::Cmdline && r.dns_servers.len() == 1
    })
    .await;
    // eth0 is configured by ip=: no default DHCP there.
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth1"])
        .await;

    node.config(
        r#"
version: v1alpha1
machine:
  network:
    hostname: cfg-host
    nameservers: [9.9.9.9]
"#,
    )
    .await;
    node.expect::<HostnameSpecSpec>(NAMESPACE, "hostname", |h| {
        h.hostname == "cfg-host" && h.domainname.is_empty() && h.layer == ConfigLayer::Configuration
    })
    .await;
    node.expect::<ResolverSpecSpec>(NAMESPACE, "resolvers", |r| {
        r.layer == ConfigLayer::Configuration
            && r.dns_servers == ["9.9.9.9".parse::<std::net::IpAddr>().expect("ip")]
    })
    .await;
    assert!(
        node.get::<HostnameSpecSpec>(CONFIG_NAMESPACE, "cmdline/hostname")
            .await
            .is_some(),
        "the cmdline candidate stays, it only loses the merge"
    );
    assert!(node
        .get::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.5/24")
        .await
        .is_some());
}

#[tokio::test]
async fn defaults_dhcp_only_on_unconfigured_physical_links() {
    let node = node_with_links().await;
    node.put(
        NAMESPACE,
        "veth0",
        LinkStatusSpec {
            r#type: LinkType::ETHER,
            kind: "veth".into(),
            ..Default::default()
        },
    )
    .await;
    node.put(
        NAMESPACE,
        "wg0",
        LinkStatusSpec {
            r#type: LinkType::NONE,
            kind: "wireguard".into(),
            ..Default::default()
        },
    )
    .await;

    // No machine config at all: DHCP on every physical link, loopback up with its addresses.
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth0", "dhcp4/eth1"])
        .await;
    let op = node
        .expect::<OperatorSpecSpec>(NAMESPACE, "dhcp4/eth0", |_| true)
        .await;
    assert_eq!(op.spec.layer, ConfigLayer::Default);
    assert!(op.spec.require_up);
    assert_eq!(op.spec.dhcp4.route_metric, 1024);
    node.expect_ids::<LinkSpecSpec>(NAMESPACE, &["eth0", "eth1", "lo"])
        .await;
    node.expect_ids::<AddressSpecSpec>(NAMESPACE, &["lo/127.0.0.1/8", "lo/::1/128"])
        .await;

    // A link configured statically gets no default DHCP; the other keeps it.
    node.config(STATIC).await;
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth1"])
        .await;

    // An MTU-only entry does not take the link's address away.
    node.config(
        r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth0, mtu: 1400}
      - {interface: eth1, dhcp: true, dhcpOptions: {routeMetric: 2048}}
"#,
    )
    .await;
    node.expect_ids::<OperatorSpecSpec>(
        CONFIG_NAMESPACE,
        &["configuration/dhcp4/eth1", "default/dhcp4/eth0"],
    )
    .await;
    node.expect::<OperatorSpecSpec>(NAMESPACE, "dhcp4/eth1", |o| {
        o.layer == ConfigLayer::Configuration && o.dhcp4.route_metric == 2048
    })
    .await;
    node.expect::<LinkSpecSpec>(NAMESPACE, "eth0", |l| l.mtu == 1400 && l.up)
        .await;

    // A new physical link appears later: it gets DHCP too.
    node.physical_link("eth2", "52:54:00:00:00:03").await;
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth0", "dhcp4/eth1", "dhcp4/eth2"])
        .await;
}

#[tokio::test]
async fn vlan_bond_bridge_and_dummy_link_specs() {
    let node = node_with_links().await;
    node.physical_link("eth2", "0c:c4:7a:00:00:02").await;
    node.physical_link("eth3", "0c:c4:7a:00:00:03").await;
    node.physical_link("eth4", "52:54:00:00:00:04").await;
    node.config(
        r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        bond:
          mode: 802.3ad
          lacpRate: fast
          miimon: 100
          deviceSelectors: [{hardwareAddr: "0c:c4:7a:*"}]
        addresses: [10.0.0.11/24]
        vlans:
          - {vlanId: 20, addresses: [192.168.20.11/24], mtu: 1500}
      - interface: br0
        bridge: {interfaces: [eth4], stp: {enabled: true}}
        dhcp: true
      - {interface: dummy0, dummy: true, addresses: [169.254.10.1/32]}
"#,
    )
    .await;

    let bond = node
        .expect::<LinkSpecSpec>(NAMESPACE, "bond0", |_| true)
        .await
        .spec;
    assert!(bond.logical && bond.up);
    assert_eq!(bond.kind, "bond");
    assert_eq!(bond.bond_master.mode.as_str(), "802.3ad");
    assert_eq!(bond.bond_master.lacp_rate.as_str(), "fast");
    assert_eq!(bond.bond_master.miimon, 100);
    assert_eq!(
        bond.bond_master.ad_actor_sys_prio, 65535,
        "kernel defaults filled in"
    );
    for (i, member) in ["eth2", "eth3"].iter().enumerate() {
        // The merged spec may pass through a state before the configuration layer wins.
        let m = node
            .expect::<LinkSpecSpec>(NAMESPACE, member, |s| s.bond_slave.master_name == "bond0")
            .await
            .spec;
        assert_eq!(m.bond_slave.master_name, "bond0");
        assert_eq!(m.bond_slave.slave_index, u32::try_from(i).expect("small"));
    }
    let vlan = node
        .expect::<LinkSpecSpec>(NAMESPACE, "bond0.20", |_| true)
        .await
        .spec;
    assert_eq!(
        (
            vlan.kind.as_str(),
            vlan.parent_name.as_str(),
            vlan.vlan.vid,
            vlan.mtu
        ),
        ("vlan", "bond0", 20, 1500)
    );
    assert!(vlan.logical);
    node.expect::<AddressSpecSpec>(NAMESPACE, "bond0.20/192.168.20.11/24", |_| true)
        .await;

    let br = node
        .expect::<LinkSpecSpec>(NAMESPACE, "br0", |_| true)
        .await
        .spec;
    assert_eq!(br.kind, "bridge");
    assert!(br.bridge_master.stp.enabled);
    let port = node
        .expect::<LinkSpecSpec>(NAMESPACE, "eth4", |s| s.bridge_slave.master_name == "br0")
        .await
        .spec;
    assert_eq!(port.bridge_slave.master_name, "br0");
    let dummy = node
        .expect::<LinkSpecSpec>(NAMESPACE, "dummy0", |_| true)
        .await
        .spec;
    assert_eq!(dummy.kind, "dummy");

    // Bond members lost default DHCP; eth0/eth1 keep it; the bridge runs the configured one.
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/br0", "dhcp4/eth0", "dhcp4/eth1"])
        .await;

    // Removing the VLAN and the bridge removes their specs, and only those.
    node.config(
        r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        bond:
          mode: 802.3ad
          lacpRate: fast
          miimon: 100
          deviceSelectors: [{hardwareAddr: "0c:c4:7a:*"}]
        addresses: [10.0.0.11/24]
      - {interface: dummy0, dummy: true, addresses: [169.254.10.1/32]}
"#,
    )
    .await;
    node.expect_ids::<LinkSpecSpec>(
        NAMESPACE,
        &[
            "bond0", "dummy0", "eth0", "eth1", "eth2", "eth3", "eth4", "lo",
        ],
    )
    .await;
    let port = node
        .expect::<LinkSpecSpec>(NAMESPACE, "eth4", |l| l.bridge_slave.master_name.is_empty())
        .await;
    assert_eq!(port.spec.layer, ConfigLayer::Default);
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth0", "dhcp4/eth1", "dhcp4/eth4"])
        .await;
}

/// Every network spec in both namespaces: (namespace, type, id) → version.
async fn snapshot(node: &Node) -> BTreeMap<(String, String, String), u64> {
    let mut out = BTreeMap::new();
    for ns in [CONFIG_NAMESPACE, NAMESPACE] {
        for ty in [
            AddressSpecSpec::TYPE,
            RouteSpecSpec::TYPE,
            LinkSpecSpec::TYPE,
            OperatorSpecSpec::TYPE,
            HostnameSpecSpec::TYPE,
            ResolverSpecSpec::TYPE,
            TimeServerSpecSpec::TYPE,
        ] {
            for r in node
                .client
                .list(ns, ty, &cosi::Query::default())
                .await
                .expect("list")
            {
                out.insert(
                    (ns.to_string(), ty.to_string(), r.metadata.id.clone()),
                    r.metadata.version,
                );
            }
        }
    }
    out
}

#[tokio::test]
async fn a_config_change_removes_exactly_what_is_no_longer_wanted() {
    let node = node_with_links().await;
    node.config(STATIC).await;
    node.expect_ids::<RouteSpecSpec>(
        NAMESPACE,
        &[
            "inet4/10.0.0.1//1024",
            "inet4/10.0.0.254/192.168.0.0/16/100",
        ],
    )
    .await;
    let before = settle(|| snapshot(&node)).await;

    let changed = STATIC.replace(
        "          - {network: 192.168.0.0/16, gateway: 10.0.0.254, metric: 100}\n",
        "",
    );
    assert_ne!(changed, STATIC);
    node.config(&changed).await;
    node.expect_gone::<RouteSpecSpec>(NAMESPACE, "inet4/10.0.0.254/192.168.0.0/16/100")
        .await;
    let after = settle(|| snapshot(&node)).await;

    let mut expected = before.clone();
    for ns in [CONFIG_NAMESPACE, NAMESPACE] {
        let id = if ns == NAMESPACE {
            "inet4/10.0.0.254/192.168.0.0/16/100".to_string()
        } else {
            "configuration/inet4/10.0.0.254/192.168.0.0/16/100".to_string()
        };
        assert!(
            expected
                .remove(&(ns.to_string(), RouteSpecSpec::TYPE.to_string(), id))
                .is_some(),
            "the removed route was there before"
        );
    }
    assert_eq!(after, expected, "nothing else was written or removed");
}

#[tokio::test]
async fn an_invalid_config_changes_nothing_even_across_a_restart() {
    let mut node = node_with_links().await;
    node.config(STATIC).await;
    node.expect_ids::<OperatorSpecSpec>(NAMESPACE, &["dhcp4/eth1"])
        .await;
    let before = settle(|| snapshot(&node)).await;

    // Valid YAML, invalid network values: the good route and the bad address are not applied
    // either.
    let bad_values = STATIC
        .replace("addresses: [10.0.0.2/24]", "addresses: [10.0.0.2/24, 10.0.0.300/24]")
        .replace("gateway: 10.0.0.254, metric: 100}", "gateway: 10.0.0.254, metric: 100}\n          - {network: 172.16.0.0/12, gateway: 10.0.0.9}");
    node.config(&bad_values).await;
    assert_eq!(settle(|| snapshot(&node)).await, before);

    // Undecodable YAML.
    node.config("version: v1alpha1\nmachine: [unclosed").await;
    assert_eq!(settle(|| snapshot(&node)).await, before);

    // A restart with the invalid configuration in place keeps the specs as they are.
    node.stop_controllers().await;
    node.start_controllers();
    assert_eq!(settle(|| snapshot(&node)).await, before);

    // A valid configuration applies again.
    node.config(&STATIC.replace("10.0.0.2/24", "10.0.0.7/24"))
        .await;
    node.expect::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.7/24", |_| true)
        .await;
    node.expect_gone::<AddressSpecSpec>(NAMESPACE, "eth0/10.0.0.2/24")
        .await;
}

#[test]
fn the_registry_has_every_controller_under_its_upstream_name() {
    let registry = networkd::controllers::registry().expect("no registration conflict");
    let names: Vec<&str> = registry.names().collect();
    for want in [
        "network.LinkConfigController",
        "network.AddressConfigController",
        "network.RouteConfigController",
        "network.OperatorConfigController",
        "network.HostnameConfigController",
        "network.ResolverConfigController",
        "network.TimeServerConfigController",
        "network.AddressMergeController",
        "network.LinkMergeController",
        "network.RouteMergeController",
        "network.OperatorMergeController",
        "network.HostnameMergeController",
        "network.ResolverMergeController",
        "network.TimeServerMergeController",
        "network.ResolverSpecController",
        "network.TimeServerSpecController",
        "network.NodeAddressController",
        "k8s.AddressFilterController",
        "network.StatusController",
        "network.EtcFileController",
        "files.EtcFileController",
    ] {
        assert!(names.contains(&want), "{want} registered in {names:?}");
    }
}
