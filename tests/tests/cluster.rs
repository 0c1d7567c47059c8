//! Local clusters end to end, with the real provisioner (`talosctl cluster create`): three
//! nodes with their DHCP addresses from the bridge's dnsmasq, their hostnames, their daemons,
//! reaching each other; nothing left behind by destroy — also after a create that failed or
//! died half-way; a bad config patch creating nothing. Needs root; skipped otherwise. Every
//! cluster is destroyed by its guard, also when an assertion fails.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeSet;

use cosi::ResourceSpec;
use machinery::resources::network::{AddressSpecSpec, AddressStatusSpec};
use node_tests::{
    alive, pid_namespace_members, processes_mentioning, require_root, text, Cluster, HostSnapshot,
};

/// One cluster at a time: they share two cores with everything else.
static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// stated's socket in a node (reached through /proc with `-n` when given).
const SOCKET: &str = "/run/stated/state.sock";

fn lock() -> std::sync::MutexGuard<'static, ()> {
    CLUSTERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Asserts that nothing of the cluster is left: its directory, namespaces, links, mounts,
/// processes (`pids`, and anything mentioning its directory), its talosconfig context.
fn assert_nothing_left(cluster: &Cluster, before: &HostSnapshot, pids: &BTreeSet<i32>) {
    let after = HostSnapshot::take();
    let ours: Vec<&String> = after
        .netns
        .iter()
        .filter(|n| n.starts_with(&format!("{}-", cluster.name)))
        .collect();
    assert!(ours.is_empty(), "network namespaces left: {ours:?}");
    assert_eq!(before.links, after.links, "the host's links are untouched");
    let dir = cluster.cluster_dir();
    let dir_s = dir.to_string_lossy().to_string();
    assert!(
        !after.mounts.iter().any(|m| m.contains(&dir_s)),
        "no mount under {dir_s}: {:?}",
        after.mounts
    );
    assert!(
        !after.mounts.iter().any(|m| m.contains(&cluster.name)),
        "no mount naming {}: {:?}",
        cluster.name,
        after.mounts
    );
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes left: {left:?}");
    let mentioning = processes_mentioning(&dir_s);
    assert!(mentioning.is_empty(), "processes left: {mentioning:?}");
    assert!(!dir.exists(), "{} is removed", dir.display());
    let config = std::fs::read_to_string(&cluster.talosconfig).unwrap_or_default();
    assert!(
        !config.contains(&cluster.name),
        "the talosconfig context is removed: {config}"
    );
}

/// Every process of a cluster: dnsmasq, the supervisors, and everything in the nodes' PID
/// namespaces.
fn cluster_processes(cluster: &Cluster) -> BTreeSet<i32> {
    let info = cluster.show();
    let mut pids: BTreeSet<i32> = info.dnsmasq_pid.into_iter().collect();
    for n in &info.nodes {
        pids.extend(n.supervisor_pid);
        if let Some(init) = n.init_pid {
            pids.extend(pid_namespace_members(init));
        }
    }
    pids
}

