//! Maintenance mode on a real node: init started without a machine configuration says so
//! (`MachineStatus` stage `maintenance`), apid serves the maintenance API with a self-signed
//! certificate whose fingerprint it logs, to clients without a certificate: Version and
//! non-sensitive reads yes, secrets and reboot no. `talosctl apply-config --insecure
//! --cert-fingerprint` with a wrong fingerprint is refused naming the one seen; with the right
//! one it configures the node, which leaves maintenance: from then on only clients of the OS CA
//! get in, and a second insecure apply changes nothing. Needs root.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use init::testing::Node;
use machinery::config::generate::{generate, Input};
use machinery::config::MachineType;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE};
use machinery::resources::runtime::{MachineStage, MachineStatusSpec};
use machinery::secrets::Bundle;
use machinery::tls;
use proto::machine::machine_service_client::MachineServiceClient;
use proto::machine::RebootRequest;
use proto::state_client::StateClient;
use tonic::transport::Channel;
use tonic::Code;

const T: Duration = Duration::from_secs(60);
const API: &str = "127.0.0.1:50000";
const UPSTREAM: &str = include_str!("../../machinery/tests/data/upstream-secrets.yaml");

fn channel(node: &Node, config: tls::rustls::ClientConfig) -> Channel {
    let addr: SocketAddr = API.parse().unwrap();
    tls::channel_via(
        addr,
        "127.0.0.1",
        Arc::new(config),
        Duration::from_secs(5),
        node.dial(),
    )
    .unwrap()
}

