//! Decoding of upstream-shaped machine configurations: samples parse, every problem is reported
//! with its path, and multi-document rules hold.

use machinery::config::{Config, ConfigErrors, MachineType};

const CONTROLPLANE: &str = include_str!("../testdata/controlplane.yaml");
const WORKER: &str = include_str!("../testdata/worker.yaml");
const NETWORK: &str = include_str!("../testdata/network.yaml");

fn errors(text: &str) -> ConfigErrors {
    match Config::from_yaml(text) {
        Ok(cfg) => panic!("expected errors, decoded {cfg:?}"),
        Err(e) => e,
    }
}

fn paths(errs: &ConfigErrors) -> Vec<&str> {
    errs.errors.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn controlplane_sample_parses() {
    let cfg = Config::from_yaml(CONTROLPLANE).expect("controlplane.yaml decodes");
    assert_eq!(cfg.machine_type(), Some(MachineType::ControlPlane));
    let machine = cfg.machine().expect("machine");
    assert_eq!(machine.token.as_deref(), Some("oamejv.9tk1nhuwnlc2nghf"));
    assert!(machine.ca.as_ref().is_some_and(|ca| ca.has_key()));
    assert_eq!(
        machine
            .node_labels
            .get("node.kubernetes.io/exclude-from-external-load-balancers"),
        Some(&String::new())
    );
    let features = machine.features.as_ref().expect("features");
    assert_eq!(
        features.kube_prism.as_ref().and_then(|k| k.port),
        Some(7445)
    );
    let cluster = cfg.cluster().expect("cluster");
    assert_eq!(
        cluster
            .control_plane
            .as_ref()
            .and_then(|c| c.endpoint.as_deref()),
        Some("https://10.5.0.2:6443")
    );
    let api = cluster.api_server.as_ref().expect("apiServer");
    assert_eq!(
        api.admission_control[0].name.as_deref(),
        Some("PodSecurity")
    );
    assert!(api.audit_policy.is_some());
    assert!(cluster.etcd.as_ref().and_then(|e| e.ca.as_ref()).is_some());

    let hostname = cfg
        .document("v1alpha1", "HostnameConfig", None)
        .expect("trailing HostnameConfig document is kept");
    assert_eq!(
        hostname.value.get("auto").and_then(|v| v.as_str()),
        Some("stable")
    );
}

#[test]
fn worker_sample_parses() {
    let cfg = Config::from_yaml(WORKER).expect("worker.yaml decodes");
    assert_eq!(cfg.machine_type(), Some(MachineType::Worker));
    let machine = cfg.machine().expect("machine");
    assert!(machine
        .ca
        .as_ref()
        .is_some_and(|ca| ca.has_crt() && !ca.has_key()));
    assert_eq!(cfg.documents.len(), 1);
}

#[test]
fn network_sample_parses() {
    let cfg = Config::from_yaml(NETWORK).expect("network.yaml decodes");
    let network = cfg
        .machine()
        .and_then(|m| m.network.as_ref())
        .expect("network");
    assert_eq!(network.interfaces.len(), 4);
    let bond = network.interfaces[0].bond.as_ref().expect("bond");
    assert_eq!(bond.mode.as_deref(), Some("802.3ad"));
    assert_eq!(bond.device_selectors.len(), 2);
    assert_eq!(network.interfaces[0].vlans[1].vlan_id, Some(30));
    assert_eq!(
        network.interfaces[1]
            .device_selector
            .as_ref()
            .and_then(|s| s.bus_path.as_deref()),
        Some("0000:00:1f.6")
    );
    assert_eq!(cfg.documents_of_kind("WireguardConfig").count(), 1);
    assert_eq!(cfg.documents_of_kind("TCPProbeConfig").count(), 1);
}

#[test]
fn samples_round_trip() {
    for sample in [CONTROLPLANE, WORKER, NETWORK] {
        let cfg = Config::from_yaml(sample).expect("decodes");
        let text = cfg.to_yaml().expect("encodes");
        let again = Config::from_yaml(&text).expect("re-decodes");
        assert_eq!(cfg, again);
    }
}

/// Found by the `machinery_config` fuzz target: a v1alpha1 document with nothing set
/// (`machine: ~`) encoded as `{}`, which does not decode.
#[test]
fn empty_v1alpha1_document_round_trips() {
    for text in [
        "machine: ~\n",
        "machine: ~\ncluster: ~\ndebug: ~\n",
        "version: v1alpha1\n",
    ] {
        let cfg = Config::from_yaml(text).expect("decodes");
        assert!(cfg.v1alpha1.is_some(), "{text:?} is a v1alpha1 document");
        let encoded = cfg.to_yaml().expect("encodes");
        assert_eq!(encoded, "version: v1alpha1\n");
        let again = Config::from_yaml(&encoded).expect("re-decodes");
        assert!(again.v1alpha1.is_some());
        assert_eq!(again.to_yaml().expect("encodes"), encoded);
    }
}

#[test]
fn unknown_key_deep_in_the_tree_has_its_full_path() {
    let text = NETWORK.replace("            mtu: 1500\n", "            mtuu: 1500\n");
    assert_ne!(text, NETWORK);
    let errs = errors(&text);
    assert_eq!(
        paths(&errs),
        ["machine.network.interfaces[0].vlans[0].mtuu"]
    );
    assert!(
        errs.errors[0].message.starts_with("unknown field"),
        "{errs}"
    );
    assert!(errs.to_string().contains("did you mean `mtu`"), "{errs}");
}

#[test]
fn unknown_interface_key_is_reported() {
    let errs = errors(
        "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtuu: 1500\n",
    );
    assert_eq!(
        errs.to_string(),
        "machine.network.interfaces[0].mtuu: unknown field (did you mean `mtu`?)"
    );
}

#[test]
fn three_different_errors_are_all_reported() {
    let text = CONTROLPLANE
        .replace("    token: oamejv", "    tokn: oamejv")
        .replace("            port: 7445", "            port: seven")
        .replace(
            "        disablePodSecurityPolicy: true",
            "        disablePodSecurityPolicy: [true]",
        );
    let errs = errors(&text);
    assert_eq!(
        paths(&errs),
        [
            "machine.tokn",
            "machine.features.kubePrism.port",
            "cluster.apiServer.disablePodSecurityPolicy",
        ],
        "{errs}"
    );
    assert_eq!(errs.to_string().lines().count(), 3);
    assert!(
        errs.errors[1].message.contains("expected an integer"),
        "{errs}"
    );
    assert!(
        errs.errors[2].message.contains("expected a boolean"),
        "{errs}"
    );
}

#[test]
fn out_of_range_numbers_are_reported() {
    let errs = errors(
        "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        vlans:\n          - vlanId: 70000\n",
    );
    assert_eq!(
        paths(&errs),
        ["machine.network.interfaces[0].vlans[0].vlanId"]
    );
    assert!(errs.errors[0].message.contains("out of range"));
}

#[test]
fn yaml11_scalars_are_accepted_like_upstream() {
    let cfg = Config::from_yaml(
        "version: v1alpha1\nmachine:\n  sysctls:\n    net.core.somaxconn: 65535\n  features:\n    rbac: yes\n  files:\n    - path: /var/f\n      op: create\n      content: x\n      permissions: 0o644\n    - path: /var/g\n      op: create\n      content: y\n      permissions: 0600\n",
    )
    .expect("decodes");
    let machine = cfg.machine().expect("machine");
    assert_eq!(
        machine
            .sysctls
            .get("net.core.somaxconn")
            .map(String::as_str),
        Some("65535")
    );
    assert_eq!(machine.features.as_ref().and_then(|f| f.rbac), Some(true));
    assert_eq!(
        machine.files[0]
            .permissions
            .map(|p| p.to_string())
            .as_deref(),
        Some("0o644")
    );
    assert_eq!(machine.files[1].permissions.map(|p| p.0), Some(0o600));
}

#[test]
fn document_errors_are_reported() {
    let text = "version: v1alpha1\nmachine: {}\n---\nkind: HostnameConfig\nauto: stable\n---\napiVersion: v1alpha1\nauto: stable\n---\napiVersion: v1alpha1\nkind: Foo\nname: a\n---\napiVersion: v1alpha1\nkind: Foo\nname: a\n---\nsomething: else\n";
    let errs = errors(text);
    assert_eq!(
        paths(&errs),
        ["document[1]", "document[2]", "document[4]", "document[5]"],
        "{errs}"
    );
    let text = errs.to_string();
    assert!(text.contains("missing apiVersion"), "{text}");
    assert!(text.contains("missing kind"), "{text}");
    assert!(text.contains("duplicate document v1alpha1/Foo/a"), "{text}");
}

#[test]
fn duplicate_v1alpha1_and_bad_version_are_rejected() {
    let errs = errors("version: v1alpha1\nmachine: {}\n---\nversion: v1alpha1\ncluster: {}\n");
    assert!(
        errs.to_string().contains("duplicate document v1alpha1"),
        "{errs}"
    );
    let errs = errors("version: v1alpha2\nmachine: {}\n");
    assert_eq!(paths(&errs), ["version"]);
}

#[test]
fn errors_in_several_places_and_documents_are_collected() {
    let text = "version: v1alpha1\nmachine:\n  kubelet:\n    image: 3\n    extraArgs: [a]\n  bogus: 1\ncluster:\n  network:\n    podSubnets: 10.0.0.0/8\n---\napiVersion: v1alpha1\n";
    let errs = errors(text);
    assert_eq!(
        paths(&errs),
        [
            "machine.kubelet.extraArgs",
            "machine.bogus",
            "cluster.network.podSubnets",
            "document[1]"
        ],
        "{errs}"
    );
}

#[test]
fn syntax_errors_are_reported() {
    let errs = errors("version: v1alpha1\nmachine:\n  type: [\n");
    assert_eq!(paths(&errs), ["document[0]"]);
    assert!(errs.errors[0].message.starts_with("decode error"), "{errs}");
}

#[test]
fn empty_documents_are_skipped() {
    let cfg = Config::from_yaml("---\nversion: v1alpha1\nmachine: {type: worker}\n---\n---\n")
        .expect("decodes");
    assert_eq!(cfg.machine_type(), Some(MachineType::Worker));
}

#[test]
fn deprecated_disks_accept_bytes_and_human_sizes() {
    use machinery::config::v1alpha1::DiskSize;

    let cfg = Config::from_yaml(
        "version: v1alpha1\nmachine:\n  disks:\n    - device: /dev/sdb\n      partitions:\n        - size: 100 MB\n          mountpoint: /var/mnt/a\n        - size: 1073741824\n          mountpoint: /var/mnt/b\n",
    )
    .expect("decodes");
    let partitions = &cfg.machine().expect("machine").disks[0].partitions;
    assert_eq!(
        partitions[0].size,
        Some(DiskSize::Human("100 MB".to_owned()))
    );
    assert_eq!(partitions[1].size, Some(DiskSize::Bytes(1_073_741_824)));

    let errs =
        errors("version: v1alpha1\nmachine:\n  disks:\n    - partitions:\n        - size: [1]\n");
    assert_eq!(paths(&errs), ["machine.disks[0].partitions[0].size"]);
}
