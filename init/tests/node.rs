//! init on a real node: stated, networkd and test daemons started from the manifest, each in
//! its sandbox, in new PID, mount and network namespaces (container mode) or as a plain
//! process (development mode). Needs root; skipped with a message otherwise. Every node is torn
//! down by `init::testing::Node` (SIGTERM, then the kernel's PID-namespace teardown), also when
//! a test fails.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use cosi::{Query, ResourceSpec};
use init::testing::{Node, NodeMode, TestDaemon};
use machinery::manifest::node_uid;
use machinery::resources::network::HostnameStatusSpec;
use machinery::resources::runtime::{DaemonSecuritySpec, ServiceSpecSpec, ServiceStatusSpec};
use sandbox::{CapSet, SeccompMode};

const T: Duration = Duration::from_secs(60);

/// One node at a time: they share two cores with everything else.
static NODES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

macro_rules! require_root {
    () => {
        if !testkit::require_root("init's node tests switch uids, make namespaces and sandboxes") {
            return;
        }
    };
}

const WORKER: &str = include_str!("../../talosctl/tests/testdata/worker.yaml");

/// The worker config with an address networkd must add to `lo` and keep.
fn config_with_address() -> String {
    WORKER.replace(
        "    network: {}",
        "    network:\n        interfaces:\n            - interface: lo\n              addresses: [10.99.0.2/32]\n",
    )
}

/// The worker config with `machine.network.hostname`.
fn config_with_hostname(hostname: &str) -> String {
    WORKER.replace(
        "    network: {}",
        &format!("    network:\n        hostname: {hostname}\n"),
    )
}

/// The hostname of the UTS namespace the tests run in (the host's).
fn host_hostname() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn uts_ns(pid: &str) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/uts")).unwrap()
}

/// A test daemon whose uid is `offset` into the node's uid range.
fn testd(name: &str, offset: u32, ns: &str) -> TestDaemon {
    TestDaemon::new(name, node_uid(offset), ns)
}

/// (namespace, type, id) → (created, owner) of every resource in `namespaces`, over every type
/// stated has a definition for (and the test daemon's type).
async fn snapshot(
    node: &Node,
    namespaces: &[&str],
) -> BTreeMap<(String, String, String), (Option<SystemTime>, String)> {
    let client = node.state();
    let mut types: Vec<String> = client
        .list_typed::<cosi::ResourceDefinition>("meta")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.spec.resource_type)
        .chain(
            machinery::resources::definitions()
                .into_iter()
                .map(|d| d.resource_type),
        )
        .collect();
    types.push("TestItems.init.talos.dev".to_string());
    types.push(cosi::runtime::DependencyGraph::TYPE.to_string());
    types.sort();
    types.dedup();
    let mut out = BTreeMap::new();
    for ns in namespaces {
        for t in &types {
            let Ok(list) = client.list(ns, t, &Query::default()).await else {
                continue;
            };
            for r in list {
                let m = r.metadata;
                out.insert((m.namespace, m.r#type, m.id), (m.created, m.owner));
            }
        }
    }
    out
}

/// Waits until two snapshots half a second apart are equal (the node converged).
async fn converged(
    node: &Node,
    namespaces: &[&str],
) -> BTreeMap<(String, String, String), (Option<SystemTime>, String)> {
    let deadline = std::time::Instant::now() + T;
    let mut last = snapshot(node, namespaces).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = snapshot(node, namespaces).await;
        if now == last && !now.is_empty() {
            return now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node never converged"
        );
        last = now;
    }
}

/// The kernel's network objects in the node's namespace.
fn kernel(node: &Node) -> String {
    let mut s = String::new();
    for args in [
        &["ip", "-o", "link", "show"][..],
        &["ip", "-o", "addr", "show"],
        &["ip", "-o", "route", "show", "table", "all"],
    ] {
        s.push_str(&node.in_netns(args));
    }
    s
}

