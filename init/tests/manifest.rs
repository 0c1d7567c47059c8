//! The shipped manifest against the daemons' own declarations: every output a daemon's
//! controllers declare is in a namespace the manifest lets it write, every input in one it may
//! read, and no daemon holds a capability outside its allow-list (DESIGN.md §5). A daemon that
//! adds a controller writing elsewhere fails this test, not the node at run time.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use init::manifest::{allowed_capabilities, check_inputs, check_outputs};

fn manifest() -> init::Manifest {
    init::manifest::parse(
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
        let caps = init::manifest::capability_set(d).unwrap();
        assert!(
            caps.is_subset(allowed_capabilities(&d.name)),
            "{}: {caps}",
            d.name
        );
    }
    assert_eq!(
        init::manifest::capability_set(m.daemon("networkd").unwrap())
            .unwrap()
            .names(),
        ["CAP_NET_BIND_SERVICE", "CAP_NET_ADMIN", "CAP_NET_RAW"]
    );
    assert!(init::manifest::capability_set(m.daemon("stated").unwrap())
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
    let parsed = stated::Manifest::parse_substituted(&m.text).unwrap();
    assert_eq!(parsed.daemons.len(), m.daemons.len());
}

/// stated refuses a definition that takes a name another owner's definition has: the types of
/// stated, init and networkd must not share any name, or one of them would not be defined.
#[test]
fn no_two_owners_define_the_same_name() {
    use cosi::ResourceSpec;
    let mut init_defs = vec![machinery::resources::config::MachineConfigSpec::definition()];
    init_defs.extend(machinery::resources::runtime::definitions());
    let owners = [
        (
            "stated",
            vec![
                cosi::ResourceDefinition::definition(),
                cosi::NamespaceSpec::definition(),
            ],
        ),
        ("init", init_defs),
        ("networkd", networkd::run::definitions()),
        ("secretsd", machinery::resources::secrets::definitions()),
        ("blockd", machinery::resources::block::definitions()),
    ];
    for (i, (a, defs_a)) in owners.iter().enumerate() {
        for (b, defs_b) in &owners[i + 1..] {
            for x in defs_a {
                for y in defs_b {
                    let shared: Vec<String> = x.names().intersection(&y.names()).cloned().collect();
                    assert!(
                        shared.is_empty(),
                        "{a}'s {} and {b}'s {} share {shared:?}",
                        x.resource_type,
                        y.resource_type
                    );
                }
            }
        }
    }
}
