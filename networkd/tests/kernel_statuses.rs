//! networkd's address and route statuses against the real kernel, in a namespace of the test's
//! own, while an administrator changes addresses, routes and links behind its back with `ip`:
//! additions and deletions (updated from the kernel's messages), a route replaced, routes with
//! several next hops (IPv4, and IPv6 by appending), routes the
//! kernel flushes without a message per route (an address deleted, a link set down), a link
//! renamed. At the end the statuses must be exactly what a freshly started networkd lists from
//! the kernel: a restart then rewrites none of them.

mod kernel_support;

use std::collections::BTreeMap;

use kernel_support::{can_run, Node, CONVERGE};
use serde_json::Value;

const ADDRESSES: &str = "AddressStatuses.net.talos.dev";
const ROUTES: &str = "RouteStatuses.net.talos.dev";

/// A configuration that configures nothing of the test's links.
const CONFIG: &str = r#"
version: v1alpha1
machine:
  network:
    hostname: node-statuses
"#;

/// Every status of a kind: ID → (version, spec).
async fn statuses(node: &Node, r#type: &str) -> BTreeMap<String, (u64, Value)> {
    node.stated
        .client
        .list("network", r#type, &cosi::Query::default())
        .await
        .expect("list")
        .into_iter()
        .map(|r| {
            let spec = r.spec_value().expect("spec decodes");
            (r.metadata.id, (r.metadata.version, spec))
        })
        .collect()
}

/// Waits until every ID of `present` has a status of `r#type` and none of `absent` has.
async fn expect(node: &Node, r#type: &str, present: &[&str], absent: &[&str]) {
    let what = format!("{type}: {present:?} present, {absent:?} gone");
    node.eventually(&what, CONVERGE, || async {
        let ids = node.ids("network", r#type).await;
        let has = |id: &&str| ids.iter().any(|i| i == id);
        (present.iter().all(has) && !absent.iter().any(has)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_follow_the_kernel_and_equal_a_fresh_listing() {
    if !can_run() {
        return;
    }
    let mut node = Node::new("statuses").await;
    let ns = &node.netns;
    ns.ip(&[
        "link", "add", "name", "s0", "type", "veth", "peer", "name", "s0p",
    ]);
    ns.ip(&["link", "set", "s0p", "up"]);
    ns.ip(&["link", "set", "s0", "up"]);
    node.apply_config(CONFIG).await;
    node.start_networkd();
    expect(&node, ADDRESSES, &["lo/127.0.0.1/8"], &[]).await;

    // Added one by one: each arrives as a message.
    let ns = &node.netns;
    ns.ip(&["addr", "add", "10.10.0.1/24", "dev", "s0"]);
    ns.ip(&["addr", "add", "10.10.1.1/24", "dev", "s0"]);
    ns.ip(&["-6", "addr", "add", "fd00:10::1/64", "dev", "s0", "nodad"]);
    ns.ip(&["route", "add", "10.20.0.0/24", "via", "10.10.0.254"]);
    ns.ip(&[
        "route",
        "add",
        "10.21.0.0/24",
        "via",
        "10.10.1.254",
        "metric",
        "5",
    ]);
    ns.ip(&["-6", "route", "add", "fd00:20::/64", "via", "fd00:10::fe"]);
    ns.ip(&[
        "route",
        "add",
        "10.24.0.0/24",
        "dev",
        "s0",
        "src",
        "10.10.1.1",
    ]);
    // Routes with several next hops: one in the listing, not necessarily one per message.
    ns.ip(&[
        "route",
        "add",
        "10.25.0.0/24",
        "nexthop",
        "via",
        "10.10.0.253",
        "nexthop",
        "via",
        "10.10.0.252",
    ]);
    expect(
        &node,
        ADDRESSES,
        &["s0/10.10.0.1/24", "s0/10.10.1.1/24", "s0/fd00:10::1/64"],
        &[],
    )
    .await;
    expect(
        &node,
        ROUTES,
        &[
            "inet4/10.10.0.254/10.20.0.0/24/0",
            "inet4/10.10.1.254/10.21.0.0/24/5",
            "s0/inet6/fd00:10::fe/fd00:20::/64/1024",
            "inet4//10.10.0.0/24/0",
            "inet4//10.24.0.0/24/0",
            "inet4//10.25.0.0/24/0",
        ],
        &[],
    )
    .await;

    // A second next hop appended to an IPv6 route: reported as the kernel lists it.
    ns.ip(&[
        "-6",
        "route",
        "append",
        "fd00:20::/64",
        "via",
        "fd00:10::fd",
    ]);
    expect(
        &node,
        ROUTES,
        &[],
        &["s0/inet6/fd00:10::fe/fd00:20::/64/1024"],
    )
    .await;
    // Replaced: the old route vanishes without a message of its own.
    ns.ip(&["route", "replace", "10.20.0.0/24", "via", "10.10.1.254"]);
    // Deleted.
    ns.ip(&["route", "del", "10.21.0.0/24"]);
    expect(
        &node,
        ROUTES,
        &["inet4/10.10.1.254/10.20.0.0/24/0"],
        &[
            "inet4/10.10.0.254/10.20.0.0/24/0",
            "inet4/10.10.1.254/10.21.0.0/24/5",
        ],
    )
    .await;

    // An address goes: the kernel flushes the routes with it as their source, with no
    // message for them, and its prefix route.
    ns.ip(&["addr", "del", "10.10.1.1/24", "dev", "s0"]);
    expect(&node, ADDRESSES, &["s0/10.10.0.1/24"], &["s0/10.10.1.1/24"]).await;
    expect(
        &node,
        ROUTES,
        &["inet4//10.10.0.0/24/0", "inet4/10.10.1.254/10.20.0.0/24/0"],
        &["inet4//10.24.0.0/24/0", "inet4//10.10.1.0/24/0"],
    )
    .await;

    // The link goes down (its IPv4 routes are flushed), is renamed (its addresses' IDs with
    // it), and comes back up.
    ns.ip(&["link", "set", "s0", "down"]);
    expect(&node, ROUTES, &[], &["inet4//10.10.0.0/24/0"]).await;
    ns.ip(&["link", "set", "s0", "name", "s1"]);
    ns.ip(&["link", "set", "s1", "up"]);
    expect(&node, ADDRESSES, &["s1/10.10.0.1/24"], &["s0/10.10.0.1/24"]).await;
    expect(&node, ROUTES, &["inet4//10.10.0.0/24/0"], &[]).await;
    ns.ip(&["route", "add", "10.22.0.0/24", "via", "10.10.0.254"]);
    expect(&node, ROUTES, &["inet4/10.10.0.254/10.22.0.0/24/0"], &[]).await;

    // What networkd reports now must be what a fresh listing gives: a restarted networkd
    // (which lists everything) rewrites none of it. Something added while it is down tells
    // when its first pass is done.
    let addresses = statuses(&node, ADDRESSES).await;
    let routes = statuses(&node, ROUTES).await;
    node.stop_networkd();
    let ns = &node.netns;
    ns.ip(&["addr", "add", "10.10.9.1/24", "dev", "s1"]);
    ns.ip(&["route", "add", "10.23.0.0/24", "via", "10.10.9.254"]);
    node.start_networkd();
    expect(&node, ADDRESSES, &["s1/10.10.9.1/24"], &[]).await;
    expect(&node, ROUTES, &["inet4/10.10.9.254/10.23.0.0/24/0"], &[]).await;
    let fresh_addresses = statuses(&node, ADDRESSES).await;
    let fresh_routes = statuses(&node, ROUTES).await;
    // Only what was added while networkd was down is new.
    let compare = |before: &BTreeMap<String, (u64, Value)>,
                   after: &BTreeMap<String, (u64, Value)>| {
        let after: BTreeMap<_, _> = after
            .iter()
            .filter(|(id, _)| !id.contains("10.10.9.") && !id.contains("10.23."))
            .collect();
        let before: BTreeMap<_, _> = before.iter().collect();
        assert_eq!(before, after, "the statuses differ from a fresh listing");
    };
    compare(&addresses, &fresh_addresses);
    compare(&routes, &fresh_routes);
    assert!(
        routes.keys().any(|id| id.starts_with("s1/inet6/")),
        "{routes:?}"
    );
    node.stop_networkd();
}