#[test]
fn three_nodes_get_dhcp_addresses_hostnames_daemons_reach_each_other_and_destroy_leaves_nothing() {
    require_root!();
    let _one = lock();
    let before = HostSnapshot::take();
    let mut cluster = Cluster::builder().controlplanes(1).workers(2).create();
    let info = cluster.show();
    let nodes = info.nodes.clone();
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        nodes.iter().map(|n| n.role.as_str()).collect::<Vec<_>>(),
        ["controlplane", "worker", "worker"]
    );
    let leases = std::fs::read_to_string(cluster.cluster_dir().join("dnsmasq.leases")).unwrap();
    let dnsmasq_log = std::fs::read_to_string(cluster.cluster_dir().join("dnsmasq.log")).unwrap();
    let manifest =
        std::fs::read_to_string(node_tests::image().join("etc/talos/daemons.yaml")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _rt = rt.enter();

    for node in &nodes {
        assert_eq!(node.state, "ready", "{node:?}");
        let init = node.init_pid.unwrap();
        assert_ne!(pid_namespace_members(init).len(), 0);

        // Its address is the one the bridge's dnsmasq leased to its MAC, applied by networkd's
        // DHCP operator (the address spec's layer), observed in the kernel.
        let lease = leases
            .lines()
            .find(|l| l.contains(&node.mac))
            .unwrap_or_else(|| panic!("no lease for {} in {leases}", node.mac));
        assert!(lease.contains(&node.ip), "{lease}");
        assert!(
            dnsmasq_log.contains(&format!("DHCPACK(br0) {} {}", node.ip, node.mac)),
            "dnsmasq acknowledged {}: {dnsmasq_log}",
            node.ip
        );
        let id = format!("eth0/{}/{}", node.ip, node.prefix);
        let state = cluster.state(node);
        let spec = rt
            .block_on(state.get_typed::<AddressSpecSpec>("network", &id))
            .unwrap();
        assert_eq!(
            serde_json::to_value(spec.spec.layer).unwrap(),
            "operator",
            "{id} comes from the DHCP operator"
        );
        rt.block_on(state.get("network", AddressStatusSpec::TYPE, &id))
            .unwrap_or_else(|e| panic!("{} observes {id}: {e}", node.name));
        let kernel =
            text(&cluster.in_netns(node, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]));
        assert!(
            kernel.contains(&format!("{}/{}", node.ip, node.prefix)),
            "{kernel}"
        );

        // Its hostname: the machine config's (HostnameSpec, what networkd asks for), the
        // kernel's in the node's UTS namespace, and networkd's observation (HostnameStatus).
        let out = cluster.talosctl(&["-n", &node.name, "get", "hostnamespec", "-o", "json"]);
        assert!(out.status.success(), "{}", text(&out));
        let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(spec["spec"]["hostname"], node.name.as_str(), "{spec}");

        // Its MachineStatus, in upstream's shape (`{.spec.status.ready}`, as upstream's docs
        // and scripts read it).
        let out = cluster.talosctl(&["-n", &node.name, "get", "machinestatus", "-o", "json"]);
        assert!(out.status.success(), "{}", text(&out));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(status["spec"]["stage"], "running", "{status}");
        assert_eq!(status["spec"]["status"]["ready"], true, "{status}");
        assert_eq!(
            status["spec"]["status"]["unmetConditions"],
            serde_json::json!([]),
            "{status}"
        );
        let uts = std::process::Command::new("nsenter")
            .args(["-t", &init.to_string(), "-u", "hostname"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&uts.stdout).trim(), node.name);
        let out = cluster.talosctl(&["-n", &node.ip, "get", "hostnamestatus", "-o", "json"]);
        assert!(out.status.success(), "{}", text(&out));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(status["spec"]["hostname"], node.name.as_str(), "{status}");

        // Its daemons: every daemon of the manifest, running and healthy, as init lists them,
        // through the endpoint's apid and the node's (NODE SERVICE STATE HEALTH LAST EVENT).
        let out = cluster.talosctl(&["-n", &node.name, "services"]);
        assert!(out.status.success(), "{}", text(&out));
        let services = String::from_utf8_lossy(&out.stdout).to_string();
        for daemon in manifest
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- name: "))
        {
            assert!(
                services.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.first() == Some(&node.ip.as_str())
                        && f.get(1) == Some(&daemon)
                        && f.get(2) == Some(&"Running")
                        && f.get(3) == Some(&"OK")
                }),
                "{}: {daemon} is running and healthy:\n{services}",
                node.name
            );
        }
    }

    // The nodes reach each other over the bridge.
    for (i, from) in nodes.iter().enumerate() {
        let to = &nodes[(i + 1) % nodes.len()];
        let out = cluster.in_netns(from, &["ping", "-c", "1", "-W", "3", &to.ip]);
        assert!(
            out.status.success(),
            "{} reaches {} ({}): {}",
            from.name,
            to.name,
            to.ip,
            text(&out)
        );
    }

    // talosctl without -n uses the context's default node (the first control plane).
    let out = cluster.talosctl(&["get", "addresses"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&nodes[0].ip),
        "{}",
        text(&out)
    );

    // Config changes on a node: validated first, diffed, nothing written on --dry-run or when
    // invalid; otherwise a compare-and-set write of the MachineConfig.
    let w = &nodes[1];
    // The full configuration, as root through /proc (--socket): apid serves only its copy
    // without secrets.
    let version = || {
        let out = cluster.talosctl(&[
            "--socket", SOCKET, "-n", &w.name, "get", "mc", "v1alpha1", "-o", "json",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["metadata"]["version"].as_u64().unwrap()
    };
    let v0 = version();
    let patch = cluster.dir().join("nameservers.yaml");
    std::fs::write(
        &patch,
        "machine:\n  network:\n    nameservers: [10.5.0.1]\n",
    )
    .unwrap();
    let at_patch = format!("@{}", patch.display());
    let out = cluster.talosctl(&[
        "-n",
        &w.name,
        "patch",
        "machineconfig",
        "--patch",
        &at_patch,
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("+    - 10.5.0.1"),
        "the diff shows the change: {}",
        text(&out)
    );
    assert_eq!(version(), v0, "--dry-run writes nothing");
    let out = cluster.talosctl(&["-n", &w.name, "patch", "mc", "-p", "machine: {type: bogus}"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not valid"), "{}", text(&out));
    assert_eq!(version(), v0, "an invalid patch writes nothing");
    let out = cluster.talosctl(&["-n", &w.name, "patch", "mc", "--patch", &at_patch]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(version(), v0 + 1);
    let original = w.dir.join("config.yaml");
    let out = cluster.talosctl(&[
        "-n",
        &w.ip,
        "apply-config",
        "-f",
        &original.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Applied configuration without a reboot (MachineConfig version"),
        "{}",
        text(&out)
    );
    assert_eq!(version(), v0 + 2);
    // Staged: kept for the next boot, listed (redacted) beside the active one.
    let out = cluster.talosctl(&[
        "-n", &w.name, "patch", "mc", "--patch", &at_patch, "--mode", "staged",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Staged configuration"),
        "{}",
        text(&out)
    );
    assert_eq!(version(), v0 + 2, "staged: the active one is unchanged");
    let out = cluster.talosctl(&["-n", &w.name, "get", "mc", "staged", "-o", "yaml"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("10.5.0.1") && text(&out).contains("******"),
        "{}",
        text(&out)
    );
    // A reboot (`talosctl reboot` through apid): the node boots again with a new init, over the
    // same overlay, and the staged configuration is the active one.
    let init_of = |c: &Cluster| {
        c.show()
            .nodes
            .into_iter()
            .find(|n| n.name == w.name)
            .and_then(|n| n.init_pid)
    };
    let before_reboot = init_of(&cluster);
    let out = cluster.talosctl(&["-n", &w.name, "reboot"]);
    assert!(out.status.success(), "{}", text(&out));
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = cluster.talosctl(&["--socket", SOCKET, "-n", &w.name, "get", "mc", "-o", "json"]);
        let now = init_of(&cluster);
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success()
            && now.is_some()
            && now != before_reboot
            && listed.contains("\"v1alpha1\"")
            && !listed.contains("\"staged\"")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "no reboot: init {now:?} (was {before_reboot:?}): {}",
            text(&out)
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert_eq!(version(), v0 + 3, "the staged configuration became active");

    let pids = cluster_processes(&cluster);
    assert!(
        pids.len() > 3 * 4,
        "dnsmasq, supervisors, inits and daemons: {pids:?}"
    );
    let out = cluster.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
    assert_nothing_left(&cluster, &before, &pids);
}

#[test]
fn failed_creates_leave_nothing_behind_and_a_bad_config_patch_creates_nothing() {
    require_root!();
    let _one = lock();
    let before = HostSnapshot::take();

    // A patch that makes the config invalid, and one that is not a patch at all: refused
    // before anything exists.
    for patch in [
        "machine: {type: bogus}",
        "@/nonexistent/patch.yaml",
        "[{\"op\": \"bogus\"}]",
    ] {
        let (cluster, out) = Cluster::builder()
            .workers(1)
            .arg("--config-patch")
            .arg(patch)
            .try_create();
        assert!(!out.status.success(), "{patch}: {}", text(&out));
        assert!(!cluster.cluster_dir().exists(), "{patch}: no state");
        assert!(!cluster.talosconfig.exists(), "{patch}: no talosconfig");
        assert_nothing_left(&cluster, &before, &BTreeSet::new());
    }

    // A create that dies half-way (as kill -9 would, after the second node's namespace and
    // veth): its objects are there, and destroy removes every one.
    let (mut cluster, out) = Cluster::builder()
        .workers(1)
        .env("TALOSCTL_CLUSTER_FAIL_AT", "node-launch:2")
        .env("TALOSCTL_CLUSTER_FAIL_MODE", "exit")
        .try_create();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cluster.cluster_dir().join("cluster.json")).unwrap())
            .unwrap();
    let netns = HostSnapshot::take().netns;
    for ns in [
        format!("{}-net", cluster.name),
        format!("{}-controlplane-1", cluster.name),
        format!("{}-worker-1", cluster.name),
    ] {
        assert!(
            netns.contains(&ns),
            "{ns} exists after the crash: {netns:?}"
        );
    }
    let mut pids = BTreeSet::new();
    pids.extend(record["dnsmasq"]["pid"].as_i64().map(|p| p as i32));
    let first = &record["nodes"][0];
    let init = first["init"]["pid"].as_i64().unwrap() as i32;
    assert!(alive(init), "the first node runs");
    pids.extend(pid_namespace_members(init));
    pids.extend(first["supervisor"]["pid"].as_i64().map(|p| p as i32));
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    let out = cluster.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
    assert_nothing_left(&cluster, &before, &pids);

    // A create that fails half-way (a node does not come up: its init cannot run) removes
    // what it made by itself.
    let broken = tempfile::tempdir().unwrap();
    let image = broken.path().join("tree");
    copy(node_tests::image(), &image);
    std::fs::write(image.join("usr/bin/init"), b"not an executable").unwrap();
    let (cluster, out) = Cluster::builder().workers(1).image(&image).try_create();
    assert!(!out.status.success(), "{}", text(&out));
    let msg = text(&out);
    assert!(msg.contains("removing what was made"), "{msg}");
    assert_nothing_left(&cluster, &before, &BTreeSet::new());
}

/// `cp -a`, for a broken copy of the image.
fn copy(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// The talosconfig's `key: value` (base64 PEM) of the current context, decoded.
fn talosconfig_pem(talosconfig: &std::path::Path, field: &str) -> String {
    use base64::Engine as _;
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(talosconfig).unwrap()).unwrap();
    let current = doc["context"].as_str().unwrap();
    let b64 = doc["contexts"][current][field].as_str().unwrap();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn apid_is_published_on_loopback_forwards_to_the_other_nodes_and_any_grpc_client_reaches_it() {
    require_root!();
    let _one = lock();
    let before = HostSnapshot::take();
    let mut cluster = Cluster::builder().controlplanes(2).workers(1).create();
    let info = cluster.show();
    let cp = &info.nodes[0];
    let cp2 = &info.nodes[1];
    let w = &info.nodes[2];
    assert_eq!(w.role, "worker");
    let api = cp.api.clone().expect("the node's API is published");
    assert!(api.starts_with("127.0.0.1:"), "{api}");

    // talosctl with the talosconfig cluster create wrote: through apid, mutual TLS 1.3.
    let out = cluster.talosctl(&["version"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    for want in [
        "Client:",
        "Server:",
        &format!("NODE:        {}", cp.ip),
        "Tag:         v0.1.0",
        "OS/Arch:     linux/amd64",
        "Enabled:     RBAC",
    ] {
        assert!(printed.contains(want), "{want:?} in:\n{printed}");
    }
    // Three nodes in one call, two by name: the endpoint's apid (sandboxed, landlock allowing
    // TCP connects to 50000 only) forwards to the others over the cluster's bridge with its
    // impersonator certificate; each reply names its node. The worker's apid serves with the
    // certificate the first control plane's trustd signed for the CSR of its secretsd.
    let nodes = format!("{},{},{}", cp.ip, cp2.name, w.name);
    let out = cluster.talosctl(&["version", "--short", "-n", &nodes]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let at = |ip: &str| printed.find(&format!("NODE:        {ip}"));
    let (first, second, third) = (at(&cp.ip), at(&cp2.ip), at(&w.ip));
    assert!(
        first.is_some() && second.is_some() && third.is_some() && first < second && second < third,
        "the three nodes, in order:\n{printed}"
    );
    assert_eq!(
        printed.matches("Tag:         v0.1.0").count(),
        3,
        "{printed}"
    );
    // Every per-node command goes through the endpoint's apid, one call per node (`node`
    // metadata), with a NODE column: resources, services, logs.
    let both = format!("{},{}", cp2.name, w.name);
    let out = cluster.talosctl(&["-n", &both, "get", "hostnamestatus"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(printed.starts_with("NODE "), "{printed}");
    for (ip, name) in [(&cp2.ip, &cp2.name), (&w.ip, &w.name)] {
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with(ip.as_str()) && l.trim_end().ends_with(name.as_str())),
            "{ip} {name} in:\n{printed}"
        );
    }
    let out = cluster.talosctl(&["-n", &w.name, "services"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        printed.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 4 && f[0] == w.ip && f[1] == "trustd" && f[2] == "Running" && f[3] == "OK"
        }),
        "{printed}"
    );
    let out = cluster.talosctl(&["-n", &w.name, "logs", "trustd"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("trustd signed apid's CSR"),
        "the worker's trustd log through apid: {}",
        text(&out)
    );
    let out = cluster.talosctl(&["-n", &w.name, "service", "nosuch"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no daemon or service \"nosuch\""),
        "{}",
        text(&out)
    );
    // The audit through apid (our AuditService), the worker's sandboxes as its kernel reports
    // them: trustd and secretsd at most 1.0, apid at most 2.0.
    let out = cluster.talosctl(&["-n", &w.name, "audit", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let audit: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    for (daemon, max) in [("trustd", 10), ("secretsd", 10), ("apid", 20)] {
        let d = audit
            .iter()
            .find(|d| d["daemon"] == daemon)
            .unwrap_or_else(|| panic!("{daemon} audited: {audit:?}"));
        assert_eq!(d["node"], w.ip.as_str());
        let exposure = d["exposure"].as_u64().unwrap();
        assert!(exposure <= max, "{daemon}: {exposure} > {max}");
    }
    // The machine configuration through apid is its copy without secrets, and says so.
    let out = cluster.talosctl(&["-n", &w.name, "get", "mc", "-o", "yaml"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("config-redacted"),
        "{}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("node: {}", w.ip)),
        "{}",
        text(&out)
    );

    // The worker's configuration has no CA key, its certificate chains to the OS CA anyway,
    // and trustd says which control plane signed it.
    let out = cluster.talosctl(&["-n", &w.name, "get", "signedcertificates", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let signed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(signed["spec"]["endpoint"], cp.ip.as_str(), "{signed}");
    assert_eq!(signed["spec"]["error"], "", "{signed}");
    let out = cluster.talosctl(&[
        "--socket", SOCKET, "-n", &w.name, "get", "mc", "v1alpha1", "-o", "json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let mc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mc: serde_json::Value = match mc["spec"].as_str() {
        Some(yaml) => serde_yaml_ng::from_str(yaml).unwrap(),
        None => mc["spec"].clone(),
    };
    let ca = &mc["machine"]["ca"];
    assert!(ca["crt"].as_str().is_some_and(|c| !c.is_empty()), "{mc}");
    assert!(
        ca["key"].as_str().unwrap_or("").is_empty(),
        "a worker holds no CA key: {ca}"
    );
    let out = cluster.talosctl(&["version", "-n", "nowhere"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("\"nowhere\" is not in cluster"),
        "{}",
        text(&out)
    );
    // The same through the endpoint named on the command line.
    let out = cluster.talosctl(&["version", "-e", &api, "--short"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("NODE:        {api}")),
        "{}",
        text(&out)
    );

    // Any gRPC client with the talosconfig's certificate: curl (OpenSSL, nghttp2) speaking
    // gRPC's wire format (an empty VersionRequest: a 5-byte frame). gRPC's C-core (BoringSSL)
    // cannot: it offers no Ed25519 signature scheme, and apid's certificate is Ed25519, as
    // upstream's (its key follows the OS CA's).
    let dir = cluster.dir().to_path_buf();
    let file = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_string_lossy().to_string()
    };
    let ca = file(
        "ca.pem",
        talosconfig_pem(&cluster.talosconfig, "ca").as_bytes(),
    );
    let crt = file(
        "crt.pem",
        talosconfig_pem(&cluster.talosconfig, "crt").as_bytes(),
    );
    // OpenSSL reads PKCS#8 under its standard label; upstream's talosconfig (and ours) label
    // an Ed25519 PKCS#8 key "ED25519 PRIVATE KEY".
    let key = file(
        "key.pem",
        talosconfig_pem(&cluster.talosconfig, "key")
            .replace("ED25519 PRIVATE KEY", "PRIVATE KEY")
            .as_bytes(),
    );
    let request = file("version.grpc", &[0, 0, 0, 0, 0]);
    let curl = |identity: bool| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "--http2", "--max-time", "20", "--cacert", &ca]);
        if identity {
            cmd.args(["--cert", &crt, "--key", &key]);
        }
        cmd.args([
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
            &format!("@{request}"),
            "-D",
            "-",
            &format!("https://{api}/machine.MachineService/Version"),
        ]);
        cmd.output().unwrap()
    };
    let out = curl(true);
    assert!(out.status.success(), "curl: {}", text(&out));
    let reply = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(reply.contains("grpc-status: 0"), "{reply}");
    assert!(
        reply.contains("v0.1.0") && reply.contains("amd64"),
        "{reply}"
    );
    // Without a client certificate: refused at the handshake, no answer at all.
    let out = curl(false);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("grpc-status"),
        "curl without a certificate: {}",
        text(&out)
    );

    // A reader's talosconfig from the control plane (GenerateClientConfiguration: apid makes
    // the key, secretsd signs it with the OS CA through a resource), usable at once with the
    // same endpoint: it reads, it may not reboot.
    let reader_config = dir.join("reader-talosconfig");
    let reader_path = reader_config.to_string_lossy().to_string();
    let out = cluster.talosctl(&[
        "config",
        "new",
        &reader_path,
        "--roles",
        "os:reader",
        "--crt-ttl",
        "2h",
    ]);
    assert!(out.status.success(), "config new: {}", text(&out));
    let as_reader = |args: &[&str]| {
        cluster
            .command()
            .env("TALOSCONFIG", &reader_config)
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_reader(&["config", "info"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        printed.contains("Current context:     reader@")
            && printed.contains(&format!("Endpoints:           {api}"))
            && printed.contains("Roles:               os:reader")
            && printed.contains("Certificate expires: 1 hour from now"),
        "{printed}"
    );
    let out = as_reader(&["version", "--short"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_reader(&["reboot"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("permission denied"), "{}", text(&out));
    // The kernel log is a reader's to read, but a container-mode node shares the host's
    // kernel and is not given its log: said plainly, by every node asked.
    // (By address: this talosconfig names no local cluster to look node names up in.)
    let out = as_reader(&["-n", &format!("{},{}", cp2.ip, w.ip), "dmesg"]);
    assert!(!out.status.success());
    let said = text(&out);
    assert_eq!(
        said.matches("has no kernel log of its own").count(),
        2,
        "{said}"
    );
    assert!(!said.contains("permission denied"), "{said}");
    // A reader may not make one; an existing file is not overwritten; a worker holds no CA
    // key (upstream's refusal).
    let out = as_reader(&["config", "new", &format!("{reader_path}-2")]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = cluster.talosctl(&["config", "new", &reader_path]);
    assert!(
        text(&out).contains("talosconfig file already exists"),
        "{}",
        text(&out)
    );
    let worker_path = dir.join("worker-talosconfig").to_string_lossy().to_string();
    let out = cluster.talosctl(&["-n", &w.name, "config", "new", &worker_path]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("can't be generated on worker nodes"),
        "{}",
        text(&out)
    );
    assert!(!std::path::Path::new(&worker_path).exists());

    // A connection that never says anything is closed (apid's handshake timeout), and the
    // relay lets it go: no local user can hold the published port's slots forever.
    {
        use std::io::Read as _;
        let mut silent = std::net::TcpStream::connect(&api).unwrap();
        silent
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 16];
        let n = silent.read(&mut buf);
        assert!(
            matches!(n, Ok(0))
                || n.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "a silent connection is closed: {n:?}"
        );
    }

    // Only the host's loopback: the port is not open on another address of the host.
    let port = api.rsplit(':').next().unwrap();
    let listening = text(
        &std::process::Command::new("ss")
            .args(["-Htln", &format!("sport = :{port}")])
            .output()
            .unwrap(),
    );
    assert!(
        listening.lines().all(|l| l.contains("127.0.0.1:")),
        "{listening}"
    );

    let pids = cluster_processes(&cluster);
    let out = cluster.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
    assert_nothing_left(&cluster, &before, &pids);
    assert!(
        std::net::TcpStream::connect(&api).is_err(),
        "{api} is closed with the cluster"
    );
}
