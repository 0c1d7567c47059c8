//! talosctl against a real node's init: `services`, `service <id> restart`, `logs`, `audit`,
//! `shutdown`. Each test boots a node (init, stated, networkd) in its own namespaces with
//! `init::testing`. Needs root; skipped with a message otherwise.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use cosi::{Query, ResourceSpec};
use init::testing::{Node, TestDaemon};

const T: Duration = Duration::from_secs(60);

static NODES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

macro_rules! require_root {
    () => {
        if !testkit::require_root("init's node tests switch uids, make namespaces and sandboxes") {
            return;
        }
    };
}

fn talosctl(node: &Node, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talosctl"))
        .arg("--socket")
        .arg(&node.state_socket)
        .arg("--init-socket")
        .arg(&node.init_socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// (type, id) → (created, version) of networkd's resources.
async fn networkd_resources(node: &Node) -> BTreeMap<(String, String), (Option<SystemTime>, u64)> {
    let client = node.state();
    let mut out = BTreeMap::new();
    for def in machinery::resources::network::definitions() {
        for ns in ["network", "network-config"] {
            for r in client
                .list(ns, &def.resource_type, &Query::default())
                .await
                .unwrap_or_default()
            {
                out.insert(
                    (format!("{ns}/{}", r.metadata.r#type), r.metadata.id),
                    (r.metadata.created, r.metadata.version),
                );
            }
        }
    }
    out
}

#[tokio::test]
async fn service_restart_restarts_only_that_daemon_and_recreates_none_of_its_resources() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder()
        .daemon(TestDaemon::new(
            "test-a",
            machinery::manifest::node_uid(1100),
            "test-a",
        ))
        .start();
    let before = node
        .wait_healthy(&["stated", "networkd", "test-a"], T)
        .await;
    // Let networkd converge, then remember what it owns.
    let mut owned = networkd_resources(&node).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = networkd_resources(&node).await;
        if now == owned && !now.is_empty() {
            break;
        }
        owned = now;
    }
    // Watch every kind networkd writes for the whole restart: nothing may be destroyed.
    let client = node.state();
    let mut watches = Vec::new();
    for def in machinery::resources::network::definitions() {
        for ns in ["network", "network-config"] {
            watches.push(client.watch(cosi::WatchSpec {
                namespace: ns.into(),
                r#type: def.resource_type.clone(),
                bootstrap_bookmark: true,
                ..Default::default()
            }));
        }
    }

    // Each watch starts with a no-op carrying its bookmark: once all are in, they are open.
    for w in &mut watches {
        let first = tokio::time::timeout(T, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(first.kind, cosi::EventKind::Noop);
    }

    let (sock, init_sock) = (node.state_socket.clone(), node.init_socket.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_talosctl"))
            .arg("--socket")
            .arg(sock)
            .arg("--init-socket")
            .arg(init_sock)
            .args(["service", "networkd", "restart"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("RESTARTS"), "{}", stdout(&out));
    let after = node
        .wait_until("networkd restarted and healthy", T, |l| {
            l.iter()
                .any(|s| s.id == "networkd" && s.healthy && s.restarts == 1)
        })
        .await;
    for id in ["stated", "test-a"] {
        let (a, b) = (
            before.iter().find(|s| s.id == id).unwrap(),
            after.iter().find(|s| s.id == id).unwrap(),
        );
        assert_eq!((a.pid, b.restarts), (b.pid, 0), "{id} was not touched");
    }
    let new = after.iter().find(|s| s.id == "networkd").unwrap();
    let old = before.iter().find(|s| s.id == "networkd").unwrap();
    assert_ne!(new.pid, old.pid, "networkd runs anew");
    // Give the new networkd time to reconcile everything, then compare.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = networkd_resources(&node).await;
    let created = |m: &BTreeMap<(String, String), (Option<SystemTime>, u64)>| {
        m.iter()
            .map(|(k, (c, _))| (k.clone(), *c))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        created(&owned),
        created(&now),
        "same resources, same creation times"
    );
    for w in &mut watches {
        while let Ok(Some(Ok(e))) = tokio::time::timeout(Duration::from_millis(10), w.next()).await
        {
            assert_ne!(
                e.kind,
                cosi::EventKind::Destroyed,
                "{} was destroyed during the restart",
                e.resource.metadata.id
            );
            assert_ne!(
                e.kind,
                cosi::EventKind::Created,
                "{} was created during the restart",
                e.resource.metadata.id
            );
        }
    }

    let out = talosctl(&node, &["services"]);
    assert!(out.status.success(), "{out:?}");
    let table = stdout(&out);
    for id in ["stated", "networkd", "test-a"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(id) && l.contains("running")),
            "{table}"
        );
    }
    let out = talosctl(&node, &["service", "nosuch"]);
    assert!(!out.status.success());
}

#[tokio::test]
async fn audit_reports_every_daemon_and_fails_above_the_threshold() {
    require_root!();
    let _one = NODES.lock().await;
    let node = Node::builder().start();
    node.wait_healthy(&["stated", "networkd"], T).await;
    // init publishes DaemonSecurity once each daemon is ready.
    let client = node.state();
    let deadline = std::time::Instant::now() + T;
    while client
        .list(
            "runtime",
            machinery::resources::runtime::DaemonSecuritySpec::TYPE,
            &Query::default(),
        )
        .await
        .map(|l| l.len())
        .unwrap_or(0)
        < 5
    {
        assert!(std::time::Instant::now() < deadline, "no DaemonSecurity");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let out = talosctl(&node, &["audit"]);
    assert!(out.status.success(), "{out:?}");
    let table = stdout(&out);
    let networkd = table.lines().find(|l| l.starts_with("networkd")).unwrap();
    for field in [
        "1990000011",
        "NET_ADMIN",
        "NET_RAW",
        "NET_BIND_SERVICE",
        "filter",
        "yes",
    ] {
        assert!(networkd.contains(field), "{field} in {networkd}");
    }
    let secretsd = table.lines().find(|l| l.starts_with("secretsd")).unwrap();
    assert!(
        secretsd.contains("none") && secretsd.contains("1990000012"),
        "{secretsd}"
    );
    let stated = table.lines().find(|l| l.starts_with("stated")).unwrap();
    assert!(
        stated.contains("none") && stated.contains("1990000010"),
        "{stated}"
    );

    let out = talosctl(&node, &["audit", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let daemons = v.as_array().unwrap();
    // The exposure targets (on systemd-analyze's model, 0-100 shown as N/10): stated 1.0,
    // networkd 2.0, blockd, secretsd, trustd and k8sd 1.0, apid 2.0 at most.
    for (daemon, max) in [
        ("stated", 10),
        ("networkd", 20),
        ("blockd", 10),
        ("secretsd", 10),
        ("trustd", 10),
        ("apid", 20),
        ("k8sd", 10),
    ] {
        let d = daemons.iter().find(|d| d["daemon"] == daemon).unwrap();
        let exposure = d["exposure"].as_u64().unwrap();
        assert!(
            exposure <= max,
            "{daemon}: exposure {exposure} > {max}: {d:#}"
        );
    }
    assert_eq!(daemons.len(), 7);
    let max = daemons
        .iter()
        .map(|d| d["exposure"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(daemons.iter().all(
        |d| d["observed"]["noNewPrivs"] == true && !d["checks"].as_array().unwrap().is_empty()
    ));
    // The thread count is what /proc says at the time of the call, not a snapshot of the
    // daemon's start: equal to the tasks its process has now (read right before and after).
    for d in daemons {
        let pid = d["pid"].as_i64().unwrap() as i32;
        let host = node.host_pid(pid).unwrap();
        let tasks = || {
            std::fs::read_dir(format!("/proc/{host}/task"))
                .unwrap()
                .count() as u64
        };
        let (before, reported) = (tasks(), d["threads"].as_u64().unwrap());
        let again = talosctl(&node, &["audit", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
        let now = v
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["daemon"] == d["daemon"])
            .unwrap()["threads"]
            .as_u64()
            .unwrap();
        let after = tasks();
        assert!(
            (before.min(after)..=before.max(after)).contains(&now),
            "{}: audit says {now} threads (first {reported}), /proc has {before}..{after}",
            d["daemon"]
        );
    }

    let out = talosctl(&node, &["audit", "--threshold", &(max - 1).to_string()]);
    assert_eq!(out.status.code(), Some(1), "above the threshold: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("above the threshold"));
    let out = talosctl(&node, &["audit", "--threshold", &max.to_string()]);
    assert_eq!(out.status.code(), Some(0), "at the threshold: {out:?}");

    // The control socket admits root and apid (initControl): its group is apid's, and init
    // checks the caller's uid from the kernel (SO_PEERCRED) on every request.
    let as_user = |uid: &str, gid: &str| {
        Command::new("setpriv")
            .args(["--reuid", uid, "--regid", gid, "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_talosctl"))
            .arg("--init-socket")
            .arg(&node.init_socket)
            .arg("services")
            .output()
            .unwrap()
    };
    let out = as_user("1990000014", "1990000014");
    assert!(out.status.success(), "apid's uid refused: {out:?}");
    assert!(stdout(&out).contains("apid"), "{out:?}");
    // apid's gid is not enough: the uid must be apid's.
    let out = as_user("4321", "1990000014");
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("uid 4321 may not use init's control socket (root and apid only)"),
        "{out:?}"
    );
    // Neither: the socket's mode refuses the connection.
    let out = as_user("4321", "4321");
    assert!(!out.status.success(), "{out:?}");
    // Even with the socket opened to everyone, the uid is checked.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&node.init_socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid", "4321", "--regid", "4321", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_talosctl"))
        .arg("--init-socket")
        .arg(&node.init_socket)
        .arg("services")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("uid 4321 may not use init's control socket"),
        "{err}"
    );
}

#[tokio::test]
async fn logs_tail_and_follow_and_shutdown_ends_the_node() {
    require_root!();
    let _one = NODES.lock().await;
    let mut node = Node::builder().start();
    node.wait_healthy(&["stated", "networkd"], T).await;

    let out = talosctl(&node, &["logs", "stated"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("stated ready"), "{}", stdout(&out));
    let out = talosctl(&node, &["logs", "networkd", "--tail", "1"]);
    assert_eq!(stdout(&out).lines().count(), 1, "{out:?}");

    // Follow: a restart of networkd shows up in the followed stream.
    let mut follow = Command::new(env!("CARGO_BIN_EXE_talosctl"))
        .arg("--init-socket")
        .arg(&node.init_socket)
        .args(["logs", "networkd", "-f", "--tail", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(talosctl(&node, &["service", "networkd", "restart"])
        .status
        .success());
    node.wait_until("networkd restarted", T, |l| {
        l.iter()
            .any(|s| s.id == "networkd" && s.healthy && s.restarts == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = follow.kill();
    let out = follow.wait_with_output().unwrap();
    assert!(
        stdout(&out).contains("networkd started"),
        "followed: {}",
        stdout(&out)
    );

    // The kernel log through init's control socket: a test node shares the host's /dev, so
    // init reads the host kernel's records (a local cluster's node is given no /dev/kmsg).
    let out = talosctl(&node, &["dmesg"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(!text.is_empty(), "the kernel has logged something");
    assert!(
        text.lines()
            .filter(|l| !l.starts_with(' '))
            .all(|l| l.split(": ").count() >= 3 && l.contains(": ["))
            && text.lines().next().is_some_and(|l| l.contains("]: ")),
        "upstream's record format: {}",
        &text[..text.len().min(400)]
    );

    let out = talosctl(&node, &["shutdown"]);
    assert!(out.status.success(), "{out:?}");
    let status = node.wait_exit(Duration::from_secs(30)).expect("init ended");
    assert!(status.success(), "{status:?}\n{}", node.log_text());
    assert!(node.leftovers().is_empty(), "nothing of the node runs");
}

/// No key leaves `config`: init keeps a redacted copy in `config-redacted`, networkd reads that
/// one, and a client under networkd's uid is refused `config` and finds none of the bundle's
/// keys, tokens or secrets in anything it may read.
#[tokio::test]
async fn networkd_can_read_no_secret_of_the_machine_config() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;

    use machinery::config::generate::{generate, Input};
    use machinery::config::{Config, MachineType, REDACTED};
    use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
    use machinery::secrets::Bundle;

    require_root!();
    let _one = NODES.lock().await;
    let bundle = Bundle::generate(SystemTime::now()).unwrap();
    let config = generate(
        &Input::new("demo", "https://10.5.0.2:6443", &bundle),
        MachineType::ControlPlane,
    )
    .unwrap();
    let text = config.to_yaml().unwrap();
    let c = bundle.certs.as_ref().unwrap();
    let s = bundle.secrets.as_ref().unwrap();
    let secrets: Vec<(&str, String)> = vec![
        ("os key", c.os.as_ref().unwrap().key.clone()),
        ("etcd key", c.etcd.as_ref().unwrap().key.clone()),
        ("k8s key", c.k8s.as_ref().unwrap().key.clone()),
        (
            "aggregator key",
            c.k8saggregator.as_ref().unwrap().key.clone(),
        ),
        (
            "service-account key",
            c.k8sserviceaccount.as_ref().unwrap().key.clone(),
        ),
        (
            "trustd token",
            bundle.trustdinfo.as_ref().unwrap().token.clone(),
        ),
        ("bootstrap token", s.bootstraptoken.clone()),
        ("secretbox secret", s.secretboxencryptionsecret.clone()),
        (
            "cluster secret",
            bundle.cluster.as_ref().unwrap().secret.clone(),
        ),
    ];
    for (what, value) in &secrets {
        assert!(text.contains(value.as_str()), "the config holds the {what}");
    }
    let node = Node::builder().config(&text).start();
    node.wait_healthy(&["stated", "networkd"], T).await;

    // The redacted copy: every secret replaced, the rest as it was.
    let client = node.state();
    let deadline = std::time::Instant::now() + T;
    let redacted = loop {
        match client
            .get(REDACTED_NAMESPACE, MachineConfigSpec::TYPE, ACTIVE_ID)
            .await
        {
            Ok(r) => break r,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no redacted MachineConfig: {e}\n{}", node.log_text()),
        }
    };
    let redacted: cosi::Resource<MachineConfigSpec> = cosi::Resource::from_raw(&redacted).unwrap();
    for (what, value) in &secrets {
        assert!(
            !redacted.spec.0.contains(value.as_str()),
            "the redacted copy holds the {what}"
        );
    }
    let back = Config::from_yaml(&redacted.spec.0).unwrap();
    let m = back.machine().unwrap();
    assert_eq!(m.token.as_deref(), Some(REDACTED));
    assert_eq!(m.ca.as_ref().unwrap().key.as_deref(), Some(REDACTED));
    assert_eq!(
        m.ca.as_ref().unwrap().crt,
        config.machine().unwrap().ca.as_ref().unwrap().crt,
        "certificates are no secret"
    );
    assert_eq!(back.cluster().unwrap().id, config.cluster().unwrap().id);

    // As networkd's uid (the socket's directories opened for it, as its own mount namespace
    // would): `config` is refused, and nothing it may read holds a secret.
    for dir in [node.dir(), &node.root] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let networkd_uid = 1_990_000_011;
    let as_networkd = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_talosctl"))
            .arg("--socket")
            .arg(&node.state_socket)
            .args(args)
            .env("HOME", "/nonexistent")
            .uid(networkd_uid)
            .gid(networkd_uid)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = as_networkd(&[
        "get",
        "machineconfig",
        "--namespace",
        "config",
        "-o",
        "yaml",
    ]);
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        !refused.status.success(),
        "networkd read config: {}",
        stdout(&refused)
    );
    assert!(err.to_lowercase().contains("permission"), "{err}");
    // secretsd's outputs hold the OS CA's key (the same base64 PEM as the config's): the
    // `secrets` namespace is secretsd's alone, and refused to networkd.
    let deadline = std::time::Instant::now() + T;
    let root = loop {
        match client
            .get("secrets", "OSRootSecrets.secrets.talos.dev", "os")
            .await
        {
            Ok(r) => break r,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no OSRootSecrets from secretsd: {e}\n{}", node.log_text()),
        }
    };
    let root: cosi::Resource<machinery::resources::secrets::OsRootSpec> =
        cosi::Resource::from_raw(&root).unwrap();
    assert!(root.spec.issuing_ca.is_some_and(|ca| !ca.key.is_empty()));
    for kind in [
        "osrootsecrets",
        "etcdrootsecrets",
        "apicertificates",
        "certsans",
    ] {
        let refused = as_networkd(&["get", kind, "--namespace", "secrets", "-o", "yaml"]);
        let err = String::from_utf8_lossy(&refused.stderr).into_owned();
        assert!(!refused.status.success(), "networkd read secrets/{kind}");
        assert!(err.to_lowercase().contains("permission"), "{kind}: {err}");
    }
    let mine = as_networkd(&[
        "get",
        "machineconfig",
        "--namespace",
        REDACTED_NAMESPACE,
        "-o",
        "yaml",
    ]);
    assert!(
        mine.status.success(),
        "{}",
        String::from_utf8_lossy(&mine.stderr)
    );
    assert!(stdout(&mine).contains(REDACTED));
    let mut read = 0;
    for ns in [REDACTED_NAMESPACE, "runtime", "network", "network-config"] {
        let defs = client
            .list(
                "meta",
                "ResourceDefinitions.meta.cosi.dev",
                &Query::default(),
            )
            .await
            .unwrap();
        for def in defs {
            let name = def.metadata.id.clone();
            let out = as_networkd(&["get", &name, "--namespace", ns, "-o", "json"]);
            if !out.status.success() {
                continue;
            }
            let text = stdout(&out);
            read += text.lines().count();
            for (what, value) in &secrets {
                assert!(
                    !text.contains(value.as_str()),
                    "{ns}/{name} shows networkd the {what}"
                );
            }
        }
    }
    assert!(read > 10, "networkd's uid read {read} resources");
}
