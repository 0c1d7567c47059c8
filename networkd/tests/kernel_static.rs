//! networkd against the real kernel, in a network namespace of the test's own: a static
//! configuration is applied to an existing link (MTU, up, addresses, routes; the hostname is
//! merged, set by hand as init would, and reported), statuses report the kernel,
//! an address deleted behind networkd's back comes back, a link set down comes back up, a
//! configuration change removes exactly what is no longer wanted and nothing else, and a
//! restart of networkd changes nothing in the kernel.

mod kernel_support;

use kernel_support::{can_run, run, wait_for, Monitor, Node, CONVERGE};

const STATIC: &str = r#"
version: v1alpha1
machine:
  network:
    hostname: node-static
    interfaces:
      - interface: eth0
        mtu: 1400
        addresses: [192.0.2.10/24, 192.0.2.11/24]
        routes:
          - network: 198.51.100.0/24
            gateway: 192.0.2.1
            metric: 100
          - network: 203.0.113.0/24
            gateway: 192.0.2.1
"#;

/// The same, without the second address and the second route.
const SMALLER: &str = r#"
version: v1alpha1
machine:
  network:
    hostname: node-static
    interfaces:
      - interface: eth0
        mtu: 1400
        addresses: [192.0.2.10/24]
        routes:
          - network: 198.51.100.0/24
            gateway: 192.0.2.1
            metric: 100
"#;