/// talosctl in the node's network namespace.
fn talosctl(node: &Node, args: &[&str]) -> Output {
    let init = node.init_host_pid().unwrap();
    Command::new("nsenter")
        .arg(format!("--net=/proc/{init}/ns/net"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_talosctl"))
        .args(args)
        .env_remove("TALOSCONFIG")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn stage(node: &Node) -> Option<MachineStage> {
    node.state()
        .get_typed::<MachineStatusSpec>("runtime", "machine")
        .await
        .ok()
        .map(|m| m.spec.stage)
}

/// The fingerprint apid logged, once it did.
async fn logged_fingerprint(node: &Node) -> String {
    let end = Instant::now() + T;
    loop {
        let log = node.log_text();
        if let Some(fp) = log
            .lines()
            .filter(|l| l.contains("maintenance mode"))
            .find_map(|l| l.split("fingerprint=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
        {
            return fp.to_string();
        }
        assert!(Instant::now() < end, "no fingerprint logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_config_serves_the_maintenance_api_until_insecure_apply_config() {
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let node = Node::builder().start();
    node.wait_healthy(
        &["stated", "networkd", "blockd", "secretsd", "trustd", "apid"],
        T,
    )
    .await;
    let end = Instant::now() + T;
    while stage(&node).await != Some(MachineStage::Maintenance) {
        assert!(Instant::now() < end, "stage {:?}", stage(&node).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fp = logged_fingerprint(&node).await;

    // No client certificate, the server pinned: the maintenance API.
    let anon = channel(
        &node,
        tls::pinned_client_config(std::slice::from_ref(&fp)).unwrap(),
    );
    let end = Instant::now() + T;
    while let Err(e) = MachineServiceClient::new(anon.clone()).version(()).await {
        assert!(Instant::now() < end, "maintenance Version: {e:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let e = MachineServiceClient::new(anon.clone())
        .reboot(RebootRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = StateClient::new(anon.clone())
        .get(proto::GetRequest {
            namespace: "secrets".into(),
            r#type: "OSRootSecrets.secrets.talos.dev".into(),
            id: "os".into(),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // Another fingerprint: refused at the handshake.
    let other = channel(
        &node,
        tls::pinned_client_config(&["AAAA".to_string()]).unwrap(),
    );
    assert!(MachineServiceClient::new(other).version(()).await.is_err());

    // kill -9 of apid: the restarted apid serves the same certificate, so the pin still holds.
    let old = node.service("apid").await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(node.host_pid(old.pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    node.wait_until("apid restarted", T, |l| {
        l.iter()
            .any(|s| s.id == "apid" && s.healthy && s.pid != old.pid)
    })
    .await;
    let end = Instant::now() + T;
    while let Err(e) = MachineServiceClient::new(anon.clone()).version(()).await {
        assert!(
            Instant::now() < end,
            "the pinned fingerprint after apid's restart: {e:?}\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        node.log_text()
            .lines()
            .any(|l| l.contains("maintenance mode")
                && l.contains("reused=true")
                && l.contains(&fp)),
        "the restarted apid says it serves the same certificate:\n{}",
        node.log_text()
    );

    // The config to apply: a control plane of upstream's bundle on the node's link.
    let config = generate(
        &Input::new("demo", "https://172.20.98.2:6443", &bundle),
        MachineType::ControlPlane,
    )
    .unwrap();
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&config.to_yaml().unwrap()).unwrap();
    doc["machine"]["network"] =
        serde_yaml_ng::from_str("interfaces: [{interface: tap1, addresses: [172.20.98.2/24]}]")
            .unwrap();
    doc["machine"]["certSANs"] = serde_yaml_ng::from_str("[127.0.0.1]").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cp.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    let file = file.to_str().unwrap();

    // talosctl: a wrong pin names the fingerprint seen, and nothing is applied.
    let out = talosctl(
        &node,
        &[
            "apply-config",
            "--insecure",
            "-n",
            "127.0.0.1",
            "--cert-fingerprint",
            "AAAA",
            "-f",
            file,
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&fp),
        "the error names what was seen: {}",
        text(&out)
    );
    let config_of = || async {
        node.state()
            .get_typed::<MachineConfigSpec>(NAMESPACE, ACTIVE_ID)
            .await
            .ok()
            .map(|r| r.metadata.version)
    };
    assert_eq!(config_of().await, None);
    let out = talosctl(
        &node,
        &[
            "apply-config",
            "--insecure",
            "-n",
            "127.0.0.1",
            "--cert-fingerprint",
            &fp,
            "-f",
            file,
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Applied configuration without a reboot"),
        "{}",
        text(&out)
    );
    let v = config_of().await.expect("the configuration is there");
    let end = Instant::now() + T;
    while stage(&node).await != Some(MachineStage::Running) {
        assert!(Instant::now() < end, "stage {:?}", stage(&node).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Out of maintenance: a client without a certificate is refused, a second insecure apply
    // changes nothing; an admin of the OS CA gets in once secretsd minted apid's certificate
    // (the node's link up, with its address).
    node.in_netns(&[
        "ip", "link", "add", "tap0", "type", "veth", "peer", "name", "tap1",
    ]);
    node.in_netns(&["ip", "link", "set", "tap0", "up"]);
    let c = bundle
        .client_certificate(&["os:admin".to_string()], SystemTime::now(), T * 100)
        .unwrap();
    let (crt, key) = c.pem().unwrap();
    let admin = channel(
        &node,
        tls::client_config(&[bundle.os_ca().unwrap().0], Some((&crt, &key))).unwrap(),
    );
    let end = Instant::now() + T;
    while let Err(e) = MachineServiceClient::new(admin.clone()).version(()).await {
        assert!(Instant::now() < end, "admin Version: {e:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let anon = channel(&node, tls::pinned_client_config(&[]).unwrap());
    assert!(MachineServiceClient::new(anon).version(()).await.is_err());
    let out = talosctl(
        &node,
        &["apply-config", "--insecure", "-n", "127.0.0.1", "-f", file],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(config_of().await, Some(v), "a second insecure apply wrote");
    // The maintenance certificate is not kept once the node is configured.
    let kept = node
        .state()
        .get(
            "apid",
            "MaintenanceServerCertificates.apid.talos.dev",
            "maintenance",
        )
        .await;
    assert!(kept.as_ref().is_err_and(|e| e.is_not_found()), "{kept:?}");
}

/// A channel without a certificate (the server pinned) to apid at `addr` in the node's
/// network namespace: a connection to 127.0.0.1 comes from 127.0.0.1, one to an address of
/// the node's link from that address.
fn anonymous_to(node: &Node, addr: &str, fp: &str) -> Channel {
    let addr: SocketAddr = addr.parse().unwrap();
    tls::channel_via(
        addr,
        &addr.ip().to_string(),
        Arc::new(tls::pinned_client_config(&[fp.to_string()]).unwrap()),
        Duration::from_secs(5),
        node.dial(),
    )
    .unwrap()
}

fn follow(id: &str) -> proto::machine::LogsRequest {
    proto::machine::LogsRequest {
        id: id.into(),
        follow: true,
        tail_lines: 1,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_anonymous_caller_cannot_keep_the_operator_out_of_maintenance() {
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let node = Node::builder().start();
    node.wait_healthy(
        &["stated", "networkd", "blockd", "secretsd", "trustd", "apid"],
        T,
    )
    .await;
    let fp = logged_fingerprint(&node).await;
    // The operator's address: the node's link (maintenance: no configuration, no DHCP here).
    node.in_netns(&[
        "ip", "link", "add", "tap0", "type", "veth", "peer", "name", "tap1",
    ]);
    node.in_netns(&["ip", "addr", "add", "172.20.96.2/24", "dev", "tap0"]);
    node.in_netns(&["ip", "link", "set", "tap0", "up"]);
    // The first connection that is answered is the greedy caller's first (kept open: one
    // closed here could still count when the next ones come).
    let end = Instant::now() + T;
    let first = loop {
        let ch = anonymous_to(&node, API, &fp);
        match MachineServiceClient::new(ch.clone()).version(()).await {
            Ok(_) => break ch,
            Err(e) => assert!(Instant::now() < end, "maintenance Version: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    // A greedy anonymous caller (127.0.0.1): every connection it may have, each with every
    // followed log and watch it may open. Its shares end short of the node's.
    let mut held = Vec::new();
    let mut conns = vec![first];
    for _ in 0..5 {
        let ch = anonymous_to(&node, API, &fp);
        match MachineServiceClient::new(ch.clone()).version(()).await {
            Ok(_) => conns.push(ch),
            Err(e) => assert!(
                matches!(
                    e.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled
                ),
                "{e:?}"
            ),
        }
    }
    assert_eq!(
        conns.len(),
        4,
        "connections without a certificate of one address"
    );
    let mut refused = None;
    for ch in &conns {
        for _ in 0..2 {
            match MachineServiceClient::new(ch.clone())
                .logs(follow("apid"))
                .await
            {
                Ok(s) => held.push(s.into_inner()),
                Err(e) => refused = Some(e),
            }
        }
    }
    assert_eq!(held.len(), 2, "followed logs of one anonymous caller");
    let e = refused.expect("a followed log past the caller's share");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("its share"), "{}", e.message());
    let mut watches = Vec::new();
    let mut refused = None;
    for _ in 0..10 {
        match StateClient::new(conns[0].clone())
            .watch(proto::WatchRequest {
                namespace: "runtime".into(),
                r#type: "MachineStatuses.runtime.talos.dev".into(),
                id: None,
                options: None,
                api_version: 1,
            })
            .await
        {
            Ok(w) => watches.push(w.into_inner()),
            Err(e) => refused = Some(e),
        }
    }
    assert_eq!(watches.len(), 8, "watches of one anonymous caller");
    assert_eq!(
        refused.map(|e| e.code()),
        Some(Code::ResourceExhausted),
        "the ninth watch"
    );

    // The operator, from its own address, gets in, follows a log, and configures the node.
    let op = anonymous_to(&node, "172.20.96.2:50000", &fp);
    MachineServiceClient::new(op.clone())
        .version(())
        .await
        .expect("the operator is answered");
    let mut log = MachineServiceClient::new(op.clone())
        .logs(follow("apid"))
        .await
        .expect("the operator follows a log")
        .into_inner();
    assert!(log.message().await.unwrap().is_some());
    let config = generate(
        &Input::new("demo", "https://172.20.96.2:6443", &bundle),
        MachineType::ControlPlane,
    )
    .unwrap();
    let r = MachineServiceClient::new(op)
        .apply_configuration(proto::machine::ApplyConfigurationRequest {
            data: config.to_yaml().unwrap().into_bytes(),
            mode: proto::machine::apply_configuration_request::Mode::Auto as i32,
            ..Default::default()
        })
        .await
        .expect("the operator's configuration is applied");
    assert!(r.into_inner().messages[0]
        .mode_details
        .contains("Applied configuration"),);
    drop((held, watches, conns));
}
