//! etcd on a local cluster (`talosctl cluster create`, one control plane and one worker):
//! k8sd derives etcd's spec and certificates, `talosctl bootstrap` through apid makes init run
//! Debian's etcd sandboxed on the control plane; a real etcd client (etcdctl, in the node's
//! network namespace, with the node's admin certificate) writes and reads; a second bootstrap
//! is refused, a worker's too; etcd killed with SIGKILL is restarted by init and resumes from
//! its data directory. Needs root; skipped otherwise (failed under CI=true).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use machinery::resources::etcd::{EtcdMemberSpec, EtcdSpecSpec, EtcdStatusSpec, VipElectionSpec};
use machinery::resources::runtime::{ServiceSpecSpec, ServiceStatusSpec};
use node_tests::{alive, pid_namespace_members, require_root, text, Cluster, NodeInfo};

/// One cluster at a time: they share two cores with everything else.
static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until `f` returns `Some`, up to `timeout`; panics with `what` and the last state.
fn wait<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match f() {
            Ok(t) => return t,
            Err(last) if start.elapsed() > timeout => {
                panic!("{what}: not within {timeout:?}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

fn etcd_status(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    node: &NodeInfo,
) -> Result<EtcdStatusSpec, String> {
    rt.block_on(
        cluster
            .state(node)
            .get_typed::<EtcdStatusSpec>("etcd", "etcd"),
    )
    .map(|r| r.spec)
    .map_err(|e| e.to_string())
}

fn etcd_service(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    node: &NodeInfo,
) -> Result<ServiceStatusSpec, String> {
    rt.block_on(
        cluster
            .state(node)
            .get_typed::<ServiceStatusSpec>("runtime", "etcd"),
    )
    .map(|r| r.spec)
    .map_err(|e| e.to_string())
}

/// etcdctl in the node's network namespace against its local member, with the admin
/// certificate k8sd wrote into the node.
fn etcdctl(cluster: &Cluster, node: &NodeInfo, args: &[&str]) -> std::process::Output {
    let pki = format!("/proc/{}/root/system/secrets/etcd", node.init_pid.unwrap());
    let mut all = vec![
        "env".to_string(),
        "ETCDCTL_API=3".into(),
        "etcdctl".into(),
        "--endpoints=https://127.0.0.1:2379".into(),
        format!("--cacert={pki}/ca.crt"),
        format!("--cert={pki}/admin.crt"),
        format!("--key={pki}/admin.key"),
        "--command-timeout=10s".into(),
    ];
    all.extend(args.iter().map(ToString::to_string));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    cluster.in_netns(node, &all)
}

fn proc_status(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
}

/// The host PID of the process that is `pid` in the node's PID namespace.
fn host_pid(node: &NodeInfo, pid: i32) -> i32 {
    pid_namespace_members(node.init_pid.unwrap())
        .into_iter()
        .find(|p| {
            field(&proc_status(*p), "NSpid")
                .split_whitespace()
                .last()
                .is_some_and(|last| last == pid.to_string())
        })
        .unwrap_or_else(|| panic!("no process {pid} in the node"))
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map_or("", str::trim)
}

#[test]
fn bootstrap_runs_a_sandboxed_etcd_a_real_client_uses_it_and_it_survives_sigkill() {
    require_root!();
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::builder().controlplanes(1).workers(1).create();
    let nodes = cluster.nodes();
    let (cp, worker) = (&nodes[0], &nodes[1]);
    assert_eq!(cp.role, "controlplane");
    let rt = rt();
    let _rt = rt.enter();

    // Before a bootstrap the control plane waits, saying what to do, and asks for no etcd.
    let waiting = wait(
        Duration::from_secs(60),
        "etcd waits for a bootstrap",
        || {
            let s = etcd_status(&rt, &cluster, cp)?;
            (s.phase == "waiting" && s.message.contains("talosctl bootstrap"))
                .then_some(s.clone())
                .ok_or(format!("{s:?}"))
        },
    );
    assert!(waiting.message.contains(&cp.ip), "{waiting:?}");
    assert!(
        etcd_service(&rt, &cluster, cp).is_err(),
        "no etcd before a bootstrap"
    );
    let spec = rt
        .block_on(cluster.state(cp).get_typed::<EtcdSpecSpec>("etcd", "etcd"))
        .unwrap()
        .spec;
    assert_eq!(spec.name, cp.name);
    assert_eq!(
        spec.advertised_addresses,
        vec![cp.ip.parse::<std::net::IpAddr>().unwrap()]
    );

    // A worker runs no etcd and refuses a bootstrap.
    assert!(rt
        .block_on(
            cluster
                .state(worker)
                .get_typed::<EtcdSpecSpec>("etcd", "etcd")
        )
        .is_err());
    let out = cluster.talosctl(&["-n", &worker.ip, "bootstrap"]);
    assert!(!out.status.success(), "a worker bootstraps: {}", text(&out));
    assert!(text(&out).contains("runs no etcd"), "{}", text(&out));

    // The bootstrap: accepted, etcd runs and answers the quorum check.
    let out = cluster.talosctl(&["-n", &cp.ip, "bootstrap"]);
    assert!(out.status.success(), "bootstrap: {}", text(&out));
    let healthy = wait(Duration::from_secs(60), "etcd healthy", || {
        let s = etcd_status(&rt, &cluster, cp)?;
        s.healthy.then_some(s.clone()).ok_or(format!("{s:?}"))
    });
    assert_eq!(healthy.start, "bootstrap");
    assert_eq!(healthy.member_id.len(), 16, "{healthy:?}");
    // Through apid, by the type's name (its definition was accepted by stated).
    let out = cluster.talosctl(&["-n", &cp.ip, "get", "etcdstatuses"]);
    assert!(out.status.success(), "get etcdstatuses: {}", text(&out));
    assert!(text(&out).contains(&healthy.member_id), "{}", text(&out));
    let out = cluster.talosctl(&["-n", &cp.ip, "get", "etcdspecs", "-o", "json"]);
    assert!(out.status.success(), "get etcdspecs: {}", text(&out));
    let member = rt
        .block_on(
            cluster
                .state(cp)
                .get_typed::<EtcdMemberSpec>("etcd", "local"),
        )
        .unwrap()
        .spec;
    assert_eq!(member.member_id, healthy.member_id);

    // init runs it in its sandbox: its own uid, no capability, seccomp, no new privileges.
    let svc = etcd_service(&rt, &cluster, cp).unwrap();
    assert!(svc.pid > 0, "{svc:?}");
    let pid = host_pid(cp, svc.pid);
    let st = proc_status(pid);
    assert!(field(&st, "Uid").starts_with("1990001600"), "{st}");
    assert_eq!(field(&st, "CapEff"), "0000000000000000", "{st}");
    assert_eq!(field(&st, "Seccomp"), "2", "{st}");
    assert_eq!(field(&st, "NoNewPrivs"), "1", "{st}");

    // A real client with the node's admin certificate: one member, named after the node,
    // with the ID k8sd reports; a write and a read.
    let out = etcdctl(&cluster, cp, &["member", "list", "-w", "json"]);
    assert!(out.status.success(), "member list: {}", text(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members = list["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{list}");
    assert_eq!(members[0]["name"], cp.name.as_str());
    assert_eq!(
        format!("{:016x}", members[0]["ID"].as_u64().unwrap()),
        healthy.member_id
    );
    let out = etcdctl(&cluster, cp, &["put", "talos-rs/test", "kept"]);
    assert!(out.status.success(), "put: {}", text(&out));
    // Without a client certificate etcd refuses (client-cert-auth).
    let pki = format!("/proc/{}/root/system/secrets/etcd", cp.init_pid.unwrap());
    let out = cluster.in_netns(
        cp,
        &[
            "env",
            "ETCDCTL_API=3",
            "etcdctl",
            "--endpoints=https://127.0.0.1:2379",
            &format!("--cacert={pki}/ca.crt"),
            "--command-timeout=5s",
            "get",
            "talos-rs/test",
        ],
    );
    assert!(
        !out.status.success(),
        "no client certificate: {}",
        text(&out)
    );
    // etcd's CA key is not on the node's disk.
    assert!(!std::path::Path::new(&format!("{pki}/ca.key")).exists());

    // A second bootstrap is refused: the data directory is not empty.
    let out = cluster.talosctl(&["-n", &cp.ip, "bootstrap"]);
    assert!(!out.status.success(), "second bootstrap: {}", text(&out));
    assert!(text(&out).contains("not empty"), "{}", text(&out));

    // SIGKILL: init restarts it, it resumes from its data directory, the key is there.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    let again = wait(Duration::from_secs(60), "etcd restarted", || {
        let s = etcd_service(&rt, &cluster, cp)?;
        (s.pid > 0 && s.pid != svc.pid && s.restarts >= 1)
            .then_some(s.clone())
            .ok_or(format!("{s:?}"))
    });
    assert!(!alive(pid));
    assert!(again.last_exit.contains('9'), "{again:?}");
    wait(Duration::from_secs(60), "etcd healthy again", || {
        let s = etcd_status(&rt, &cluster, cp)?;
        s.healthy.then_some(()).ok_or(format!("{s:?}"))
    });
    let out = etcdctl(
        &cluster,
        cp,
        &["get", "talos-rs/test", "--print-value-only"],
    );
    assert!(out.status.success(), "get: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "kept");
    assert_eq!(
        etcd_status(&rt, &cluster, cp).unwrap().member_id,
        healthy.member_id,
        "the same member"
    );

    // A configuration whose extra arg would override a pinned flag is refused; etcd's
    // arguments stay.
    let args = || {
        rt.block_on(
            cluster
                .state(cp)
                .get_typed::<ServiceSpecSpec>("etcd", "etcd"),
        )
        .unwrap()
        .spec
        .args
    };
    let before = args();
    assert!(
        before.contains(&"--client-cert-auth=true".to_string()),
        "{before:?}"
    );
    let out = cluster.talosctl(&[
        "-n",
        &cp.ip,
        "patch",
        "machineconfig",
        "-p",
        r#"{"cluster": {"etcd": {"extraArgs": {"client-cert-auth": "false"}}}}"#,
    ]);
    assert!(
        !out.status.success(),
        "a pinned flag overridden: {}",
        text(&out)
    );
    assert!(text(&out).contains("client-cert-auth"), "{}", text(&out));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(args(), before);

    static_pods(&rt, &cluster, cp, worker);
    kubeconfig(&cluster, cp, worker);
    bootstrap_manifests_and_kubelet_files(&rt, &cluster, cp, worker);

    let out = cluster.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
}

/// `etcdctl member list -w json` on `node`: (name, hex ID, learner) of each member.
fn members(cluster: &Cluster, node: &NodeInfo) -> Result<Vec<(String, String, bool)>, String> {
    let out = etcdctl(cluster, node, &["member", "list", "-w", "json"]);
    if !out.status.success() {
        return Err(text(&out));
    }
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(list["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or_default().to_string(),
                        format!("{:016x}", m["ID"].as_u64().unwrap_or_default()),
                        m["isLearner"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

#[test]
fn three_control_planes_join_as_learners_are_promoted_and_share_the_data() {
    require_root!();
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    // The control plane endpoint is a DNS name, as most clusters have it: the cluster's
    // dnsmasq answers it (the nodes' name server by DHCP); the control planes join etcd and
    // the worker's trustd asks for its certificate through it.
    let mut cluster = Cluster::builder()
        .controlplanes(3)
        .workers(1)
        .arg("--endpoint")
        .arg("k8s.example.com")
        .create();
    let nodes = cluster.nodes();
    let cps: Vec<&NodeInfo> = nodes.iter().filter(|n| n.role == "controlplane").collect();
    let worker = nodes.iter().find(|n| n.role == "worker").unwrap();
    assert_eq!(cps.len(), 3);
    let rt = rt();
    let _rt = rt.enter();

    // Nobody runs etcd before the bootstrap: the others have no cluster to join yet.
    for cp in &cps {
        wait(Duration::from_secs(60), "etcd waits", || {
            let s = etcd_status(&rt, &cluster, cp)?;
            (s.phase == "waiting").then_some(()).ok_or(format!("{s:?}"))
        });
    }
    let out = cluster.talosctl(&["-n", &cps[0].ip, "bootstrap"]);
    assert!(out.status.success(), "bootstrap: {}", text(&out));
    let started = Instant::now();

    // The other two add themselves as learners (one at a time) and get promoted.
    let voters = wait(Duration::from_secs(120), "three voting members", || {
        let m = members(&cluster, cps[0])?;
        (m.len() == 3
            && m.iter()
                .all(|(name, _, learner)| !name.is_empty() && !learner))
        .then_some(m.clone())
        .ok_or(format!("{m:?}"))
    });
    eprintln!(
        "bootstrap -> three voting members: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for cp in &cps {
        let s = wait(Duration::from_secs(60), "healthy", || {
            let s = etcd_status(&rt, &cluster, cp)?;
            s.healthy.then_some(s.clone()).ok_or(format!("{s:?}"))
        });
        assert!(
            voters
                .iter()
                .any(|(name, id, _)| *name == cp.name && *id == s.member_id),
            "{} ({}) among {voters:?}",
            cp.name,
            s.member_id
        );
        let expected = if cp.name == cps[0].name {
            "bootstrap"
        } else {
            "join"
        };
        assert_eq!(s.start, expected, "{}", cp.name);
    }

    // Written on the first, read on the third.
    let out = etcdctl(&cluster, cps[0], &["put", "talos-rs/shared", "across"]);
    assert!(out.status.success(), "put: {}", text(&out));
    let out = etcdctl(
        &cluster,
        cps[2],
        &["get", "talos-rs/shared", "--print-value-only"],
    );
    assert!(out.status.success(), "get: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "across");

    // `talosctl etcd members` / `status` through apid (from k8sd's view, refreshed every 5 s):
    // the three voters by name and ID on any control plane; the member and its leader.
    let listed = wait(Duration::from_secs(30), "etcd members through apid", || {
        let out = cluster.talosctl(&["-n", &cps[1].ip, "etcd", "members"]);
        let t = text(&out);
        (out.status.success()
            && voters
                .iter()
                .all(|(name, id, _)| t.contains(name.as_str()) && t.contains(id.as_str()))
            && !t.contains("true"))
        .then_some(t.clone())
        .ok_or(t)
    });
    assert!(listed.starts_with("NODE"), "{listed}");
    let out = cluster.talosctl(&["-n", &cps[2].ip, "etcd", "status"]);
    assert!(out.status.success(), "etcd status: {}", text(&out));
    let third = voters
        .iter()
        .find(|(name, _, _)| *name == cps[2].name)
        .unwrap();
    assert!(text(&out).contains(&third.1), "{}", text(&out));

    // The worker's apid certificate was signed by the trustd the name led to.
    let out = cluster.talosctl(&["-n", &worker.ip, "get", "signedcertificates", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let signed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(signed["spec"]["error"], "", "{signed}");
    assert!(
        signed["spec"]["endpoint"]
            .as_str()
            .is_some_and(|e| e.starts_with("k8s.example.com")),
        "{signed}"
    );

    // The worker runs no etcd.
    assert!(etcd_service(&rt, &cluster, worker).is_err());
    assert!(etcd_status(&rt, &cluster, worker).is_err());
    for op in [
        &["etcd", "members"][..],
        &["etcd", "leave"],
        &["etcd", "defrag"],
        &["etcd", "snapshot", "/tmp/talos-rs-never.db"],
    ] {
        let out = cluster.talosctl(&[&["-n", worker.ip.as_str()][..], op].concat());
        assert!(!out.status.success(), "{op:?}: {}", text(&out));
        assert!(
            text(&out).contains("does not run on this node"),
            "{op:?}: {}",
            text(&out)
        );
    }

    // `talosctl health` over the four nodes: every check passes, as upstream's lines say.
    let all: Vec<&str> = nodes.iter().map(|n| n.ip.as_str()).collect();
    let all = all.join(",");
    let out = cluster.talosctl(&["-n", &all, "health", "--wait-timeout", "60s"]);
    assert!(out.status.success(), "health: {}", text(&out));
    for line in [
        "waiting for apid to be ready: OK",
        "waiting for etcd to be healthy: OK",
        "waiting for etcd members to be consistent across nodes: OK",
        "waiting for etcd members to be control plane nodes: OK",
        "waiting for the control plane static pods to be rendered: OK",
    ] {
        assert!(text(&out).contains(line), "{line}: {}", text(&out));
    }
    // The same checks with a talosconfig of two roles (one multi-valued Organization, as
    // upstream writes it), neither of them admin: health reads nothing sensitive (a node's
    // machine type, not its configuration); a snapshot is for etcd:backup, a reboot is not.
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup-talosconfig");
    let out = cluster.talosctl(&[
        "-n",
        cps[0].ip.as_str(),
        "config",
        "new",
        &backup.to_string_lossy(),
        "--roles",
        "os:reader,os:etcd:backup",
    ]);
    assert!(out.status.success(), "config new: {}", text(&out));
    let as_backup = |args: &[&str]| {
        cluster
            .command()
            .env("TALOSCONFIG", &backup)
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_backup(&["config", "info"]);
    assert!(
        text(&out).contains("Roles:               os:etcd:backup, os:reader"),
        "{}",
        text(&out)
    );
    let out = as_backup(&["-n", &all, "health", "--wait-timeout", "60s"]);
    assert!(out.status.success(), "health as a reader: {}", text(&out));
    assert!(
        text(&out).contains("waiting for etcd members to be control plane nodes: OK"),
        "{}",
        text(&out)
    );
    let db = dir.path().join("backup.db");
    let out = as_backup(&[
        "-n",
        cps[0].ip.as_str(),
        "etcd",
        "snapshot",
        &db.to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "snapshot as etcd:backup: {}",
        text(&out)
    );
    let out = as_backup(&["-n", cps[0].ip.as_str(), "reboot"]);
    assert!(
        !out.status.success() && text(&out).contains("permission denied"),
        "{}",
        text(&out)
    );

    etcd_operations(&rt, &cluster, &cps, &voters);

    // After the leave and the removal, the cluster is not healthy: a non-zero exit naming etcd.
    let out = cluster.talosctl(&["-n", &all, "health", "--wait-timeout", "3s"]);
    assert!(!out.status.success(), "health: {}", text(&out));
    assert!(
        text(&out).contains("the cluster is not healthy: ") && text(&out).contains("etcd"),
        "{}",
        text(&out)
    );

    let out = cluster.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
}

/// The leader's member ID as `node`'s member reports it (hex).
fn leader(cluster: &Cluster, node: &NodeInfo) -> Result<String, String> {
    let out = etcdctl(cluster, node, &["endpoint", "status", "-w", "json"]);
    if !out.status.success() {
        return Err(text(&out));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    v[0]["Status"]["leader"]
        .as_u64()
        .map(|l| format!("{l:016x}"))
        .ok_or_else(|| text(&out))
}

/// `talosctl etcd alarm list | defrag | forfeit-leadership | remove-member | leave` against a
/// cluster of three voters (`voters`: name, ID): run by k8sd for apid, seen by etcdctl.
fn etcd_operations(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    cps: &[&NodeInfo],
    voters: &[(String, String, bool)],
) {
    let id_of = |n: &NodeInfo| {
        voters
            .iter()
            .find(|(name, _, _)| *name == n.name)
            .map(|v| v.1.clone())
            .unwrap()
    };
    let ok = |node: &NodeInfo, args: &[&str]| {
        let out = cluster.talosctl(&[&["-n", node.ip.as_str()][..], args].concat());
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        text(&out)
    };

    // No alarm is raised; a defragmentation succeeds.
    let alarms = ok(cps[0], &["etcd", "alarm", "list"]);
    assert!(alarms.starts_with("NODE"), "{alarms}");
    assert_eq!(alarms.trim().lines().count(), 1, "{alarms}");
    assert!(ok(cps[1], &["etcd", "defrag"]).contains("defragmented"));
    ok(cps[1], &["etcd", "alarm", "disarm"]);

    // snapshot: more than a few chunks (256 KiB each through stated), read back by Debian's
    // etcdctl; a worker has none to give.
    let big = "x".repeat(100_000);
    for i in 0..12 {
        let out = etcdctl(
            cluster,
            cps[0],
            &["put", &format!("talos-rs/big/{i}"), &big],
        );
        assert!(out.status.success(), "put: {}", text(&out));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("db.snapshot");
    let saved = ok(cps[1], &["etcd", "snapshot", file.to_str().unwrap()]);
    assert!(saved.contains("etcd snapshot saved to"), "{saved}");
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size > 1_200_000, "{size} bytes");
    assert!(saved.contains(&format!("({size} bytes)")), "{saved}");
    assert!(!dir.path().join("db.snapshot.part").exists());
    let status = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "etcdctl snapshot status: {}",
        text(&status)
    );
    let st: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(st["totalKey"].as_u64().unwrap() >= 13, "{st}");

    // forfeit-leadership: the leader hands it to another voter; a follower has nothing to
    // hand.
    let before = leader(cluster, cps[0]).unwrap();
    let holder = cps.iter().find(|n| id_of(n) == before).unwrap();
    let follower = cps.iter().find(|n| id_of(n) != before).unwrap();
    assert!(ok(follower, &["etcd", "forfeit-leadership"]).contains("not the leader"));
    let moved = ok(holder, &["etcd", "forfeit-leadership"]);
    assert!(moved.contains("leadership moved to"), "{moved}");
    let after = wait(Duration::from_secs(30), "a new leader", || {
        let l = leader(cluster, cps[0])?;
        (l != before).then_some(l.clone()).ok_or(l)
    });
    let new_holder = cps.iter().find(|n| id_of(n) == after).unwrap();
    assert!(
        moved.contains(new_holder.name.as_str()),
        "{moved} / {after}"
    );

    // remove-member: an unknown ID is NotFound; a known one is removed (its data untouched:
    // its etcd, removed, just stops answering as a member).
    let out = cluster.talosctl(&[
        "-n",
        &cps[0].ip,
        "etcd",
        "remove-member",
        "0123456789abcdef",
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not found"), "{}", text(&out));
    let out = cluster.talosctl(&["-n", &cps[0].ip, "etcd", "remove-member", "not-hex"]);
    assert!(!out.status.success(), "{}", text(&out));
    let third = id_of(cps[2]);
    assert!(ok(cps[0], &["etcd", "remove-member", &third]).contains("removed"));
    wait(Duration::from_secs(30), "two members", || {
        let m = members(cluster, cps[0])?;
        (m.len() == 2 && !m.iter().any(|(_, id, _)| *id == third))
            .then_some(())
            .ok_or(format!("{m:?}"))
    });

    // leave: the second node's member removed, its etcd stopped and its data removed (by the
    // one-shot wipe under etcd's uid); it stays out; the first goes on alone.
    let left = ok(cps[1], &["etcd", "leave"]);
    assert!(left.contains("left the etcd cluster"), "{left}");
    let m = members(cluster, cps[0]).unwrap();
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0].0, cps[0].name);
    let data = format!("/proc/{}/root/var/lib/etcd", cps[1].init_pid.unwrap());
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        0,
        "{data} is not empty"
    );
    wait(
        Duration::from_secs(30),
        "etcd stopped on the node that left",
        || match etcd_service(rt, cluster, cps[1]) {
            Err(_) => Ok(()),
            Ok(s) => Err(format!("{s:?}")),
        },
    );
    let s = etcd_status(rt, cluster, cps[1]).unwrap();
    assert_eq!(s.phase, "left", "{s:?}");
    assert_eq!(s.member_id, id_of(cps[1]));
    let out = cluster.talosctl(&["-n", &cps[1].ip, "bootstrap"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("left the etcd cluster"),
        "{}",
        text(&out)
    );
    // (If the member that left led, the last one elects itself first.)
    wait(Duration::from_secs(30), "a put on the last member", || {
        let out = etcdctl(cluster, cps[0], &["put", "talos-rs/alone", "still"]);
        out.status.success().then_some(()).ok_or(text(&out))
    });
    // The last voting member cannot leave.
    let out = cluster.talosctl(&["-n", &cps[0].ip, "etcd", "leave"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("only voting member"), "{}", text(&out));
}

/// `talosctl kubeconfig`: an admin kubeconfig whose certificate (CN admin, O system:masters)
/// verifies against the Kubernetes CA it carries; refused on a worker; an existing file is
/// merged into, or replaced only with --force.
fn kubeconfig(cluster: &Cluster, cp: &NodeInfo, worker: &NodeInfo) {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = cluster.talosctl(&["-n", &cp.ip, "kubeconfig", d]);
    assert!(out.status.success(), "kubeconfig: {}", text(&out));
    let path = dir.path().join("kubeconfig");
    assert!(
        text(&out).contains(path.to_str().unwrap()),
        "{}",
        text(&out)
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let v: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let context = v["current-context"].as_str().unwrap().to_string();
    assert!(context.starts_with("admin@"), "{context}");
    let server = v["clusters"][0]["cluster"]["server"].as_str().unwrap();
    assert!(
        server.starts_with("https://") && server.ends_with(":6443"),
        "{server}"
    );
    let decode = |s: &serde_yaml_ng::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(s.as_str().unwrap())
            .unwrap()
    };
    let ca = dir.path().join("ca.pem");
    let crt = dir.path().join("crt.pem");
    std::fs::write(
        &ca,
        decode(&v["clusters"][0]["cluster"]["certificate-authority-data"]),
    )
    .unwrap();
    std::fs::write(
        &crt,
        decode(&v["users"][0]["user"]["client-certificate-data"]),
    )
    .unwrap();
    let verify = std::process::Command::new("openssl")
        .args(["verify", "-purpose", "sslclient", "-CAfile"])
        .arg(&ca)
        .arg(&crt)
        .output()
        .unwrap();
    assert!(verify.status.success(), "openssl verify: {}", text(&verify));
    let subject = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(&crt)
        .output()
        .unwrap();
    let subject = text(&subject);
    assert!(
        subject.contains("O = system:masters") && subject.contains("CN = admin"),
        "{subject}"
    );
    // The CA is the cluster's Kubernetes CA: the one in the node's configuration.
    let mc = cluster.talosctl(&["-n", &cp.ip, "get", "machineconfig", "-o", "yaml"]);
    let ca_pem = std::fs::read_to_string(&ca).unwrap();
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    assert!(
        text(&mc).contains(&ca_b64),
        "the kubeconfig's CA is not cluster.ca"
    );

    // Written again: refused whole without --force; merged by default (a new key: the user
    // and context renamed); replaced with --force.
    let out = cluster.talosctl(&["-n", &cp.ip, "kubeconfig", d, "--merge=false"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("--force"), "{}", text(&out));
    let out = cluster.talosctl(&["-n", &cp.ip, "kubeconfig", d]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{context}-1")),
        "{}",
        text(&out)
    );
    let out = cluster.talosctl(&["-n", &cp.ip, "kubeconfig", d, "--merge=false", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["contexts"].as_sequence().unwrap().len(), 1);

    let out = cluster.talosctl(&["-n", &worker.ip, "kubeconfig", d, "--force"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("only available on control plane nodes"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_snapshot_recovers_etcd_on_a_fresh_cluster() {
    require_root!();
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let rt = rt();
    let _rt = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("db.snapshot");
    let healthy = |cluster: &Cluster, cp: &NodeInfo| {
        wait(Duration::from_secs(90), "etcd healthy", || {
            let s = etcd_status(&rt, cluster, cp)?;
            s.healthy.then_some(s.clone()).ok_or(format!("{s:?}"))
        })
    };

    // A cluster with data, and its snapshot.
    let mut first = Cluster::builder().controlplanes(1).workers(0).create();
    let cp = first.nodes()[0].clone();
    let out = first.talosctl(&["-n", &cp.ip, "bootstrap"]);
    assert!(out.status.success(), "bootstrap: {}", text(&out));
    healthy(&first, &cp);
    let out = etcdctl(&first, &cp, &["put", "talos-rs/recovered", "yes"]);
    assert!(out.status.success(), "put: {}", text(&out));
    let out = first.talosctl(&["-n", &cp.ip, "etcd", "snapshot", file.to_str().unwrap()]);
    assert!(out.status.success(), "snapshot: {}", text(&out));
    let out = first.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));

    // A fresh cluster recovers from it: uploaded, restored by etcdctl under etcd's uid, the
    // member moved into place, etcd resumes from it as a one-member cluster of this node.
    let mut second = Cluster::builder().controlplanes(1).workers(0).create();
    let cp = second.nodes()[0].clone();
    wait(Duration::from_secs(60), "etcd waits", || {
        let s = etcd_status(&rt, &second, &cp)?;
        (s.phase == "waiting").then_some(()).ok_or(format!("{s:?}"))
    });
    let out = second.talosctl(&[
        "-n",
        &cp.ip,
        "bootstrap",
        "--recover-from",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "bootstrap --recover-from: {}",
        text(&out)
    );
    assert!(text(&out).contains("uploaded"), "{}", text(&out));
    let s = healthy(&second, &cp);
    assert_eq!(s.start, "resume", "{s:?}");
    let out = etcdctl(
        &second,
        &cp,
        &["get", "talos-rs/recovered", "--print-value-only"],
    );
    assert!(out.status.success(), "get: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
    let m = members(&second, &cp).unwrap();
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0].0, cp.name);
    assert_eq!(m[0].1, s.member_id);
    // The uploaded file is gone once restored; the one-shot services are too.
    let recover_dir = format!("/proc/{}/root/var/lib/etcd-recover", cp.init_pid.unwrap());
    assert_eq!(
        std::fs::read_dir(&recover_dir).unwrap().count(),
        0,
        "{recover_dir} is not empty"
    );
    wait(
        Duration::from_secs(30),
        "the restore services removed",
        || {
            let specs = rt
                .block_on(second.state(&cp).list_typed::<ServiceSpecSpec>("etcd"))
                .map_err(|e| e.to_string())?;
            let ids: Vec<String> = specs.iter().map(|s| s.id().to_string()).collect();
            (ids == ["etcd"]).then_some(()).ok_or(format!("{ids:?}"))
        },
    );
    // Recovering again: the data directory is not empty.
    let out = second.talosctl(&[
        "-n",
        &cp.ip,
        "bootstrap",
        "--recover-from",
        file.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not empty"), "{}", text(&out));
    let out = second.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
}

/// The static pod list the node serves (`StaticPodServerStatuses` URL, fetched by curl in the
/// node's network namespace): (pod name, its command).
fn pod_list(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    node: &NodeInfo,
) -> Result<Vec<(String, Vec<String>)>, String> {
    let status = rt
        .block_on(
            cluster
                .state(node)
                .get_typed::<machinery::resources::k8s::StaticPodServerStatusSpec>(
                    "k8s",
                    "static-pod-server-status",
                ),
        )
        .map_err(|e| e.to_string())?;
    let url = status.spec.url;
    let out = cluster.in_netns(node, &["curl", "-sf", "--max-time", "5", &url]);
    if !out.status.success() {
        return Err(format!("curl {url}: {}", text(&out)));
    }
    let list: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    if list["kind"] != "PodList" {
        return Err(format!("not a PodList: {list:?}"));
    }
    Ok(list["items"]
        .as_sequence()
        .map(|items| {
            items
                .iter()
                .map(|p| {
                    (
                        p["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        p["spec"]["containers"][0]["command"]
                            .as_sequence()
                            .map(|c| {
                                c.iter()
                                    .filter_map(|a| a.as_str().map(str::to_string))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The control plane's static pods: three, with upstream's pinned flags, served as a PodList;
/// a denied extra arg is refused and changes nothing; an allowed one reaches the pod; a worker
/// serves an empty list.
fn static_pods(rt: &tokio::runtime::Runtime, cluster: &Cluster, cp: &NodeInfo, worker: &NodeInfo) {
    let pods = wait(Duration::from_secs(30), "three static pods", || {
        let p = pod_list(rt, cluster, cp)?;
        (p.len() == 3).then_some(p.clone()).ok_or(format!("{p:?}"))
    });
    let names: Vec<&str> = pods.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler"
        ]
    );
    let apiserver = &pods[0].1;
    assert_eq!(apiserver[0], "/usr/local/bin/kube-apiserver");
    for pinned in [
        "--etcd-servers=https://127.0.0.1:2379",
        "--tls-min-version=VersionTLS13",
        "--client-ca-file=/system/secrets/kubernetes/kube-apiserver/ca.crt",
        "--profiling=false",
    ] {
        assert!(
            apiserver.iter().any(|a| a == pinned),
            "{pinned}: {apiserver:?}"
        );
    }
    assert!(pods[1].1.iter().any(|a| a
        == "--cluster-signing-key-file=/system/secrets/kubernetes/kube-controller-manager/ca.key"));
    assert!(pods[2]
        .1
        .iter()
        .any(|a| a == "--config=/system/config/kubernetes/kube-scheduler/scheduler-config.yaml"));

    // Through apid: the types are defined (stated took k8sd's definitions).
    for (t, id) in [
        ("staticpods", "kube-scheduler"),
        ("schedulerconfigs", "final-kube-scheduler"),
        ("apiserverconfigs", "final-kube-apiserver"),
    ] {
        let out = cluster.talosctl(&["-n", &cp.ip, "get", t]);
        assert!(out.status.success(), "get {t}: {}", text(&out));
        assert!(text(&out).contains(id), "get {t}: {}", text(&out));
    }

    // A denied extra arg: the configuration is refused, the pods keep their flags.
    let out = cluster.talosctl(&[
        "-n",
        &cp.ip,
        "patch",
        "machineconfig",
        "-p",
        r#"{"cluster": {"apiServer": {"extraArgs": {"etcd-servers": "https://10.0.0.66:2379"}}}}"#,
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("etcd-servers"), "{}", text(&out));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(pod_list(rt, cluster, cp).unwrap(), pods);

    // An allowed one: in the pod's flags.
    let out = cluster.talosctl(&[
        "-n",
        &cp.ip,
        "patch",
        "machineconfig",
        "-p",
        r#"{"cluster": {"apiServer": {"extraArgs": {"feature-gates": "TalosRsTest=true"}}}}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    wait(Duration::from_secs(30), "the extra arg in the pod", || {
        let p = pod_list(rt, cluster, cp)?;
        p[0].1
            .iter()
            .any(|a| a == "--feature-gates=TalosRsTest=true")
            .then_some(())
            .ok_or(format!("{:?}", p[0].1))
    });

    // The kubelet's spec: its staticPodURL is the server's, the node's name, upstream's
    // flags (rendered, not run), through apid too.
    let url = rt
        .block_on(
            cluster
                .state(cp)
                .get_typed::<machinery::resources::k8s::StaticPodServerStatusSpec>(
                    "k8s",
                    "static-pod-server-status",
                ),
        )
        .unwrap()
        .spec
        .url;
    for node in [cp, worker] {
        let spec = wait(Duration::from_secs(30), "the kubelet's spec", || {
            rt.block_on(
                cluster
                    .state(node)
                    .get_typed::<machinery::resources::k8s::KubeletSpecSpec>("k8s", "kubelet"),
            )
            .map(|s| s.spec)
            .map_err(|e| e.to_string())
        });
        assert_eq!(spec.expected_nodename, node.name);
        assert!(
            spec.args
                .contains(&format!("--hostname-override={}", node.name)),
            "{:?}",
            spec.args
        );
        assert_eq!(spec.config["kind"], "KubeletConfiguration");
        assert_eq!(spec.config["tlsMinVersion"], "VersionTLS13");
        if node.name == cp.name {
            assert_eq!(spec.config["staticPodURL"], url.as_str());
        }
    }
    let out = cluster.talosctl(&["-n", &cp.ip, "get", "kubeletspecs"]);
    assert!(out.status.success(), "get kubeletspecs: {}", text(&out));
    assert!(text(&out).contains(&cp.name), "{}", text(&out));

    // A worker renders no control plane.
    let empty = wait(Duration::from_secs(30), "the worker's list", || {
        pod_list(rt, cluster, worker)
    });
    assert!(empty.is_empty(), "{empty:?}");
}

/// Whether `node`'s eth0 has `ip/32` (`ip -o addr` in its network namespace).
fn has_vip(cluster: &Cluster, node: &NodeInfo, ip: &str) -> bool {
    let out = cluster.in_netns(node, &["ip", "-o", "-4", "addr", "show", "dev", "eth0"]);
    text(&out).contains(&format!("inet {ip}/32"))
}

/// One ping of `ip` from network namespace `netns`.
fn ping(netns: &str, ip: &str) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", netns, "ping", "-c", "1", "-W", "2", ip])
        .output()
        .unwrap()
}

/// The MAC the cluster's network (its bridge namespace) has cached for `ip`, if any.
fn cached_mac(netns: &str, ip: &str) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["-n", netns, "neigh", "show", ip])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let words: Vec<&str> = s.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "lladdr")
        .and_then(|i| words.get(i + 1))
        .map(|m| (*m).to_string())
}

fn vip_election(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    node: &NodeInfo,
    ip: &str,
) -> Result<VipElectionSpec, String> {
    rt.block_on(cluster.state(node).get_typed::<VipElectionSpec>("vip", ip))
        .map(|r| r.spec)
        .map_err(|e| e.to_string())
}

/// The control plane holding `ip` (its address on eth0 and its election say so), waiting up
/// to `timeout`; `except` is not asked.
fn vip_holder<'a>(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    cps: &[&'a NodeInfo],
    ip: &str,
    except: Option<&str>,
    timeout: Duration,
) -> &'a NodeInfo {
    wait(timeout, "one control plane holds the VIP", || {
        let holders: Vec<&&NodeInfo> = cps
            .iter()
            .filter(|n| Some(n.name.as_str()) != except)
            .filter(|n| has_vip(cluster, n, ip))
            .collect();
        match holders.as_slice() {
            [h] if vip_election(rt, cluster, h, ip).is_ok_and(|e| e.leader) => Ok(**h),
            _ => Err(format!(
                "holders: {:?}",
                holders.iter().map(|n| &n.name).collect::<Vec<_>>()
            )),
        }
    })
}

#[test]
fn the_shared_vip_is_elected_in_etcd_and_moves_when_its_holder_goes() {
    require_root!();
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::builder().controlplanes(3).workers(1).create();
    let nodes = cluster.nodes();
    let info = cluster.show();
    let cps: Vec<&NodeInfo> = nodes.iter().filter(|n| n.role == "controlplane").collect();
    let worker = nodes.iter().find(|n| n.role == "worker").unwrap();
    let rt = rt();
    let _rt = rt.enter();
    // An address of the cluster's network no node has: .200 of the first node's /24.
    let vip = {
        let mut o: Vec<&str> = cps[0].ip.split('.').collect();
        o[3] = "200";
        o.join(".")
    };
    assert!(nodes.iter().all(|n| n.ip != vip));

    // The VIP in every node's configuration (upstream's `machine.network.interfaces[].vip`),
    // before etcd runs: nobody holds it yet, nobody campaigns.
    let patch = format!(
        r#"{{"machine": {{"network": {{"interfaces": [{{"interface": "eth0", "vip": {{"ip": "{vip}"}}}}]}}}}}}"#
    );
    for n in &cps {
        let out = cluster.talosctl(&["-n", &n.ip, "patch", "machineconfig", "-p", &patch]);
        assert!(out.status.success(), "patch {}: {}", n.name, text(&out));
    }
    // A worker cannot have one (upstream's validation).
    let out = cluster.talosctl(&["-n", &worker.ip, "patch", "machineconfig", "-p", &patch]);
    assert!(!out.status.success(), "a worker took a VIP: {}", text(&out));
    assert!(
        text(&out).contains("not allowed on non-controlplane nodes"),
        "{}",
        text(&out)
    );
    for n in &cps {
        wait(
            Duration::from_secs(30),
            "the VIP's election resource",
            || {
                let e = vip_election(&rt, &cluster, n, &vip)?;
                (!e.leader && !e.message.is_empty())
                    .then_some(())
                    .ok_or(format!("{e:?}"))
            },
        );
        assert!(!has_vip(&cluster, n, &vip), "{} has the VIP", n.name);
    }
    assert!(vip_election(&rt, &cluster, worker, &vip).is_err());

    let out = cluster.talosctl(&["-n", &cps[0].ip, "bootstrap"]);
    assert!(out.status.success(), "bootstrap: {}", text(&out));
    for cp in &cps {
        wait(Duration::from_secs(120), "etcd healthy", || {
            let s = etcd_status(&rt, &cluster, cp)?;
            s.healthy.then_some(()).ok_or(format!("{s:?}"))
        });
    }

    // One control plane wins: the IP on its eth0, its name in etcd under upstream's key.
    let first = vip_holder(&rt, &cluster, &cps, &vip, None, Duration::from_secs(60));
    let election = vip_election(&rt, &cluster, first, &vip).unwrap();
    assert_eq!(election.holder, first.name);
    let key = format!("talos:v1:vip:election:{vip}");
    let out = etcdctl(&cluster, cps[1], &["get", "--prefix", &key, "-w", "json"]);
    assert!(out.status.success(), "etcdctl get: {}", text(&out));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kvs = got["kvs"].as_array().cloned().unwrap_or_default();
    assert_eq!(kvs.len(), 3, "every control plane campaigns: {got}");
    let leader_kv = kvs
        .iter()
        .min_by_key(|k| k["create_revision"].as_i64().unwrap_or(i64::MAX))
        .unwrap();
    use base64::Engine as _;
    let value = base64::engine::general_purpose::STANDARD
        .decode(leader_kv["value"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&value), first.name, "{got}");
    for cp in cps.iter().filter(|c| c.name != first.name) {
        let e = wait(Duration::from_secs(30), "the others see the holder", || {
            let e = vip_election(&rt, &cluster, cp, &vip)?;
            (e.holder == first.name)
                .then_some(e.clone())
                .ok_or(format!("{e:?}"))
        });
        assert!(!e.leader && !e.lease_id.is_empty(), "{e:?}");
        assert!(!has_vip(&cluster, cp, &vip));
    }
    assert!(!has_vip(&cluster, worker, &vip));
    // Through apid, by the type's name.
    let out = cluster.talosctl(&["-n", &first.ip, "get", "vipelections"]);
    assert!(
        out.status.success() && text(&out).contains(&vip),
        "get vipelections: {}",
        text(&out)
    );
    // The cluster's network reaches it, at the holder's MAC.
    let out = ping(&info.netns, &vip);
    assert!(out.status.success(), "ping the VIP: {}", text(&out));
    assert_eq!(
        cached_mac(&info.netns, &vip).as_deref(),
        Some(first.mac.as_str())
    );

    // k8sd killed on the holder: restarted, it re-adopts its leadership (same lease); the IP
    // never leaves the node.
    let k8sd = rt
        .block_on(
            cluster
                .state(first)
                .get_typed::<ServiceStatusSpec>("runtime", "k8sd"),
        )
        .unwrap()
        .spec;
    let pid = host_pid(first, k8sd.pid);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    let killed = Instant::now();
    let mut restarted = false;
    while killed.elapsed() < Duration::from_secs(20) {
        assert!(
            has_vip(&cluster, first, &vip),
            "the VIP left its holder while k8sd restarted"
        );
        let now = rt
            .block_on(
                cluster
                    .state(first)
                    .get_typed::<ServiceStatusSpec>("runtime", "k8sd"),
            )
            .map(|r| r.spec.pid)
            .unwrap_or_default();
        let e = vip_election(&rt, &cluster, first, &vip).unwrap();
        if now != k8sd.pid && now != 0 && e.message.contains("re-adopted") {
            assert!(e.leader, "{e:?}");
            assert_eq!(e.lease_id, election.lease_id, "{e:?}");
            restarted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(restarted, "k8sd did not restart and re-adopt within 20 s");
    assert!(!alive(pid));
    for cp in cps.iter().filter(|c| c.name != first.name) {
        assert!(!has_vip(&cluster, cp, &vip), "{} took the VIP", cp.name);
    }

    // The holder reboots (`talosctl reboot`): it gives the IP up as it stops, another control
    // plane takes it and announces it (the network's cached MAC changes with no traffic).
    let out = cluster.talosctl(&["-n", &first.ip, "reboot"]);
    assert!(out.status.success(), "reboot: {}", text(&out));
    let asked = Instant::now();
    let second = vip_holder(
        &rt,
        &cluster,
        &cps,
        &vip,
        Some(&first.name),
        Duration::from_secs(60),
    );
    eprintln!(
        "VIP failover, holder rebooted: {:.2} s",
        asked.elapsed().as_secs_f64()
    );
    wait(Duration::from_secs(5), "the gratuitous ARP", || {
        let m = cached_mac(&info.netns, &vip);
        (m.as_deref() == Some(second.mac.as_str()))
            .then_some(())
            .ok_or(format!("{m:?}"))
    });

    // And it stays there: no other control plane takes it back and forth (a new certificate
    // for the holder's new address must not restart its campaign).
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        for cp in cps.iter().filter(|c| c.name != first.name) {
            assert_eq!(
                has_vip(&cluster, cp, &vip),
                cp.name == second.name,
                "the VIP flapped to {}",
                cp.name
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // The rebooted node comes back and campaigns again, behind the new holder.
    let back = wait(
        Duration::from_secs(60),
        "the rebooted node's new init",
        || {
            let info = cluster.show();
            let n = info.nodes.iter().find(|n| n.name == first.name).unwrap();
            (n.init_pid.is_some() && n.init_pid != first.init_pid && n.state == "ready")
                .then_some(info.clone())
                .ok_or(format!("{n:?}"))
        },
    );
    let first_back = back.nodes.iter().find(|n| n.name == first.name).unwrap();
    wait(
        Duration::from_secs(120),
        "the rebooted node's etcd healthy",
        || {
            let s = etcd_status(&rt, &cluster, first_back)?;
            s.healthy.then_some(()).ok_or(format!("{s:?}"))
        },
    );
    wait(
        Duration::from_secs(30),
        "the rebooted node campaigns",
        || {
            let e = vip_election(&rt, &cluster, first_back, &vip)?;
            (!e.leader && e.holder == second.name && !e.lease_id.is_empty())
                .then_some(())
                .ok_or(format!("{e:?}"))
        },
    );
    assert!(!has_vip(&cluster, first_back, &vip));

    // The new holder crashes (init killed, its link gone: the machine vanished without a
    // word): the IP moves once its lease expires.
    let crashed = back.nodes.iter().find(|n| n.name == second.name).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(crashed.init_pid.unwrap()),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let out = cluster.in_netns(crashed, &["ip", "link", "set", "eth0", "down"]);
    assert!(out.status.success(), "{}", text(&out));
    let at = Instant::now();
    let live: Vec<&NodeInfo> = back
        .nodes
        .iter()
        .filter(|n| n.role == "controlplane" && n.name != second.name)
        .collect();
    let third = vip_holder(&rt, &cluster, &live, &vip, None, Duration::from_secs(60));
    eprintln!(
        "VIP failover, holder crashed: {:.2} s (lease TTL {} s)",
        at.elapsed().as_secs_f64(),
        10
    );
    assert_ne!(third.name, second.name);
    let out = ping(&info.netns, &vip);
    assert!(
        out.status.success(),
        "ping the VIP after the crash: {}",
        text(&out)
    );
}

/// The bootstrap manifests on the control plane (upstream's IDs, the token Secret from the
/// node's `cluster.token`), none on the worker; the kubelet's bootstrap kubeconfig and CA on
/// both, 0600/0400, where `/etc/kubernetes` leads.
fn bootstrap_manifests_and_kubelet_files(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    cp: &NodeInfo,
    worker: &NodeInfo,
) {
    use std::os::unix::fs::PermissionsExt as _;
    let config = rt
        .block_on(
            cluster
                .state(cp)
                .get_typed::<machinery::resources::config::MachineConfigSpec>("config", "v1alpha1"),
        )
        .unwrap()
        .spec
        .0;
    let config: serde_json::Value = serde_yaml_ng::from_str(&config).unwrap();
    let token = config["cluster"]["token"].as_str().unwrap().to_string();
    let (id, secret) = token.split_once('.').unwrap();

    let ids = wait(Duration::from_secs(30), "the bootstrap manifests", || {
        let list = rt
            .block_on(
                cluster
                    .state(cp)
                    .list_typed::<machinery::resources::k8s::ManifestSpec>("controlplane"),
            )
            .map_err(|e| e.to_string())?;
        let ids: Vec<String> = list.iter().map(|m| m.id().to_string()).collect();
        (ids.len() == 10).then_some(list).ok_or(format!("{ids:?}"))
    });
    let names: Vec<&str> = ids.iter().map(|m| m.id()).collect();
    assert_eq!(
        names,
        [
            "00-kubelet-bootstrapping-token",
            "01-csr-approver-role-binding",
            "01-csr-node-bootstrap",
            "01-csr-renewal-role-binding",
            "05-flannel",
            "10-kube-proxy",
            "11-core-dns",
            "11-core-dns-svc",
            "11-kube-config-in-cluster",
            "11-talos-node-rbac-template",
        ]
    );
    let secret_obj = &ids[0].spec.items[0];
    assert_eq!(secret_obj["kind"], "Secret");
    assert_eq!(
        secret_obj["metadata"]["name"],
        format!("bootstrap-token-{id}")
    );
    assert_eq!(secret_obj["stringData"]["token-secret"], secret);
    let svc = &ids[7].spec.items[0];
    assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10", "{svc}");
    // Through apid, by the type's name.
    let out = cluster.talosctl(&["-n", &cp.ip, "get", "manifests"]);
    assert!(
        out.status.success() && text(&out).contains("11-core-dns-svc"),
        "get manifests: {}",
        text(&out)
    );
    assert!(rt
        .block_on(
            cluster
                .state(worker)
                .list_typed::<machinery::resources::k8s::ManifestSpec>("controlplane"),
        )
        .unwrap()
        .is_empty());

    for node in [cp, worker] {
        let root = format!("/proc/{}/root", node.init_pid.unwrap());
        // The image's link (absolute: read here as the node reads it).
        assert_eq!(
            std::fs::read_link(format!("{root}/etc/kubernetes")).unwrap(),
            std::path::Path::new("/system/kubernetes")
        );
        let path = format!("{root}/system/kubernetes/bootstrap-kubeconfig");
        let text = wait(Duration::from_secs(30), "the bootstrap kubeconfig", || {
            std::fs::read_to_string(&path).map_err(|e| e.to_string())
        });
        let kc: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(kc["users"][0]["user"]["token"], token.as_str(), "{text}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{path}");
        let ca = format!("{root}/system/kubernetes/pki/ca.crt");
        let pem = std::fs::read_to_string(&ca).unwrap();
        assert!(pem.contains("BEGIN CERTIFICATE"), "{pem}");
        assert_eq!(
            std::fs::metadata(&ca).unwrap().permissions().mode() & 0o777,
            0o400
        );
        let ca_data = kc["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .unwrap();
        use base64::Engine as _;
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(ca_data)
                .unwrap(),
            pem.as_bytes()
        );
    }
}
