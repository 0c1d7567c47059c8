//! Configuration patches: strategic merge (multi-document, keyed list merges, `$patch: delete`)
//! and JSON 6902 (JSON and YAML forms), applied to upstream-shaped samples.

use machinery::config::{apply_patches, Config, Patch, PatchError, ValidationMode};
use serde_yaml_ng::Value;

const CONTROLPLANE: &str = include_str!("../testdata/controlplane.yaml");
const WORKER: &str = include_str!("../testdata/worker.yaml");
const NETWORK: &str = include_str!("../testdata/network.yaml");

/// The worker sample without its trailing typed document (JSON patches need one document).
fn worker_single() -> String {
    WORKER
        .split("\n---\n")
        .next()
        .map(|s| format!("{s}\n"))
        .unwrap_or_default()
}

fn patch(text: &str) -> Patch {
    Patch::parse(text).unwrap_or_else(|e| panic!("patch does not parse: {e}"))
}

fn apply(config: &str, patches: &[&str]) -> Result<String, PatchError> {
    let patches: Vec<Patch> = patches.iter().map(|p| patch(p)).collect();
    apply_patches(config, &patches)
}

fn decode_valid(text: &str) -> Config {
    let cfg = Config::from_yaml(text)
        .unwrap_or_else(|e| panic!("patched config does not decode:\n{e}\n{text}"));
    if let Err(e) = cfg.validate(ValidationMode::Metal) {
        panic!("patched config is invalid:\n{e}\n{text}");
    }
    cfg
}

#[test]
fn strategic_merge_on_multi_document_config() {
    let out = apply(
        CONTROLPLANE,
        &["machine:\n  network:\n    hostname: cp-1\n    interfaces:\n      - interface: eth0\n        dhcp: true\n        vip:\n          ip: 10.5.0.100\n  certSANs:\n    - cp.example.com\ncluster:\n  network:\n    podSubnets: [10.32.0.0/12]\n  allowSchedulingOnControlPlanes: true\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: \"off\"\nhostname: cp-1\n---\napiVersion: v1alpha1\nkind: ResolverConfig\nnameservers:\n  - address: 1.1.1.1\n"],
    )
    .expect("patch applies");
    let cfg = decode_valid(&out);
    let machine = cfg.machine().expect("machine");
    let network = machine.network.as_ref().expect("network");
    assert_eq!(network.hostname.as_deref(), Some("cp-1"));
    assert_eq!(
        network.interfaces[0]
            .vip
            .as_ref()
            .and_then(|v| v.ip.as_deref()),
        Some("10.5.0.100")
    );
    assert_eq!(machine.cert_sans, ["cp.example.com"]);
    let cluster = cfg.cluster().expect("cluster");
    // podSubnets are replaced, not appended to.
    assert_eq!(
        cluster.network.as_ref().map(|n| n.pod_subnets.clone()),
        Some(vec!["10.32.0.0/12".to_owned()])
    );
    assert_eq!(cluster.allow_scheduling_on_control_planes, Some(true));
    // Untouched sections survive.
    assert_eq!(
        cluster
            .api_server
            .as_ref()
            .map(|a| a.admission_control.len()),
        Some(1)
    );
    let hostname = cfg
        .document("v1alpha1", "HostnameConfig", None)
        .expect("HostnameConfig");
    assert_eq!(
        hostname.value.get("auto").and_then(Value::as_str),
        Some("off")
    );
    assert_eq!(
        hostname.value.get("hostname").and_then(Value::as_str),
        Some("cp-1")
    );
    assert!(cfg.document("v1alpha1", "ResolverConfig", None).is_some());
    assert_eq!(cfg.documents.len(), 2);
}

