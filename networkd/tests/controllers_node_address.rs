//! NodeAddress, its k8s filters, the default hostname and the network Status, from synthetic
//! AddressStatus/LinkStatus/RouteStatus resources (what the kernel-side controllers write).

mod controllers_support;

use controllers_support::Node;
use ipnet::IpNet;
use machinery::resources::network::{
    AddressStatusSpec, ConfigLayer, Family, HostnameSpecSpec, HostnameStatusSpec, LinkStatusSpec,
    LinkType, NodeAddressFilterSpec, NodeAddressSpec, OperationalState, RouteStatusSpec, Scope,
    StatusSpec, CONFIG_NAMESPACE, NAMESPACE,
};

fn address(link: &str, prefix: &str, scope: Scope) -> AddressStatusSpec {
    let address: IpNet = prefix.parse().expect("prefix");
    AddressStatusSpec {
        address,
        local: Some(address.addr()),
        broadcast: None,
        anycast: None,
        multicast: None,
        link_index: 0,
        link_name: link.into(),
        family: Family::of(&address.addr()),
        scope,
        flags: Default::default(),
        priority: 0,
    }
}

async fn add(node: &Node, link: &str, prefix: &str, scope: Scope) {
    node.put(
        NAMESPACE,
        &format!("{link}/{prefix}"),
        address(link, prefix, scope),
    )
    .await;
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().expect("prefix")).collect()
}

#[tokio::test]
async fn node_addresses_filters_and_status() {
    let node = Node::start().await;
    node.put(
        NAMESPACE,
        "lo",
        LinkStatusSpec {
            r#type: LinkType::LOOPBACK,
            operational_state: OperationalState::Unknown,
            ..Default::default()
        },
    )
    .await;
    node.physical_link("eth0", "52:54:00:00:00:01").await;
    let mut no_carrier = controllers_support::physical("eth1", "52:54:00:00:00:02");
    no_carrier.link_state = false;
    node.put(NAMESPACE, "eth1", no_carrier).await;
    add(&node, "lo", "127.0.0.1/8", Scope::Host).await;
    add(&node, "eth0", "10.0.0.2/24", Scope::Global).await;
    add(&node, "eth0", "fe80::5054:ff:fe00:1/64", Scope::Link).await;
    add(&node, "eth1", "10.1.0.2/24", Scope::Global).await;

    node.expect::<NodeAddressSpec>(NAMESPACE, "current", |n| {
        n.addresses == nets(&["10.0.0.2/24"])
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "default", |n| {
        n.addresses == nets(&["10.0.0.2/24"])
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "routed", |n| {
        n.addresses == nets(&["10.0.0.2/24"])
    })
    .await;
    // The single default address names the node until something better does.
    node.expect::<HostnameSpecSpec>(CONFIG_NAMESPACE, "default/hostname", |h| {
        h.hostname == "talos-10-0-0-2" && h.layer == ConfigLayer::Default
    })
    .await;
    node.expect::<HostnameSpecSpec>(NAMESPACE, "hostname", |h| h.hostname == "talos-10-0-0-2")
        .await;

    node.expect::<StatusSpec>(NAMESPACE, "status", |s| {
        s.address_ready && !s.connectivity_ready && !s.hostname_ready
    })
    .await;
    node.put(
        NAMESPACE,
        "inet4/10.0.0.1//1024",
        RouteStatusSpec {
            family: Family::Inet4,
            gateway: Some("10.0.0.1".parse().expect("ip")),
            out_link_name: "eth0".into(),
            priority: 1024,
            ..Default::default()
        },
    )
    .await;
    node.put(
        NAMESPACE,
        "hostname",
        HostnameStatusSpec {
            hostname: "talos-10-0-0-2".into(),
            domainname: String::new(),
        },
    )
    .await;
    node.expect::<StatusSpec>(NAMESPACE, "status", |s| {
        s.address_ready && s.connectivity_ready && s.hostname_ready && s.etc_files_ready
    })
    .await;

    // The k8s filters come with a machine config.
    node.config(
        r#"
version: v1alpha1
machine:
  features:
    nodeAddressSortAlgorithm: v2
cluster:
  network:
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
"#,
    )
    .await;
    node.expect::<NodeAddressFilterSpec>(NAMESPACE, "no-k8s", |f| {
        f.exclude_subnets == nets(&["10.244.0.0/16", "10.96.0.0/12"])
            && f.include_subnets.is_empty()
    })
    .await;
    node.expect::<NodeAddressFilterSpec>(NAMESPACE, "only-k8s", |f| f.include_subnets.len() == 2)
        .await;
    add(&node, "eth0", "10.244.3.1/24", Scope::Global).await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "current", |n| {
        n.addresses == nets(&["10.0.0.2/24", "10.244.3.1/24"]) && n.sort_algorithm.as_str() == "v2"
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "routed-no-k8s", |n| {
        n.addresses == nets(&["10.0.0.2/24"])
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "current-only-k8s", |n| {
        n.addresses == nets(&["10.244.3.1/24"])
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "accumulative-no-k8s", |n| {
        n.addresses == nets(&["10.0.0.2/24"])
    })
    .await;

    // The default is sticky while its address lives; accumulative never shrinks.
    add(&node, "eth0", "10.0.0.1/24", Scope::Global).await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "current", |n| n.addresses.len() == 3)
        .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "default", |n| {
        n.addresses == nets(&["10.0.0.2/24"])
    })
    .await;
    node.remove::<AddressStatusSpec>(NAMESPACE, "eth0/10.0.0.2/24")
        .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "default", |n| {
        n.addresses == nets(&["10.0.0.1/24"])
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "accumulative", |n| {
        n.addresses == nets(&["10.0.0.1/24", "10.0.0.2/24", "10.244.3.1/24"])
    })
    .await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "current", |n| {
        n.addresses == nets(&["10.0.0.1/24", "10.244.3.1/24"])
    })
    .await;

    // Carrier on eth1 brings its address in.
    node.physical_link("eth1", "52:54:00:00:00:02").await;
    node.expect::<NodeAddressSpec>(NAMESPACE, "current", |n| n.addresses.len() == 3)
        .await;
}
