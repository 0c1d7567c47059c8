//! The DHCPv6 operator against a real dnsmasq serving DHCPv4 and DHCPv6 (stateful IA_NA), in
//! namespaces of the test's own (a veth pair between the node's namespace and the server's):
//! the leased address appears on the link as a `/128` after SOLICIT/ADVERTISE/REQUEST/REPLY,
//! the DHCPv6 resolvers and time servers come through next to the DHCPv4 ones (into
//! `/etc/resolv.conf`), a restart of networkd renews the same lease (RENEW, not a new SOLICIT,
//! nothing removed or re-added in the kernel), and turning DHCPv6 off in the configuration
//! releases it (RELEASE: dnsmasq forgets the lease) while the DHCPv4 lease stays.

mod kernel_support;

use std::time::Duration;

use kernel_support::{require, skip, wait_for, Dnsmasq, Monitor, Node, CONVERGE};

const DUAL: &str = r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        dhcpOptions: {ipv4: true, ipv6: true}
"#;

const V4_ONLY: &str = r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        dhcpOptions: {ipv4: true, ipv6: false}
"#;

const LEASE6: &str = "DHCP6Leases.net.talos.dev";
const PREFIX: &str = "dhcp6/eth0";

/// The DHCPv6 address on eth0 (`fd00:213::x/128`), if any.
fn leased6(node: &Node) -> Option<String> {
    node.netns
        .addresses("eth0")
        .into_iter()
        .find(|a| a.starts_with("fd00:213::") && a.ends_with("/128"))
}

/// The DHCPv4 address on eth0, if any.
fn leased4(node: &Node) -> Option<String> {
    node.netns
        .addresses("eth0")
        .into_iter()
        .find(|a| a.starts_with("10.213.0."))
}