#[test]
fn interfaces_merge_by_selector_and_vlan_id() {
    let out = apply(
        NETWORK,
        &["machine:\n  network:\n    interfaces:\n      - interface: bond0\n        vlans:\n          - vlanId: 30\n            mtu: 1400\n          - vlanId: 40\n            dhcp: true\n      - deviceSelector:\n          busPath: \"0000:00:1f.6\"\n        mtu: 1500\n      - interface: eth9\n        dummy: true\n"],
    )
    .expect("patch applies");
    let cfg = decode_valid(&out);
    let interfaces = &cfg
        .machine()
        .and_then(|m| m.network.as_ref())
        .expect("network")
        .interfaces;
    assert_eq!(interfaces.len(), 5);
    let vlans = &interfaces[0].vlans;
    assert_eq!(vlans.len(), 3);
    assert_eq!(
        (vlans[1].vlan_id, vlans[1].mtu, vlans[1].dhcp),
        (Some(30), Some(1400), Some(true))
    );
    assert_eq!(vlans[2].vlan_id, Some(40));
    assert_eq!(interfaces[1].mtu, Some(1500));
    assert_eq!(interfaces[1].dhcp, Some(true));
    assert_eq!(interfaces[4].interface.as_deref(), Some("eth9"));
}

#[test]
fn patch_delete_removes_keys_items_and_documents() {
    let out = apply(
        CONTROLPLANE,
        &["machine:\n  nodeLabels:\n    node.kubernetes.io/exclude-from-external-load-balancers:\n      $patch: delete\n  features:\n    hostDNS:\n      $patch: delete\ncluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n    auditPolicy:\n      $patch: delete\n---\napiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n"],
    )
    .expect("patch applies");
    let cfg = decode_valid(&out);
    let machine = cfg.machine().expect("machine");
    assert!(machine.node_labels.is_empty());
    assert!(machine
        .features
        .as_ref()
        .is_some_and(|f| f.host_dns.is_none() && f.kube_prism.is_some()));
    let api = cfg
        .cluster()
        .and_then(|c| c.api_server.as_ref())
        .expect("apiServer");
    assert!(api.admission_control.is_empty());
    assert!(api.audit_policy.is_none());
    assert!(api.image.is_some());
    assert!(cfg.documents.is_empty());
}

#[test]
fn patch_delete_then_readd_in_one_patch() {
    let base = "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: true\n      - interface: eth1\n        addresses: [10.3.5.4/32]\n";
    let out = apply(
        base,
        &["machine:\n  network:\n    interfaces:\n      - interface: eth0\n        $patch: delete\n      - interface: eth1\n        addresses: [10.3.5.5/32]\n      - interface: eth0\n        dummy: true\n"],
    )
    .expect("patch applies");
    let expected: Value = serde_yaml_ng::from_str(
        "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth1\n        addresses: [10.3.5.4/32, 10.3.5.5/32]\n      - interface: eth0\n        dummy: true\n",
    )
    .expect("yaml");
    let got: Value = serde_yaml_ng::from_str(&out).expect("yaml");
    assert_eq!(got, expected);
}

#[test]
fn patch_delete_of_a_missing_document_is_a_no_op() {
    // As upstream: a delete selector for a document the configuration does not have is not
    // applied, and the rest of the patch still is.
    let base = worker_single();
    let out = apply(
        &base,
        &["apiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles:\n  - mountPath: /etc/foo\n    $patch: delete\n---\nmachine:\n  network:\n    hostname: worker-1\n"],
    )
    .expect("deleting a missing document is a no-op");
    let cfg = decode_valid(&out);
    assert!(cfg.documents.is_empty(), "{out}");
    assert_eq!(
        cfg.machine()
            .and_then(|m| m.network.as_ref())
            .and_then(|n| n.hostname.as_deref()),
        Some("worker-1")
    );
    let mut expected = Config::from_yaml(&base).expect("base decodes");
    if let Some(network) = expected
        .v1alpha1
        .as_mut()
        .and_then(|d| d.machine.as_mut())
        .and_then(|m| m.network.as_mut())
    {
        network.hostname = Some("worker-1".to_owned());
    }
    assert_eq!(cfg, expected);
}