fn has(list: &[String], item: &str) -> bool {
    list.iter().any(|a| a == item)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_config_converges_and_survives_restarts() {
    if !can_run() {
        return;
    }
    let mut node = Node::new("static").await;
    // The node's link (a veth: this kernel may lack dummy), with a peer up for a carrier.
    node.netns.ip(&[
        "link", "add", "name", "eth0", "type", "veth", "peer", "name", "eth0p",
    ]);
    node.netns.ip(&["link", "set", "eth0p", "up"]);
    // Something networkd did not create, that it must never touch.
    node.netns.ip(&[
        "link",
        "add",
        "name",
        "foreign0",
        "type",
        "veth",
        "peer",
        "name",
        "foreign0p",
    ]);
    node.netns
        .ip(&["addr", "add", "198.18.0.1/24", "dev", "foreign0"]);
    node.netns.ip(&["link", "set", "foreign0", "up"]);

    node.apply_config(STATIC).await;
    node.start_networkd();

    // Link, MTU, addresses, routes: the kernel's view.
    let ns = &node.netns;
    wait_for("eth0 with both addresses", CONVERGE, || {
        let a = ns.addresses("eth0");
        (has(&a, "192.0.2.10/24") && has(&a, "192.0.2.11/24")).then_some(())
    });
    // The MTU (the link spec) and the addresses (the address specs) are applied by different
    // controllers: neither waits for the other.
    let link = wait_for("eth0 with MTU 1400", CONVERGE, || {
        ns.link("eth0").filter(|l| l["mtu"] == 1400)
    });
    assert!(
        link["flags"]
            .as_array()
            .expect("flags")
            .iter()
            .any(|f| f == "UP"),
        "eth0 is up: {link}"
    );
    wait_for("both routes", CONVERGE, || {
        let a = ns.route("198.51.100.0/24")?;
        let b = ns.route("203.0.113.0/24")?;
        Some((a, b))
    });
    let r = ns.route("198.51.100.0/24").expect("route");
    assert_eq!(r["gateway"], "192.0.2.1");
    assert_eq!(r["metric"], 100);
    assert_eq!(r["dev"], "eth0");
    assert_eq!(r["protocol"], "84", "marked as networkd's: {r}");

    // Statuses report the kernel.
    node.eventually("AddressStatus of 192.0.2.10/24", CONVERGE, || async {
        node.get(
            "network",
            "AddressStatuses.net.talos.dev",
            "eth0/192.0.2.10/24",
        )
        .await
    })
    .await;
    let link_status = node
        .eventually("LinkStatus of eth0 with MTU 1400", CONVERGE, || async {
            node.get("network", "LinkStatuses.net.talos.dev", "eth0")
                .await
                .filter(|l| l["mtu"] == 1400)
        })
        .await;
    assert_eq!(link_status["kind"], "veth");
    node.eventually("RouteStatus of 198.51.100.0/24", CONVERGE, || async {
        node.get(
            "network",
            "RouteStatuses.net.talos.dev",
            "inet4/192.0.2.1/198.51.100.0/24/100",
        )
        .await
    })
    .await;
    // The hostname: networkd merges the spec but does not set it (init does, on a node), and
    // reports the kernel's names once they are the spec's. Here init's part is played by hand,
    // in networkd's own UTS namespace.
    node.eventually("HostnameSpec node-static", CONVERGE, || async {
        node.get("network", "HostnameSpecs.net.talos.dev", "hostname")
            .await
            .filter(|h| h["hostname"] == "node-static")
    })
    .await;
    let pid = node.networkd.as_ref().map(|p| p.pid()).expect("networkd");
    let uts = format!("/proc/{pid}/ns/uts");
    let ours = std::fs::read_link("/proc/self/ns/uts").expect("our UTS namespace");
    assert_ne!(
        std::fs::read_link(&uts).expect("networkd's UTS namespace"),
        ours,
        "networkd must run in a UTS namespace of its own"
    );
    let kernel = run("nsenter", &[&format!("--uts={uts}"), "hostname"]);
    if kernel.trim() != "node-static" {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(
            node.get("network", "HostnameStatuses.net.talos.dev", "hostname")
                .await
                .is_none(),
            "no HostnameStatus while the kernel has another name"
        );
    }
    run(
        "nsenter",
        &[&format!("--uts={uts}"), "hostname", "node-static"],
    );
    let hostname = node
        .eventually("HostnameStatus from the kernel", CONVERGE, || async {
            node.get("network", "HostnameStatuses.net.talos.dev", "hostname")
                .await
        })
        .await;
    assert_eq!(hostname["hostname"], "node-static");
    assert_eq!(hostname["domainname"], "");

    // An address deleted behind networkd's back comes back.
    node.netns
        .ip(&["addr", "del", "192.0.2.11/24", "dev", "eth0"]);
    let ns = &node.netns;
    wait_for("192.0.2.11/24 restored", CONVERGE, || {
        has(&ns.addresses("eth0"), "192.0.2.11/24").then_some(())
    });

    // A route deleted behind networkd's back comes back (networkd follows its routes from the
    // kernel's messages: the deletion's message must wake it and remove the route it knew).
    node.netns.ip(&[
        "route",
        "del",
        "198.51.100.0/24",
        "via",
        "192.0.2.1",
        "metric",
        "100",
    ]);
    let ns = &node.netns;
    wait_for("198.51.100.0/24 restored", CONVERGE, || {
        ns.route("198.51.100.0/24")
    });
    // A route changed behind its back (another MTU, by replace) is put back as its spec says.
    node.netns.ip(&[
        "route",
        "replace",
        "198.51.100.0/24",
        "via",
        "192.0.2.1",
        "dev",
        "eth0",
        "metric",
        "100",
        "proto",
        "84",
        "mtu",
        "1300",
    ]);
    wait_for("198.51.100.0/24 without the foreign MTU", CONVERGE, || {
        ns.route("198.51.100.0/24")
            .filter(|r| !r.to_string().contains("1300"))
    });

    // A link set down comes back up, and its routes with it (the kernel flushed them).
    node.netns.ip(&["link", "set", "eth0", "down"]);
    let ns = &node.netns;
    wait_for("eth0 up again with its routes", CONVERGE, || {
        let link = ns.link("eth0")?;
        let up = link["flags"].as_array()?.iter().any(|f| f == "UP");
        (up && ns.route("198.51.100.0/24").is_some() && ns.route("203.0.113.0/24").is_some())
            .then_some(())
    });

    // A restart of networkd removes and re-adds nothing in the kernel.
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(std::time::Duration::from_secs(2));
    node.stop_networkd();
    node.start_networkd();
    // Let the new networkd run several full passes (statuses refreshed, specs adopted).
    node.eventually("networkd's second run to reconcile", CONVERGE, || async {
        let log = node.networkd.as_ref().map(|p| p.log()).unwrap_or_default();
        log.contains("networkd started").then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let events = monitor.finish();
    assert!(
        events.is_empty(),
        "a restart changed the kernel:\n{}",
        events.join("\n")
    );

    // A config change removes exactly what is no longer wanted.
    let mut monitor = Monitor::start(&node.netns, node.dir.path());
    monitor.settle(std::time::Duration::from_secs(1));
    node.apply_config(SMALLER).await;
    let ns = &node.netns;
    wait_for("192.0.2.11/24 and 203.0.113.0/24 removed", CONVERGE, || {
        (!has(&ns.addresses("eth0"), "192.0.2.11/24") && ns.route("203.0.113.0/24").is_none())
            .then_some(())
    });
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let events = monitor.finish();
    let deleted: Vec<&String> = events.iter().filter(|e| e.starts_with("Deleted")).collect();
    assert!(
        deleted
            .iter()
            .all(|e| e.contains("192.0.2.11") || e.contains("203.0.113.0")),
        "deleted more than the removed address and route:\n{}",
        events.join("\n")
    );
    assert!(has(&node.netns.addresses("eth0"), "192.0.2.10/24"));
    assert!(node.netns.route("198.51.100.0/24").is_some());

    // The foreign link and its address were never touched.
    assert_eq!(
        node.netns.addresses("foreign0"),
        vec!["198.18.0.1/24".to_string()]
    );
}