fn ipv6_available(test: &str) -> bool {
    let ok = std::path::Path::new("/proc/sys/net/ipv6").exists();
    if !ok {
        skip(test, "the kernel has no IPv6");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dhcpv6_lease_applied_kept_across_restart_and_released() {
    const TEST: &str = "dhcpv6_lease_applied_kept_across_restart_and_released";
    if !require(TEST, &[("dnsmasq", "dnsmasq is not installed")]) || !ipv6_available(TEST) {
        return;
    }
    let mut node = Node::new("dhcp6").await;
    let server = Dnsmasq::start_dual_stack(&node.netns, node.dir.path(), "eth0");
    node.apply_config(DUAL).await;
    node.start_networkd();

    // Applied: the IA_NA address as a /128 on eth0, in the kernel, after the four-message
    // exchange; the DHCPv4 lease next to it.
    let address = wait_for("a DHCPv6 address on eth0", CONVERGE * 2, || leased6(&node));
    let ip6 = address.trim_end_matches("/128").to_string();
    wait_for("a DHCPv4 address on eth0", CONVERGE, || leased4(&node));
    let log = server.log();
    for step in [
        "DHCPSOLICIT(srv0)",
        "DHCPADVERTISE(srv0)",
        "DHCPREQUEST(srv0)",
    ] {
        assert!(log.contains(step), "dnsmasq saw {step}:\n{log}");
    }
    assert!(
        log.contains(&format!("DHCPREPLY(srv0) {ip6}")),
        "dnsmasq replied with {ip6}:\n{log}"
    );
    assert!(
        server.leases().iter().any(|l| l.contains(&ip6)),
        "dnsmasq has the lease: {:?}",
        server.leases()
    );
    let lease = node
        .get("network", LEASE6, PREFIX)
        .await
        .expect("lease kept in stated");
    assert_eq!(lease["address"], ip6.as_str());
    assert_eq!(lease["validLifetime"], 120);
    assert!(node
        .get(
            "network-config",
            "AddressSpecs.net.talos.dev",
            &format!("{PREFIX}/eth0/{address}"),
        )
        .await
        .is_some());

    // Resolvers (options 23 and 24) and time servers (56) at the operator layer, merged with
    // DHCPv4's, and rendered into /etc/resolv.conf.
    let resolver = node
        .eventually("the DHCPv6 operator's resolvers", CONVERGE, || async {
            node.get(
                "network-config",
                "ResolverSpecs.net.talos.dev",
                &format!("{PREFIX}/resolvers"),
            )
            .await
        })
        .await;
    assert_eq!(resolver["dnsServers"][0], "fd00:213::53");
    assert_eq!(resolver["searchDomains"][0], "corp6.example");
    assert_eq!(resolver["layer"], "operator");
    let ntp = node
        .get(
            "network-config",
            "TimeServerSpecs.net.talos.dev",
            &format!("{PREFIX}/timeservers"),
        )
        .await
        .expect("time servers");
    assert_eq!(ntp["timeServers"][0], "fd00:213::123");
    let resolv_conf = node.etc_root().join("etc/resolv.conf");
    let rendered = wait_for("both families in resolv.conf", CONVERGE, || {
        let text = std::fs::read_to_string(&resolv_conf).ok()?;
        (text.contains("nameserver fd00:213::53") && text.contains("nameserver 10.213.0.53"))
            .then_some(text)
    });
    assert!(rendered.contains("corp6.example"), "{rendered}");

    // A restart of networkd renews the same lease (RENEW at once) and changes nothing in the
    // kernel.
    let before = node.get("network", LEASE6, PREFIX).await.expect("lease");
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(Duration::from_secs(2));
    node.stop_networkd();
    node.start_networkd();
    let after = node
        .eventually("the restarted networkd to renew", CONVERGE, || async {
            node.get("network", LEASE6, PREFIX)
                .await
                .filter(|l| l["acquired"].as_u64() > before["acquired"].as_u64())
        })
        .await;
    assert_eq!(after["address"], ip6.as_str(), "the same address");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a restart changed the kernel:\n{}",
        events.join("\n")
    );
    let log = node.networkd.as_ref().map(|p| p.log()).unwrap_or_default();
    assert!(log.contains("DHCPv6 lease renewed"), "renewed:\n{log}");
    assert!(
        !log.contains("DHCPv6 lease acquired"),
        "not re-acquired:\n{log}"
    );
    // dnsmasq logs the client's DUID in a RENEW (colon-separated hex).
    let duid_hex = after["clientId"].as_str().expect("client id").to_string();
    let duid: Vec<&str> = (0..duid_hex.len())
        .step_by(2)
        .filter_map(|i| duid_hex.get(i..i + 2))
        .collect();
    assert!(
        server
            .log()
            .contains(&format!("DHCPRENEW(srv0) {}", duid.join(":"))),
        "dnsmasq saw the RENEW of DUID {duid_hex}:\n{}",
        server.log()
    );
    assert_eq!(leased6(&node).as_deref(), Some(address.as_str()));

    // DHCPv6 off: RELEASE, dnsmasq forgets the lease, the address and the lease resource go;
    // the DHCPv4 lease stays.
    let v4 = leased4(&node).expect("DHCPv4 address");
    node.apply_config(V4_ONLY).await;
    wait_for("dnsmasq to drop the DHCPv6 lease", CONVERGE, || {
        (!server.leases().iter().any(|l| l.contains(&ip6))).then_some(())
    });
    assert!(
        server.log().contains("DHCPRELEASE(srv0)"),
        "{}",
        server.log()
    );
    wait_for("the DHCPv6 address removed", CONVERGE, || {
        leased6(&node).is_none().then_some(())
    });
    node.eventually("the DHCPv6 lease gone from stated", CONVERGE, || async {
        node.get("network", LEASE6, PREFIX)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    node.eventually("the DHCPv6 resolvers gone", CONVERGE, || async {
        node.get(
            "network-config",
            "ResolverSpecs.net.talos.dev",
            &format!("{PREFIX}/resolvers"),
        )
        .await
        .is_none()
        .then_some(())
    })
    .await;
    assert_eq!(leased4(&node), Some(v4), "the DHCPv4 lease stays");
}