#[test]
fn extension_service_config_files_merge_by_mount_path() {
    let base = format!(
        "{}---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - content: old\n    mountPath: /usr/local/etc/nut/upsmon.conf\n  - content: keep\n    mountPath: /usr/local/etc/nut/nut.conf\nenvironment:\n  - A=1\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\naddresses:\n  - address: 10.0.0.2/24\n",
        worker_single()
    );
    let out = apply(
        &base,
        &["apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - content: new\n    mountPath: /usr/local/etc/nut/upsmon.conf\n  - content: added\n    mountPath: /usr/local/etc/nut/ups.conf\nenvironment:\n  - B=2\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\naddresses:\n  - address: 10.0.0.3/24\n"],
    )
    .expect("patch applies");
    let cfg = Config::from_yaml(&out).expect("patched config decodes");
    let ext = cfg
        .document("v1alpha1", "ExtensionServiceConfig", Some("nut-client"))
        .expect("ExtensionServiceConfig");
    let expected: Value = serde_yaml_ng::from_str(
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut-client\nconfigFiles:\n  - content: new\n    mountPath: /usr/local/etc/nut/upsmon.conf\n  - content: keep\n    mountPath: /usr/local/etc/nut/nut.conf\n  - content: added\n    mountPath: /usr/local/etc/nut/ups.conf\nenvironment:\n  - A=1\n  - B=2\n",
    )
    .expect("yaml");
    assert_eq!(Value::Mapping(ext.value.clone()), expected);
    // Lists of other kinds are still appended to, as upstream (no merge key there).
    let link = cfg
        .document("v1alpha1", "LinkConfig", Some("eth0"))
        .expect("LinkConfig");
    let addresses: Value =
        serde_yaml_ng::from_str("[{address: 10.0.0.2/24}, {address: 10.0.0.3/24}]").expect("yaml");
    assert_eq!(link.value.get("addresses"), Some(&addresses));
}

#[test]
fn extension_service_config_files_delete_then_add() {
    // Upstream's testdata/patchdelete: an item deleted by `content`, another added.
    let base = format!(
        "{}---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles:\n  - content: hello\n    mountPath: /etc/foo\nenvironment:\n  - FOO=BAR\n",
        worker_single()
    );
    let out = apply(
        &base,
        &["apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles:\n  - content: hello\n    $patch: delete\n  - content: hello2\n    mountPath: /etc/foo2\n"],
    )
    .expect("patch applies");
    let cfg = Config::from_yaml(&out).expect("patched config decodes");
    let ext = cfg
        .document("v1alpha1", "ExtensionServiceConfig", Some("foo"))
        .expect("ExtensionServiceConfig");
    let files: Value =
        serde_yaml_ng::from_str("[{content: hello2, mountPath: /etc/foo2}]").expect("yaml");
    assert_eq!(ext.value.get("configFiles"), Some(&files));
}

#[test]
fn json_patch_as_json_and_as_yaml() {
    let out = apply(
        &worker_single(),
        &[
            r#"[{"op": "add", "path": "/machine/network/hostname", "value": "worker-1"},
                {"op": "replace", "path": "/machine/install/disk", "value": "/dev/vda"}]"#,
            "- op: add\n  path: /machine/nodeLabels\n  value:\n    role: storage\n- op: remove\n  path: /cluster/discovery\n",
        ],
    )
    .expect("patches apply");
    let cfg = decode_valid(&out);
    let machine = cfg.machine().expect("machine");
    assert_eq!(
        machine.network.as_ref().and_then(|n| n.hostname.as_deref()),
        Some("worker-1")
    );
    assert_eq!(
        machine.install.as_ref().and_then(|i| i.disk.as_deref()),
        Some("/dev/vda")
    );
    assert_eq!(
        machine.node_labels.get("role").map(String::as_str),
        Some("storage")
    );
    assert!(cfg.cluster().is_some_and(|c| c.discovery.is_none()));
}

