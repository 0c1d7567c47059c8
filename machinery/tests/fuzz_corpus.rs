//! The fuzz target `machinery_config` in the normal suite: its whole corpus replays through
//! `machinery::config::fuzz_config` without a panic, and the seed inputs (the sample
//! configurations and the patches of the patch tests) get as far as they should: decoded,
//! valid, patched.
//!
//! `FUZZ_WRITE_SEEDS=1 cargo test -p machinery --test fuzz_corpus` (re)writes the seeds into
//! `fuzz/corpus/machinery_config/seed-*`.

use machinery::config::{fuzz_config, FuzzConfigOutcome};

const CONTROLPLANE: &str = include_str!("../testdata/controlplane.yaml");
const WORKER: &str = include_str!("../testdata/worker.yaml");
const NETWORK: &str = include_str!("../testdata/network.yaml");

fn worker_single() -> String {
    WORKER
        .split("\n---\n")
        .next()
        .map(|s| format!("{s}\n"))
        .unwrap_or_default()
}

fn outcome(decoded: bool, valid: bool, patches: usize, patched: bool) -> FuzzConfigOutcome {
    FuzzConfigOutcome {
        decoded,
        valid,
        patches,
        patched,
    }
}

/// Seeds: (name, configuration, patches, what the entry should report).
fn seeds() -> Vec<(&'static str, String, Vec<&'static str>, FuzzConfigOutcome)> {
    let single = worker_single();
    vec![
        ("controlplane", CONTROLPLANE.into(), vec![], outcome(true, true, 0, false)),
        ("worker", WORKER.into(), vec![], outcome(true, true, 0, false)),
        ("network", NETWORK.into(), vec![], outcome(true, true, 0, false)),
        (
            "strategic-merge",
            CONTROLPLANE.into(),
            vec!["machine:\n  network:\n    hostname: cp-1\n    interfaces:\n      - interface: eth0\n        dhcp: true\n        vip:\n          ip: 10.5.0.100\n  certSANs:\n    - cp.example.com\ncluster:\n  network:\n    podSubnets: [10.32.0.0/12]\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: \"off\"\nhostname: cp-1\n---\napiVersion: v1alpha1\nkind: ResolverConfig\nnameservers:\n  - address: 1.1.1.1\n"],
            outcome(true, true, 1, true),
        ),
        (
            "keyed-lists",
            NETWORK.into(),
            vec!["machine:\n  network:\n    interfaces:\n      - interface: bond0\n        vlans:\n          - vlanId: 30\n            mtu: 1400\n          - vlanId: 40\n            dhcp: true\n      - deviceSelector:\n          busPath: \"0000:00:1f.6\"\n        mtu: 1500\n      - interface: eth9\n        dummy: true\n"],
            outcome(true, true, 1, true),
        ),
        (
            "deletes",
            CONTROLPLANE.into(),
            vec!["machine:\n  nodeLabels:\n    node.kubernetes.io/exclude-from-external-load-balancers:\n      $patch: delete\n  features:\n    hostDNS:\n      $patch: delete\ncluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n    auditPolicy:\n      $patch: delete\n---\napiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n"],
            outcome(true, true, 1, true),
        ),
        (
            "typed-documents",
            WORKER.into(),
            vec![
                "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - content: new\n    mountPath: /usr/local/etc/nut/upsmon.conf\nenvironment:\n  - B=2\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\naddresses:\n  - address: 10.0.0.3/24\n",
                "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - mountPath: /usr/local/etc/nut/upsmon.conf\n    $patch: delete\n",
            ],
            outcome(true, true, 2, true),
        ),
        (
            "json-patches",
            single.clone(),
            vec![
                r#"[{"op": "add", "path": "/machine/network/hostname", "value": "worker-1"},
                {"op": "replace", "path": "/machine/install/disk", "value": "/dev/vda"}]"#,
                "- op: add\n  path: /machine/nodeLabels\n  value:\n    role: storage\n- op: remove\n  path: /cluster/discovery\n",
            ],
            outcome(true, true, 2, true),
        ),
        (
            "mixed-patches",
            single.clone(),
            vec![
                "machine:\n  kubelet:\n    extraArgs:\n      rotate-server-certificates: \"true\"\n",
                r#"[{"op": "add", "path": "/machine/kubelet/extraArgs/max-pods", "value": "250"}]"#,
                "machine:\n  kubelet:\n    extraArgs:\n      max-pods: \"110\"\n",
            ],
            outcome(true, true, 3, true),
        ),
        (
            "json-patch-fails",
            single,
            vec![r#"[{"op": "remove", "path": "/machine/nothing"}]"#],
            outcome(true, true, 1, false),
        ),
        (
            "json-patch-multi-document",
            CONTROLPLANE.into(),
            vec![r#"[{"op": "add", "path": "/debug", "value": true}]"#],
            outcome(true, true, 1, false),
        ),
        (
            "bad-patches",
            WORKER.into(),
            vec![
                r#"[{"op": "explode", "path": "/machine"}]"#,
                "machine:\n  nosuchkey: 1\n",
            ],
            outcome(true, true, 0, false),
        ),
        (
            "unknown-field",
            "version: v1alpha1\nmachine:\n  network:\n    hostnme: x\n".into(),
            vec![],
            outcome(false, false, 0, false),
        ),
        (
            "invalid-values",
            "version: v1alpha1\nmachine:\n  type: worker\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 10\n        addresses: [300.1.1.1/33]\n        routes:\n          - network: nope\n            gateway: 10.0.0.1\ncluster:\n  controlPlane:\n    endpoint: ftp://x\n".into(),
            vec![],
            outcome(true, false, 0, false),
        ),
        (
            "anchors-and-merge-keys",
            "version: v1alpha1\nmachine: &m\n  type: worker\n  <<: {kubelet: {image: a}}\ncluster:\n  clusterName: *m\n".into(),
            vec![],
            outcome(false, false, 0, false),
        ),
    ]
}

fn input(config: &str, patches: &[&str]) -> Vec<u8> {
    let mut parts = vec![config];
    parts.extend_from_slice(patches);
    parts.join("\0").into_bytes()
}

#[test]
fn seeds_get_as_far_as_they_should() {
    let write = std::env::var_os("FUZZ_WRITE_SEEDS").is_some();
    let dir = testkit::fuzz::fuzz_dir().join("corpus/machinery_config");
    for (name, config, patches, expected) in seeds() {
        let data = input(&config, &patches);
        assert_eq!(fuzz_config(&data), expected, "seed {name}");
        if write {
            std::fs::create_dir_all(&dir).expect("corpus directory");
            std::fs::write(dir.join(format!("seed-{name}")), &data).expect("seed written");
        }
    }
}

#[test]
fn bytes_that_are_not_text_are_replaced_not_refused() {
    assert_eq!(
        fuzz_config(b"version: v1alpha1\ndebug: \xff\n"),
        outcome(false, false, 0, false)
    );
    assert_eq!(fuzz_config(b""), outcome(true, false, 0, false));
}

#[test]
fn corpus_replays_without_panic() {
    testkit::fuzz::replay_crate(
        "machinery",
        &[("machinery_config", &|data| {
            let _ = fuzz_config(data);
        })],
    );
}