#[tokio::test]
async fn every_thread_of_every_daemon_has_its_uid_exactly_its_capabilities_nnp_and_seccomp() {
    require_root!();
    let _one = NODES.lock().await;
    let builder = Node::builder().daemon(testd("test-a", 1100, "test-a"));
    let manifest_text = builder.manifest();
    let node = builder.start();
    let manifest = init::manifest::parse(
        &manifest_text,
        &init::Paths {
            root: node.root.clone(),
            bin: node.bin.clone(),
        },
    )
    .unwrap();
    let names = [
        "stated", "networkd", "blockd", "secretsd", "trustd", "apid", "test-a",
    ];
    let list = node.wait_healthy(&names, T).await;
    for name in names {
        let d = manifest.daemon(name).unwrap();
        let caps: CapSet = init::manifest::capability_set(d).unwrap();
        let pid = list.iter().find(|s| s.id == name).unwrap().pid;
        let host = node.host_pid(pid).unwrap();
        let observed = sandbox::observe(host).unwrap();
        assert!(
            observed.threads.len() >= 2,
            "{name}: a tokio runtime has threads"
        );
        // Non-dumpable (the daemon skeleton's first step): its /proc files are root's, so a
        // process of its uid could not read its memory.
        assert_eq!(observed.dumpable, Some(false), "{name}: dumpable");
        use std::os::unix::fs::MetadataExt;
        let mem = std::fs::metadata(format!("/proc/{host}/mem")).unwrap();
        assert_eq!(mem.uid(), 0, "{name}: /proc/<pid>/mem is root's");
        for t in &observed.threads {
            let who = format!("{name} thread {} ({})", t.tid, t.name);
            assert_eq!(t.uid.all(), [d.uid; 4], "{who}: uid");
            assert_ne!(d.uid, 0);
            assert_eq!(t.gid.all(), [d.gid; 4], "{who}: gid");
            for (set, got) in [
                ("CapEff", t.cap_effective),
                ("CapPrm", t.cap_permitted),
                ("CapInh", t.cap_inheritable),
                ("CapAmb", t.cap_ambient),
                ("CapBnd", t.cap_bounding),
            ] {
                assert_eq!(got, caps, "{who}: {set}");
            }
            assert!(t.no_new_privs, "{who}: NoNewPrivs");
            assert_eq!(t.seccomp, SeccompMode::Filter, "{who}: Seccomp");
        }
    }
    // init's own reading, published for the audit, says the same.
    let client = node.state();
    let deadline = std::time::Instant::now() + T;
    loop {
        let list = client
            .list_typed::<DaemonSecuritySpec>("runtime")
            .await
            .unwrap_or_default();
        if names
            .iter()
            .all(|n| list.iter().any(|r| r.metadata.id == *n))
        {
            for r in list {
                assert!(
                    r.spec.mismatches.is_empty(),
                    "{}: {:?}",
                    r.metadata.id,
                    r.spec.mismatches
                );
                assert!(r.spec.observed.no_new_privs);
                assert_eq!(r.spec.observed.seccomp, "filter");
            }
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no DaemonSecurity");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn kill_9_of_each_daemon_restarts_it_and_the_node_converges_with_nothing_lost() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder()
        .config(&config_with_address())
        .daemon(testd("test-a", 1100, "test-a"))
        .start();
    let names = [
        "stated", "networkd", "blockd", "secretsd", "trustd", "apid", "test-a",
    ];
    node.wait_healthy(&names, T).await;
    let namespaces = ["config", "network-config", "network", "secrets", "test-a"];
    let before = converged(&node, &namespaces).await;
    assert!(
        before.keys().any(|(ns, _, _)| ns == "test-a"),
        "test-a's items: {before:#?}"
    );
    assert!(
        before.keys().any(|(ns, _, _)| ns == "config"),
        "the machine config was seeded: {before:#?}"
    );
    let kernel_before = kernel(&node);
    assert!(
        kernel_before.contains("10.99.0.2/32"),
        "networkd applied the config: {kernel_before}"
    );
    assert!(
        before.keys().any(|(ns, t, id)| ns == "network"
            && t.starts_with("AddressStatus")
            && id == "lo/10.99.0.2/32"),
        "networkd observed its address: {before:#?}"
    );
    for name in names {
        let others: Vec<(String, i32)> = node
            .list()
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.id != name)
            .map(|s| (s.id, s.pid))
            .collect();
        let old = node.service(name).await.unwrap();
        let host = node.host_pid(old.pid).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(host),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        node.wait_until(&format!("{name} restarted"), T, |l| {
            l.iter().any(|s| {
                s.id == name && s.healthy && s.pid != old.pid && s.restarts == old.restarts + 1
            })
        })
        .await;
        node.wait_healthy(&names, T).await;
        let after = converged(&node, &namespaces).await;
        assert_eq!(
            before, after,
            "after kill -9 of {name}: every resource is still there, none recreated"
        );
        assert_eq!(
            kernel_before,
            kernel(&node),
            "after kill -9 of {name}: the kernel's links, addresses and routes are intact"
        );
        let s = node.service(name).await.unwrap();
        assert_eq!(s.last_exit, "signal 9");
        for (id, pid) in &others {
            let now = node.service(id).await.unwrap();
            assert_eq!(now.pid, *pid, "{id} survived the kill -9 of {name}");
        }
    }
}

/// A daemon of the manifest is never given up on (issue: five kills of stated within 60 s left
/// the node without its broker): a crash-looping daemon is restarted forever with capped
/// backoff, stated comes back after every one of many kill -9 in a row, and only the
/// permanent-failure exit code leaves a daemon failed.
#[tokio::test]
async fn a_crash_looping_daemon_is_restarted_forever_and_only_exit_78_stops_one() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder()
        .daemon(testd("test-a", 1100, "test-a"))
        .daemon(
            testd("crasher", 1101, "test-crash")
                .args(&["--exit", "1"])
                .extra("    restart: {backoffMs: 20, maxBackoffMs: 100}\n"),
        )
        .daemon(testd("quitter", 1102, "test-quit").args(&["--exit", "78"]))
        .start();
    let healthy = ["stated", "networkd", "test-a"];
    node.wait_healthy(&healthy, T).await;
    let list = node
        .wait_until("crasher restarted many times, quitter failed", T, |l| {
            l.iter().any(|s| s.id == "crasher" && s.restarts >= 12)
                && l.iter().any(|s| s.id == "quitter" && s.state == "failed")
        })
        .await;
    let crasher = list.iter().find(|s| s.id == "crasher").unwrap();
    assert_ne!(crasher.state, "failed", "{crasher:?}");
    assert_eq!(crasher.last_exit, "exit 1");
    let quitter = list.iter().find(|s| s.id == "quitter").unwrap();
    assert!(quitter.message.contains("permanent failure"), "{quitter:?}");
    assert_eq!(quitter.restarts, 0, "exit 78 is never restarted");
    // The machine is not ready, and says why as upstream's MachineStatus does: one `services`
    // condition naming the failed daemon, not the healthy ones.
    let state = node.state();
    let start = std::time::Instant::now();
    let machine = loop {
        let m = state
            .get_typed::<machinery::resources::runtime::MachineStatusSpec>("runtime", "machine")
            .await;
        if let Ok(m) = m.as_ref() {
            if m.spec
                .status
                .unmet_conditions
                .iter()
                .any(|c| c.reason.contains("quitter not running"))
            {
                break m.spec.clone();
            }
        }
        assert!(
            start.elapsed() < T,
            "MachineStatus never named quitter: {m:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!machine.status.ready, "{machine:?}");
    assert_eq!(machine.status.unmet_conditions.len(), 1, "{machine:?}");
    let condition = &machine.status.unmet_conditions[0];
    assert_eq!(condition.name, "services", "{machine:?}");
    for healthy in healthy {
        assert!(!condition.reason.contains(healthy), "{machine:?}");
    }

    // stated, killed eight times in a row: back every time, never left failed.
    let networkd = node.service("networkd").await.unwrap();
    for round in 0..8 {
        let old = node.service("stated").await.unwrap();
        let host = node.host_pid(old.pid).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(host),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let l = node
            .wait_until(&format!("stated back after kill {round}"), T, |l| {
                l.iter()
                    .any(|s| s.id == "stated" && s.healthy && s.pid != old.pid)
            })
            .await;
        let st = l.iter().find(|s| s.id == "stated").unwrap();
        assert_ne!(st.state, "failed");
    }
    // The other daemons rode it out without a restart of their own.
    let now = node.service("networkd").await.unwrap();
    assert_eq!((now.pid, now.restarts), (networkd.pid, networkd.restarts));
    // The crasher is still being restarted.
    let before = node.service("crasher").await.unwrap().restarts;
    node.wait_until("crasher still restarted", T, |l| {
        l.iter()
            .any(|s| s.id == "crasher" && s.restarts > before && s.state != "failed")
    })
    .await;
}

fn sleep_spec(uid: u32) -> ServiceSpecSpec {
    let path = |p: &str, a: &str| machinery::resources::runtime::ServicePath {
        path: p.into(),
        access: a.into(),
    };
    ServiceSpecSpec {
        binary: "/usr/bin/sleep".into(),
        args: vec!["3000".into()],
        uid,
        gid: uid,
        paths: vec![
            path("/usr/bin/sleep", "exec"),
            path("/usr/lib", "exec"),
            path("/lib64", "exec"),
            path("/etc/ld.so.cache", "read-only"),
        ],
        seccomp_profile: "service".into(),
        restart: true,
        ..Default::default()
    }
}

const ENVELOPE: &str = "    envelope:
      binaries: [/usr/bin/sleep]
      capabilities: []
      paths:
        - {path: /usr, access: exec}
        - {path: /lib64, access: exec}
        - {path: /etc/ld.so.cache, access: read-only}
      uids: [1990002000, 1990002099]
      profiles: [service]
";

#[tokio::test]
async fn a_requested_service_runs_sandboxed_within_the_envelope_and_one_asking_more_is_refused() {
    require_root!();
    let _one = NODES.lock().await;
    let spec = serde_json::to_string(&sleep_spec(node_uid(2000))).unwrap();
    let node = Node::builder()
        .without_networkd()
        .daemon(
            testd("test-a", 1100, "test-a")
                .args(&["--service-spec", &spec, "--service-id", "workload"])
                .extra(ENVELOPE),
        )
        .start();
    node.wait_healthy(&["stated", "test-a"], T).await;
    // The daemon asked for `workload`: it runs, as its own uid, under the service profile.
    let list = node.wait_healthy(&["workload"], T).await;
    let w = list.iter().find(|s| s.id == "workload").unwrap();
    assert_eq!(
        (w.kind.as_str(), w.requested_by.as_str()),
        ("service", "test-a")
    );
    let host = node.host_pid(w.pid).unwrap();
    let exe = std::fs::read_link(format!("/proc/{host}/exe")).unwrap();
    assert_eq!(exe, std::path::PathBuf::from("/usr/bin/sleep"));
    let observed = sandbox::observe(host).unwrap();
    for t in &observed.threads {
        assert_eq!(t.uid.all(), [node_uid(2000); 4]);
        assert!(t.cap_effective.is_empty() && t.cap_bounding.is_empty());
        assert!(t.no_new_privs);
        assert_eq!(t.seccomp, SeccompMode::Filter);
    }

    // Asking for more than the envelope: another binary, a capability, a path, a uid.
    let mut greedy = sleep_spec(0);
    greedy.binary = "/bin/sh".into();
    greedy.capabilities = vec!["CAP_SYS_ADMIN".into()];
    greedy
        .paths
        .push(machinery::resources::runtime::ServicePath {
            path: "/etc".into(),
            access: "read-write".into(),
        });
    let raw = cosi::Resource::new("test-a", "greedy", greedy)
        .to_raw()
        .unwrap();
    node.state()
        .create(&raw, "test.ItemController")
        .await
        .unwrap();
    let list = node
        .wait_until("greedy refused", T, |l| {
            l.iter().any(|s| s.id == "greedy" && s.state == "failed")
        })
        .await;
    let g = list.iter().find(|s| s.id == "greedy").unwrap();
    for reason in ["refused", "/bin/sh", "CAP_SYS_ADMIN", "\"/etc\"", "uid 0"] {
        assert!(g.message.contains(reason), "{reason} in {:?}", g.message);
    }
    assert_eq!(g.pid, 0, "nothing ran");
    // The refusal is in the service's ServiceStatus in stated.
    let deadline = std::time::Instant::now() + T;
    loop {
        if let Ok(s) = node
            .state()
            .get_typed::<ServiceStatusSpec>("runtime", "greedy")
            .await
        {
            assert!(s.spec.message.contains("CAP_SYS_ADMIN"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no ServiceStatus for greedy"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Removing the request stops the service.
    node.state()
        .destroy(
            "test-a",
            ServiceSpecSpec::TYPE,
            "workload",
            "test.ItemController",
        )
        .await
        .unwrap();
    node.wait_until("workload gone", T, |l| {
        !l.iter().any(|s| s.id == "workload")
    })
    .await;
    let deadline = std::time::Instant::now() + T;
    while std::path::Path::new(&format!("/proc/{host}")).exists() {
        assert!(std::time::Instant::now() < deadline, "sleep still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `seq 1 <last>` as a one-shot service (`restart: false`) of `uid`.
fn seq_spec(uid: u32, last: u32) -> ServiceSpecSpec {
    let path = |p: &str, a: &str| machinery::resources::runtime::ServicePath {
        path: p.into(),
        access: a.into(),
    };
    ServiceSpecSpec {
        binary: "/usr/bin/seq".into(),
        args: vec!["1".into(), last.to_string()],
        uid,
        gid: uid,
        paths: vec![
            path("/usr/bin/seq", "exec"),
            path("/usr/lib", "exec"),
            path("/lib64", "exec"),
            path("/etc/ld.so.cache", "read-only"),
        ],
        // seq asks the terminal of its output (an ioctl the service profile has not).
        seccomp_profile: "testd".into(),
        restart: false,
        ..Default::default()
    }
}

/// What a one-shot service printed is in its `ServiceStatus` once it ended, beside its exit
/// (what the daemon that asked reads, as blockd will read `blkid -p -o export`): all of it
/// when short, the newest whole lines within 4096 bytes when longer; nothing for a daemon.
#[tokio::test]
async fn a_one_shot_services_output_is_in_its_status_once_it_ended() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder()
        .without_networkd()
        .daemon(testd("test-a", 1100, "test-a").extra(
            "    envelope:
      binaries: [/usr/bin/seq]
      capabilities: []
      paths:
        - {path: /usr, access: exec}
        - {path: /lib64, access: exec}
        - {path: /etc/ld.so.cache, access: read-only}
      uids: [1990002000, 1990002099]
      profiles: [testd]
",
        ))
        .start();
    node.wait_healthy(&["stated", "test-a"], T).await;
    for (id, last) in [("short", 3), ("long", 2000)] {
        let raw = cosi::Resource::new("test-a", id, seq_spec(node_uid(2000), last))
            .to_raw()
            .unwrap();
        node.state()
            .create(&raw, "test.ItemController")
            .await
            .unwrap();
    }
    let status = |id: &'static str| {
        let node = &node;
        async move {
            let deadline = std::time::Instant::now() + T;
            loop {
                if let Ok(s) = node
                    .state()
                    .get_typed::<ServiceStatusSpec>("runtime", id)
                    .await
                {
                    if s.spec.state == machinery::resources::runtime::ServiceState::Finished {
                        return s.spec;
                    }
                    assert_ne!(
                        s.spec.state,
                        machinery::resources::runtime::ServiceState::Failed,
                        "{id}: {:?}\n{}",
                        s.spec,
                        node.log_text()
                    );
                }
                assert!(std::time::Instant::now() < deadline, "{id} never finished");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let short = status("short").await;
    assert_eq!(short.last_exit, "exit 0");
    assert_eq!(short.output, "1\n2\n3");
    let long = status("long").await;
    assert_eq!(long.last_exit, "exit 0");
    let all: Vec<String> = (1..=2000).map(|i| i.to_string()).collect();
    let all = all.join("\n");
    let out = &long.output;
    assert!(
        out.len() <= 4096 && out.len() > 4096 - 5,
        "{} bytes",
        out.len()
    );
    assert!(all.ends_with(out.as_str()), "the newest lines");
    assert!(
        all[..all.len() - out.len()].ends_with('\n'),
        "whole lines: {:?}",
        &out[..10]
    );
    assert!(out.ends_with("\n1999\n2000"));
    // A daemon's status carries none.
    let daemon = node
        .state()
        .get_typed::<ServiceStatusSpec>("runtime", "test-a")
        .await
        .unwrap();
    assert_eq!(daemon.spec.output, "");
}

/// init's reconcile loops are controllers on the runtime: its dependency graph is published
/// (for `talosctl inspect dependencies`) with what each reads and writes.
#[tokio::test]
async fn inits_loops_are_controllers_in_the_published_dependency_graph() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder().start();
    node.wait_healthy(&["stated", "networkd"], T).await;
    let deadline = std::time::Instant::now() + T;
    let graph = loop {
        if let Ok(g) = node
            .state()
            .get_typed::<cosi::runtime::DependencyGraph>("runtime", "init")
            .await
        {
            break g.spec;
        }
        assert!(std::time::Instant::now() < deadline, "no graph of init");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let edges: Vec<(String, String, bool)> = graph
        .edges
        .iter()
        .map(|e| (e.controller.clone(), e.r#type.clone(), e.kind.is_output()))
        .collect();
    for (controller, ty, output) in [
        (
            "runtime.StatusController",
            "ServiceStatuses.runtime.talos.dev",
            true,
        ),
        (
            "runtime.StatusController",
            "DaemonSecurities.runtime.talos.dev",
            true,
        ),
        (
            "runtime.StatusController",
            "MachineStatuses.runtime.talos.dev",
            true,
        ),
        (
            "runtime.HostnameController",
            "HostnameSpecs.net.talos.dev",
            false,
        ),
    ] {
        assert!(
            edges.contains(&(controller.to_string(), ty.to_string(), output)),
            "{controller} {ty}: {edges:#?}"
        );
    }
}

#[tokio::test]
async fn networkd_is_ready_only_once_its_resource_definitions_are_in_stated() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder().start();
    // Polled every 20 ms: the first listing that says healthy is right after the notification.
    node.wait_healthy(&["stated", "networkd"], T).await;
    let defined: Vec<String> = node
        .state()
        .list_typed::<cosi::ResourceDefinition>("meta")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.spec.resource_type)
        .collect();
    for d in networkd::run::definitions() {
        assert!(
            defined.contains(&d.resource_type),
            "{} is not defined although networkd is ready: {defined:?}",
            d.resource_type
        );
    }
    let log = node.log_text();
    assert!(log.contains("ready unit=networkd"), "{log}");
}

#[tokio::test]
async fn init_sets_the_hostname_networkd_merges_in_the_nodes_uts_namespace_only() {
    require_root!();
    let _one = NODES.lock().await;
    let host_before = host_hostname();
    assert_ne!(host_before, "test-node-1");
    let node = Node::builder()
        .config(&config_with_hostname("test-node-1"))
        .start();
    let list = node.wait_healthy(&["stated", "networkd"], T).await;
    let init = node.init_host_pid().unwrap();
    let networkd = list.iter().find(|s| s.id == "networkd").unwrap();
    let networkd = node.host_pid(networkd.pid).unwrap();
    // networkd shares the node's UTS namespace, which is not the host's, and holds no
    // CAP_SYS_ADMIN in any set of any thread: it cannot set the hostname.
    assert_eq!(uts_ns(&networkd.to_string()), uts_ns(&init.to_string()));
    assert_ne!(uts_ns(&init.to_string()), uts_ns("self"));
    let sys_admin = CapSet::parse_name("CAP_SYS_ADMIN").unwrap();
    for t in &sandbox::observe(networkd).unwrap().threads {
        for set in [
            t.cap_effective,
            t.cap_permitted,
            t.cap_inheritable,
            t.cap_ambient,
            t.cap_bounding,
        ] {
            assert!(!set.contains_index(sys_admin), "networkd thread {}", t.tid);
        }
    }

    // init applies the merged HostnameSpec; networkd reports what the kernel then says.
    let client = node.state();
    for name in ["test-node-1", "test-node-2"] {
        if name == "test-node-2" {
            // A changed configuration is applied too.
            let mut raw = client
                .get(
                    "config",
                    machinery::resources::config::MachineConfigSpec::TYPE,
                    "v1alpha1",
                )
                .await
                .unwrap();
            let text = config_with_hostname(name);
            raw.spec = cosi::Resource::new(
                "config",
                "v1alpha1",
                machinery::resources::config::MachineConfigSpec(text),
            )
            .to_raw()
            .unwrap()
            .spec;
            let owner = raw.metadata.owner.clone();
            client.update(&raw, &owner, None).await.unwrap();
        }
        let deadline = std::time::Instant::now() + T;
        loop {
            let hostname = node.hostname();
            let status = client
                .get_typed::<HostnameStatusSpec>("network", "hostname")
                .await
                .ok()
                .map(|r| r.spec);
            if hostname.as_deref() == Some(name)
                && status
                    .as_ref()
                    .is_some_and(|s| s.hostname == name && s.domainname.is_empty())
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node hostname {hostname:?}, HostnameStatus {status:?}, wanted {name}\n{}",
                init::testing::tail(&node.log_text(), 60)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            host_hostname(),
            host_before,
            "the host's hostname is untouched"
        );
    }
    let log = node.log_text();
    assert!(log.contains("hostname set"), "{log}");
    assert!(!log.contains("cannot set the hostname"), "{log}");
}

#[tokio::test]
async fn dev_mode_sets_the_hostname_only_in_its_own_uts_namespace() {
    require_root!();
    let _one = NODES.lock().await;
    let host_before = host_hostname();
    let node = Node::builder()
        .mode(NodeMode::Dev)
        .own_uts()
        .config(&config_with_hostname("test-node-dev"))
        .start();
    node.wait_healthy(&["stated", "networkd"], T).await;
    let deadline = std::time::Instant::now() + T;
    while node.hostname().as_deref() != Some("test-node-dev") {
        assert!(
            std::time::Instant::now() < deadline,
            "hostname {:?}\n{}",
            node.hostname(),
            init::testing::tail(&node.log_text(), 60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        host_hostname(),
        host_before,
        "the host's hostname is untouched"
    );
}

#[tokio::test]
async fn dev_mode_seeds_the_config_and_shuts_down_in_reverse_order() {
    require_root!();
    let _one = NODES.lock().await;
    let mut node = Node::builder()
        .mode(NodeMode::Dev)
        .config(WORKER)
        .daemon(testd("test-a", 1100, "test-a"))
        .start();
    node.wait_healthy(&["stated", "networkd", "test-a"], T)
        .await;
    let mc = node
        .state()
        .get_typed::<machinery::resources::config::MachineConfigSpec>("config", "v1alpha1")
        .await
        .unwrap();
    assert!(mc.spec.0.contains("type: worker"));
    let status = node.terminate(Duration::from_secs(30)).unwrap();
    // Without --own-uts, init (in the host's UTS namespace here) leaves the hostname alone.
    assert!(node
        .log_text()
        .contains("not setting the node's hostname: development mode without --own-uts"));
    assert_eq!(status.code(), Some(0), "{}", node.log_text());
    let log = node.log_text();
    let stop = |d: &str| {
        log.find(&format!("stopping unit={d}"))
            .unwrap_or_else(|| panic!("{d} was not stopped:\n{log}"))
    };
    assert!(stop("networkd") < stop("stated"), "stated stops last");
    assert!(stop("test-a") < stop("stated"));
    assert!(node.leftovers().is_empty(), "nothing of the node runs");
}

#[tokio::test]
async fn open_log_streams_on_the_control_socket_are_bounded() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder().start();
    node.wait_healthy(&["stated", "networkd"], T).await;
    let max = init::control::MAX_OPEN_STREAMS;
    // Followed logs and kernel logs share the bound (a test node sees the host's /dev/kmsg).
    let mut open = Vec::new();
    for i in 0..max {
        let mut c = node.control();
        let s = if i % 2 == 0 {
            c.logs(proto::init::LogsRequest {
                id: "stated".into(),
                tail: 0,
                follow: true,
            })
            .await
            .map(|r| Box::new(r.into_inner()) as Box<dyn std::any::Any>)
        } else {
            c.dmesg(proto::init::DmesgRequest {
                follow: true,
                tail: true,
            })
            .await
            .map(|r| Box::new(r.into_inner()) as Box<dyn std::any::Any>)
        };
        open.push(s.unwrap_or_else(|e| panic!("stream {i} of {max}: {e:?}")));
    }
    let e = node
        .control()
        .dmesg(proto::init::DmesgRequest {
            follow: true,
            tail: true,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    // A log read to its end needs no slot; init still answers everything else.
    node.control()
        .logs(proto::init::LogsRequest {
            id: "stated".into(),
            tail: 1,
            follow: false,
        })
        .await
        .unwrap();
    assert!(node.list().await.is_ok());
    // Closed streams give their slots back.
    drop(open);
    let end = std::time::Instant::now() + T;
    loop {
        match node
            .control()
            .dmesg(proto::init::DmesgRequest {
                follow: true,
                tail: true,
            })
            .await
        {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                assert!(std::time::Instant::now() < end, "slots never came back");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
