//! The DHCPv4 operator against a real dnsmasq, in namespaces of the test's own (a veth pair
//! between the node's namespace and the server's): a lease is applied (address, default route,
//! MTU, resolvers, time servers), renewed at T1 without any kernel change, kept across a restart
//! of networkd (renewed, not re-acquired, nothing removed or re-added in the kernel), and
//! released when DHCP is removed from the configuration (dnsmasq forgets the lease).

mod kernel_support;

use std::time::Duration;

use kernel_support::{can_run, wait_for, Dnsmasq, Monitor, Node, CONVERGE, DHCP_SERVER};

const DHCP: &str = r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        dhcp: true
"#;

const NO_DHCP: &str = r#"
version: v1alpha1
machine:
  network:
    hostname: node-dhcp
"#;

const LEASE: &str = "DHCP4Leases.net.talos.dev";

fn dnsmasq_available() -> bool {
    let ok = std::process::Command::new("dnsmasq")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        kernel_support::skip(
            "lease_applied_renewed_kept_across_restart_and_released",
            "dnsmasq is not installed (scripts/install-deps.sh installs it)",
        );
    }
    ok
}

/// The leased address on eth0 (`10.213.0.x/24`), if any.
fn leased(node: &Node) -> Option<String> {
    node.netns
        .addresses("eth0")
        .into_iter()
        .find(|a| a.starts_with("10.213.0."))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_applied_renewed_kept_across_restart_and_released() {
    if !can_run() || !dnsmasq_available() {
        return;
    }
    let mut node = Node::new("dhcp").await;
    let server = Dnsmasq::start(&node, "eth0");
    node.apply_config(DHCP).await;
    node.start_networkd();

    // Applied: address, default route through the server, MTU from option 26.
    let address = wait_for("a lease on eth0", CONVERGE, || leased(&node));
    let ip = address.trim_end_matches("/24").to_string();
    let ns = &node.netns;
    let default = wait_for("the default route", CONVERGE, || ns.route("default"));
    assert_eq!(default["gateway"], DHCP_SERVER);
    assert_eq!(default["dev"], "eth0");
    assert_eq!(default["prefsrc"], ip.as_str());
    wait_for("MTU 1480 from option 26", CONVERGE, || {
        (ns.link("eth0")?["mtu"] == 1480).then_some(())
    });
    assert!(
        server.leases().iter().any(|l| l.contains(&ip)),
        "dnsmasq has the lease: {:?}",
        server.leases()
    );

    // The operator-layer specs, IDs as upstream.
    let prefix = "dhcp4/eth0";
    let resolver = node
        .eventually("the operator's resolvers", CONVERGE, || async {
            node.get(
                "network-config",
                "ResolverSpecs.net.talos.dev",
                &format!("{prefix}/resolvers"),
            )
            .await
        })
        .await;
    assert_eq!(resolver["dnsServers"][0], "10.213.0.53");
    let search = resolver["searchDomains"].to_string();
    assert!(
        search.contains("corp.example") && search.contains("example.org"),
        "{search}"
    );
    let ntp = node
        .get(
            "network-config",
            "TimeServerSpecs.net.talos.dev",
            &format!("{prefix}/timeservers"),
        )
        .await
        .expect("time servers");
    assert_eq!(ntp["timeServers"][0], "10.213.0.123");
    assert!(node
        .get(
            "network-config",
            "AddressSpecs.net.talos.dev",
            &format!("{prefix}/eth0/{address}"),
        )
        .await
        .is_some());

    // Renewed at T1 (10 s): a new ACK for the same address, and no kernel change.
    let first = node
        .get("network", LEASE, prefix)
        .await
        .expect("lease kept in stated");
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(Duration::from_secs(1));
    let renewed = node
        .eventually("a renewal", Duration::from_secs(40), || async {
            node.get("network", LEASE, prefix)
                .await
                .filter(|l| l["acquired"].as_u64() > first["acquired"].as_u64())
        })
        .await;
    assert_eq!(renewed["address"], ip.as_str(), "renewed the same address");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a renewal changed the kernel:\n{}",
        events.join("\n")
    );
    assert!(
        server.log().contains(&format!("DHCPREQUEST(srv0) {ip}")),
        "dnsmasq saw the renewal"
    );

    // A restart of networkd renews the same lease and changes nothing in the kernel.
    let before = node.get("network", LEASE, prefix).await.expect("lease");
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(Duration::from_secs(1));
    node.stop_networkd();
    node.start_networkd();
    let after = node
        .eventually("the restarted networkd to renew", CONVERGE, || async {
            node.get("network", LEASE, prefix)
                .await
                .filter(|l| l["acquired"].as_u64() > before["acquired"].as_u64())
        })
        .await;
    assert_eq!(after["address"], ip.as_str());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a restart changed the kernel:\n{}",
        events.join("\n")
    );
    let log = node.networkd.as_ref().map(|p| p.log()).unwrap_or_default();
    assert!(
        log.contains("DHCP lease renewed"),
        "renewed, not re-acquired"
    );
    assert!(!log.contains("DHCP lease acquired"), "not re-acquired");

    // Without DHCP in the config: RELEASE, dnsmasq forgets the lease, the address goes.
    node.apply_config(NO_DHCP).await;
    wait_for("dnsmasq to drop the lease", CONVERGE, || {
        (!server.leases().iter().any(|l| l.contains(&ip))).then_some(())
    });
    wait_for("the address removed", CONVERGE, || {
        leased(&node).is_none().then_some(())
    });
    let ns = &node.netns;
    wait_for("the default route removed", CONVERGE, || {
        ns.route("default").is_none().then_some(())
    });
    assert!(server.log().contains("DHCPRELEASE(srv0)"));
    node.eventually("the lease gone from stated", CONVERGE, || async {
        node.get("network", LEASE, prefix)
            .await
            .is_none()
            .then_some(())
    })
    .await;
}
