//! Logical links against the real kernel, in a namespace of the test's own: a bridge is created
//! with its member, its settings change in place, a restart changes nothing, and it is removed
//! with its spec; a bridge networkd did not create is configured but never deleted; VLANs and
//! bonds are created and removed where the kernel has them (the test says when it lacks one).

mod kernel_support;

use kernel_support::{can_run, wait_for, Monitor, Netns, Node, CONVERGE};
use serde_json::Value;

fn bridge_config(stp: bool) -> String {
    format!(
        r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: br0
        bridge:
          interfaces: [eth1]
          stp:
            enabled: {stp}
        addresses: [192.0.2.1/24]
      - interface: brf
        bridge:
          interfaces: []
        mtu: 1300
"#
    )
}

const EMPTY: &str = r#"
version: v1alpha1
machine:
  network:
    hostname: node-links
"#;

fn flags(link: &Value) -> Vec<String> {
    link["flags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

fn master(netns: &Netns, dev: &str) -> Option<String> {
    netns.link(dev)?["master"].as_str().map(str::to_string)
}

/// Whether the kernel can create links of `kind` (this machine's kernel may lack modules).
fn kernel_has(netns: &Netns, args: &[&str]) -> bool {
    let mut all = vec!["-n", netns.name.as_str(), "link", "add"];
    all.extend_from_slice(args);
    let ok = std::process::Command::new("ip")
        .args(&all)
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        netns.ip(&["link", "del", "probe0"]);
    }
    ok
}

fn veth(netns: &Netns, name: &str) {
    let peer = format!("{name}p");
    netns.ip(&[
        "link", "add", "name", name, "type", "veth", "peer", "name", &peer,
    ]);
    netns.ip(&["link", "set", &peer, "up"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_created_changed_and_removed() {
    if !can_run() {
        return;
    }
    let mut node = Node::new("bridge").await;
    veth(&node.netns, "eth1");
    // A bridge networkd did not create, that the config names.
    node.netns
        .ip(&["link", "add", "name", "brf", "type", "bridge"]);

    node.apply_config(&bridge_config(false)).await;
    node.start_networkd();
    let ns = &node.netns;
    let br0 = wait_for("br0 up with eth1 and its address", CONVERGE, || {
        let br = ns.link("br0")?;
        (flags(&br).iter().any(|f| f == "UP")
            && master(ns, "eth1").as_deref() == Some("br0")
            && ns.addresses("br0").iter().any(|a| a == "192.0.2.1/24"))
        .then_some(br)
    });
    assert_eq!(br0["linkinfo"]["info_kind"], "bridge");
    assert_eq!(br0["linkinfo"]["info_data"]["stp_state"], 0);
    assert!(
        br0["altnames"]
            .as_array()
            .is_some_and(|a| a.iter().any(|n| n == "talos-rs-br0")),
        "marked as networkd's: {br0}"
    );
    wait_for("brf configured (MTU)", CONVERGE, || {
        (ns.link("brf")?["mtu"] == 1300).then_some(())
    });

    // A restart changes nothing (before STP is on: its port state changes are events).
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(std::time::Duration::from_secs(2));
    node.stop_networkd();
    node.start_networkd();
    node.eventually("LinkStatus of br0 from the new run", CONVERGE, || async {
        node.get("network", "LinkStatuses.net.talos.dev", "br0")
            .await
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a restart changed the kernel:\n{}",
        events.join("\n")
    );

    // A settings change is applied in place (down, members released, set; they come back).
    node.apply_config(&bridge_config(true)).await;
    let ns = &node.netns;
    wait_for("STP on, eth1 enslaved again, br0 up", CONVERGE, || {
        let br = ns.link("br0")?;
        (br["linkinfo"]["info_data"]["stp_state"] != 0
            && flags(&br).iter().any(|f| f == "UP")
            && master(ns, "eth1").as_deref() == Some("br0"))
        .then_some(())
    });

    // Without its spec the bridge networkd created goes; the foreign one stays.
    node.apply_config(EMPTY).await;
    let ns = &node.netns;
    wait_for("br0 deleted, eth1 released", CONVERGE, || {
        (ns.link("br0").is_none() && master(ns, "eth1").is_none()).then_some(())
    });
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(
        node.netns.link("brf").is_some(),
        "a foreign bridge is never deleted"
    );
    node.eventually("LinkSpecs gone", CONVERGE, || async {
        let ids = node.ids("network", "LinkSpecs.net.talos.dev").await;
        (!ids.iter().any(|i| i == "br0" || i == "brf")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kernel with 8021q and bonding (this host has neither); the same links converge in a VM node in tests/tests/vm.rs"]
async fn vlan_created_and_removed() {
    if !can_run() {
        return;
    }
    let mut node = Node::new("vlan").await;
    veth(&node.netns, "eth2");
    if !kernel_has(
        &node.netns,
        &["link", "eth2", "name", "probe0", "type", "vlan", "id", "5"],
    ) {
        kernel_support::skip(
            "vlan_created_and_removed",
            "this kernel has no VLAN (8021q) support",
        );
        return;
    }
    node.apply_config(
        r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth2
        vlans:
          - vlanId: 10
            addresses: [192.0.2.10/24]
"#,
    )
    .await;
    node.start_networkd();
    let ns = &node.netns;
    let vlan = wait_for("eth2.10 with its address", CONVERGE, || {
        let l = ns.link("eth2.10")?;
        ns.addresses("eth2.10")
            .iter()
            .any(|a| a == "192.0.2.10/24")
            .then_some(l)
    });
    assert_eq!(vlan["linkinfo"]["info_kind"], "vlan");
    assert_eq!(vlan["linkinfo"]["info_data"]["id"], 10);
    node.apply_config(EMPTY).await;
    let ns = &node.netns;
    wait_for("eth2.10 deleted", CONVERGE, || {
        ns.link("eth2.10").is_none().then_some(())
    });
    assert!(node.netns.link("eth2").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kernel with 8021q and bonding (this host has neither); the same links converge in a VM node in tests/tests/vm.rs"]
async fn bond_created_and_removed() {
    if !can_run() {
        return;
    }
    let mut node = Node::new("bond").await;
    veth(&node.netns, "eth3");
    veth(&node.netns, "eth4");
    if !kernel_has(&node.netns, &["name", "probe0", "type", "bond"]) {
        kernel_support::skip(
            "bond_created_and_removed",
            "this kernel has no bonding support",
        );
        return;
    }
    node.apply_config(
        r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        bond:
          mode: active-backup
          miimon: 100
          interfaces: [eth3, eth4]
        addresses: [192.0.2.20/24]
"#,
    )
    .await;
    node.start_networkd();
    let ns = &node.netns;
    let bond = wait_for("bond0 with both members", CONVERGE, || {
        let b = ns.link("bond0")?;
        (master(ns, "eth3").as_deref() == Some("bond0")
            && master(ns, "eth4").as_deref() == Some("bond0"))
        .then_some(b)
    });
    assert_eq!(bond["linkinfo"]["info_kind"], "bond");
    assert_eq!(bond["linkinfo"]["info_data"]["mode"], "active-backup");

    // A restart does not re-apply the bond settings (no down/up, no release of members).
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(std::time::Duration::from_secs(2));
    node.stop_networkd();
    node.start_networkd();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a restart changed the kernel:\n{}",
        events.join("\n")
    );

    node.apply_config(EMPTY).await;
    let ns = &node.netns;
    wait_for("bond0 deleted", CONVERGE, || {
        ns.link("bond0").is_none().then_some(())
    });
}