#[test]
fn json_patch_is_refused_on_multi_document_config() {
    let err = apply(
        CONTROLPLANE,
        &[r#"[{"op": "add", "path": "/debug", "value": true}]"#],
    )
    .expect_err("multi-document");
    assert!(matches!(err, PatchError::JsonPatchDocumentCount(2)));
    assert!(
        err.to_string().starts_with(
            "JSON6902 patches are not supported for multi-document machine configuration"
        ),
        "{err}"
    );
}

#[test]
fn mixed_patch_sequence() {
    let out = apply(
        &worker_single(),
        &[
            "machine:\n  kubelet:\n    extraArgs:\n      rotate-server-certificates: \"true\"\n",
            r#"[{"op": "add", "path": "/machine/kubelet/extraArgs/max-pods", "value": "250"}]"#,
            "machine:\n  kubelet:\n    extraArgs:\n      max-pods: \"110\"\n",
        ],
    )
    .expect("patches apply");
    let cfg = decode_valid(&out);
    let args = &cfg
        .machine()
        .and_then(|m| m.kubelet.as_ref())
        .expect("kubelet")
        .extra_args;
    assert_eq!(
        args.get("rotate-server-certificates").map(String::as_str),
        Some("true")
    );
    assert_eq!(args.get("max-pods").map(String::as_str), Some("110"));
}

#[test]
fn bad_patches_give_clear_errors() {
    // Unknown key in a strategic merge patch: reported with its path.
    let err = Patch::parse(
        "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtuu: 1500\n",
    )
    .expect_err("unknown key");
    let text = err.to_string();
    assert!(
        text.contains("machine.network.interfaces[0].mtuu: unknown field"),
        "{text}"
    );

    // Not a valid JSON patch operation.
    let err = Patch::parse(r#"[{"op": "explode", "path": "/machine"}]"#).expect_err("bad op");
    assert!(matches!(err, PatchError::InvalidJsonPatch(_)), "{err}");

    // Neither YAML mapping nor list.
    let err = Patch::parse("just a string").expect_err("not a patch");
    assert!(matches!(err, PatchError::InvalidStrategicMerge(_)), "{err}");

    // JSON patch path that does not exist.
    let err = apply(
        &worker_single(),
        &[r#"[{"op": "remove", "path": "/machine/nothing"}]"#],
    )
    .expect_err("missing path");
    assert!(
        err.to_string()
            .starts_with("failure applying rfc6902 patches"),
        "{err}"
    );

    // Delete of something whose parent does not exist.
    let err = apply(&worker_single(), &["machine:\n  logging:\n    destinations:\n      - endpoint: x\n        $patch: delete\n"])
        .expect_err("lookup");
    assert_eq!(
        err.to_string(),
        "patch delete: path 'machine.logging.destinations' in document 'v1alpha1': lookup failed"
    );

    // A strategic merge patch on a configuration that does not decode.
    let err = apply(
        "version: v1alpha1\nmachine:\n  tpye: worker\n",
        &["machine:\n  type: worker\n"],
    )
    .expect_err("invalid config");
    assert!(
        err.to_string().contains("machine.tpye: unknown field"),
        "{err}"
    );
}

#[test]
fn patched_result_is_revalidated_by_the_caller() {
    // A patch that decodes but makes the configuration invalid applies; validation catches it.
    let out = apply(CONTROLPLANE, &["machine:\n  type: worker\n"]).expect("applies");
    let cfg = Config::from_yaml(&out).expect("decodes");
    let errs = cfg
        .validate(ValidationMode::Metal)
        .expect_err("worker with CA keys");
    assert!(errs.has_path("machine.ca.key"), "{errs}");
    assert!(errs.has_path("cluster.etcd"), "{errs}");
}
