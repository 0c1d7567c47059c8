//! The shipped manifest against the daemons' own declarations: every output a daemon's
//! controllers declare is in a namespace the manifest lets it write, every input in one it may
//! read, and no daemon holds a capability outside its allow-list (DESIGN.md §5). A daemon that
//! adds a controller writing elsewhere fails this test, not the node at run time.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use init::manifest::{allowed_capabilities, check_inputs, check_outputs};

fn manifest() -> init::Manifest {
    init::Manifest::parse(
        init::DEFAULT_MANIFEST,
        &init::Paths {
            root: "/".into(),
            bin: "/usr/bin".into(),
        },
    )
    .unwrap()
}

#[test]
fn networkd_controllers_write_only_its_namespaces_and_read_only_what_it_may() {
    let m = manifest();
    let networkd = m.daemon("networkd").unwrap();
    let graph = networkd::controllers::registry()
        .unwrap()
        .dependency_graph();
    assert!(
        graph.edges.iter().any(|e| e.kind.is_output()),
        "networkd declares outputs"
    );
    let problems = check_outputs(networkd, &graph);
    assert!(problems.is_empty(), "{problems:#?}");
    let problems = check_inputs(networkd, &graph);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn no_daemon_holds_a_capability_outside_its_allow_list() {
    let m = manifest();
    for d in &m.daemons {
        let caps = d.capability_set().unwrap();
        assert!(
            caps.is_subset(allowed_capabilities(&d.name)),
            "{}: {caps}",
            d.name
        );
    }
    assert_eq!(
        m.daemon("networkd")
            .unwrap()
            .capability_set()
            .unwrap()
            .names(),
        ["CAP_NET_BIND_SERVICE", "CAP_NET_ADMIN", "CAP_NET_RAW"]
    );
    assert!(m
        .daemon("stated")
        .unwrap()
        .capability_set()
        .unwrap()
        .is_empty());
}

#[test]
fn a_daemon_writing_outside_its_namespaces_is_caught() {
    use cosi::runtime::{Output, OutputKind};
    let m = manifest();
    let networkd = m.daemon("networkd").unwrap();
    let mut graph = networkd::controllers::registry()
        .unwrap()
        .dependency_graph();
    graph.add_controller(
        "network.Rogue",
        &[],
        &[Output::new(
            "secrets",
            "Keys.talos.dev",
            OutputKind::Exclusive,
        )],
    );
    let problems = check_outputs(networkd, &graph);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("network.Rogue") && problems[0].contains("secrets"));
}

#[test]
fn stated_accepts_the_manifest_init_hands_it() {
    let m = manifest();
    let parsed = stated::Manifest::parse(&m.text).unwrap();
    assert_eq!(parsed.daemons.len(), m.daemons.len());
}
