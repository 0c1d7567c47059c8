//! networkd's VIP operator against the real kernel, in network namespaces of the test's own:
//! a shared IP of the configuration is assigned while k8sd's election (`vip/VIPElections`,
//! written here as k8sd would) says this node leads, announced with a gratuitous ARP that a
//! neighbour on the link takes at once, kept unchanged across a restart of networkd, and
//! removed when the election is lost. An election for an IP the configuration does not name
//! assigns nothing.

mod kernel_support;

use std::time::Duration;

use cosi::Resource;
use kernel_support::{can_run, wait_for, Monitor, Netns, Node, CONVERGE};
use machinery::resources::etcd::{VipElectionSpec, VIP_NAMESPACE};

const CONFIG: &str = r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        addresses: [192.0.2.10/24]
        vip: {ip: 192.0.2.100}
"#;

const VIP: &str = "192.0.2.100";
/// What the neighbour cached for the VIP before (a previous holder's MAC).
const OLD_MAC: &str = "02:00:00:00:00:99";

async fn elect(node: &Node, ip: &str, leader: bool) {
    let client = &node.stated.client;
    let spec = VipElectionSpec {
        ip: ip.into(),
        leader,
        holder: if leader {
            "node".into()
        } else {
            "other".into()
        },
        ..Default::default()
    };
    let mut raw = Resource::new(VIP_NAMESPACE, ip, spec)
        .to_raw()
        .expect("encode");
    match client
        .get(
            VIP_NAMESPACE,
            <VipElectionSpec as cosi::ResourceSpec>::TYPE,
            ip,
        )
        .await
    {
        Ok(cur) => {
            raw.metadata.version = cur.metadata.version;
            client.update(&raw, "", None).await.expect("update");
        }
        Err(e) if e.is_not_found() => {
            client.create(&raw, "").await.expect("create");
        }
        Err(e) => panic!("get election: {e}"),
    }
}

fn neighbour_mac(obs: &Netns) -> String {
    obs.ip(&["neigh", "show", VIP, "dev", "eth0p"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_vip_is_assigned_announced_kept_across_restarts_and_released() {
    if !can_run() {
        return;
    }
    let mut node = Node::new("vip").await;
    let obs = Netns::new("vipobs");
    node.netns.ip(&[
        "link", "add", "name", "eth0", "type", "veth", "peer", "name", "eth0p", "netns", &obs.name,
    ]);
    obs.ip(&["link", "set", "eth0p", "up"]);
    obs.ip(&["addr", "add", "192.0.2.1/24", "dev", "eth0p"]);
    obs.ip(&[
        "neigh", "replace", VIP, "lladdr", OLD_MAC, "dev", "eth0p", "nud", "stale",
    ]);
    let mac = node.netns.ip(&["-br", "link", "show", "eth0"]);
    let mac = mac
        .split_whitespace()
        .nth(2)
        .expect("eth0's MAC")
        .to_string();

    node.apply_config(CONFIG).await;
    // An election for an IP the configuration does not name: never assigned.
    elect(&node, "192.0.2.150", true).await;
    node.start_networkd();
    let ns = &node.netns;
    wait_for("eth0 with its static address", CONVERGE, || {
        ns.addresses("eth0")
            .iter()
            .any(|a| a == "192.0.2.10/24")
            .then_some(())
    });
    // No election yet: no VIP (the static address went through the same passes).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !ns.addresses("eth0").iter().any(|a| a.starts_with(VIP)),
        "{:?}",
        ns.addresses("eth0")
    );

    elect(&node, VIP, true).await;
    wait_for("the VIP on eth0", CONVERGE, || {
        ns.addresses("eth0")
            .iter()
            .any(|a| a == "192.0.2.100/32")
            .then_some(())
    });
    let spec = node
        .get(
            "network-config",
            "AddressSpecs.net.talos.dev",
            "vip/eth0/eth0/192.0.2.100/32",
        )
        .await
        .expect("the operator's address spec");
    assert_eq!(spec["announceWithARP"], true, "{spec}");
    assert_eq!(spec["layer"], "operator", "{spec}");
    // The gratuitous ARP: the neighbour's cached MAC is now the node's, without it asking.
    wait_for(
        "the neighbour to learn the VIP's new MAC",
        Duration::from_secs(5),
        || neighbour_mac(&obs).contains(&mac).then_some(()),
    );
    assert!(
        !ns.addresses("eth0")
            .iter()
            .any(|a| a.starts_with("192.0.2.150")),
        "an IP the configuration does not name was assigned: {:?}",
        ns.addresses("eth0")
    );

    // A restart of networkd keeps the VIP: nothing in the kernel changes.
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(Duration::from_secs(2));
    node.stop_networkd();
    node.start_networkd();
    node.eventually("networkd's second run", CONVERGE, || async {
        let log = node.networkd.as_ref().map(|p| p.log()).unwrap_or_default();
        log.contains("networkd started").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a restart changed the kernel:\n{}",
        events.join("\n")
    );

    // The election lost: the VIP goes, the static address stays.
    elect(&node, VIP, false).await;
    let ns = &node.netns;
    wait_for("the VIP removed", CONVERGE, || {
        (!ns.addresses("eth0").iter().any(|a| a.starts_with(VIP))).then_some(())
    });
    assert!(ns.addresses("eth0").iter().any(|a| a == "192.0.2.10/24"));
    node.stop_networkd();
}
