//! apid on a real node, under its own uid and sandbox: a control plane's config (upstream's own
//! secrets bundle), secretsd minting apid's certificate, apid serving mutual TLS 1.3 on
//! 127.0.0.1:50000 of the node's network namespace. An admin and a reader with certificates of
//! the OS CA: what each may do; a client without a certificate refused at the handshake. The
//! calls that go to init's control socket work (init admits apid's uid, and only it beside
//! root); even an admin gets no CA key through apid (stated refuses apid's uid the secrets it
//! does not need); a kill -9 of apid restarts it, a client reconnects, and the certificate is
//! not reissued. Needs root.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cosi::ResourceSpec as _;
use init::testing::Node;
use machinery::resources::secrets::{ApiCertsSpec, API_ID, NAMESPACE as SECRETS};
use machinery::secrets::Bundle;
use machinery::tls;
use proto::machine::machine_service_client::MachineServiceClient;
use proto::machine::ServiceRestartRequest;
use proto::state_client::StateClient;
use proto::{GetRequest, ListRequest};
use tonic::transport::Channel;
use tonic::Code;

const T: Duration = Duration::from_secs(60);
const API: &str = "127.0.0.1:50000";
const APID_UID: u32 = 1_990_000_014;

/// A channel to the node's apid as `role` (a client certificate of the OS CA), or with no
/// client certificate.
fn channel(node: &Node, bundle: &Bundle, role: Option<&str>) -> Channel {
    let identity = role.map(|r| {
        let c = bundle
            .client_certificate(&[r.to_string()], SystemTime::now(), T * 100)
            .unwrap();
        c.pem().unwrap()
    });
    let id = identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
    let config = Arc::new(tls::client_config(&[bundle.os_ca().unwrap().0], id).unwrap());
    let addr: SocketAddr = API.parse().unwrap();
    tls::channel_via(
        addr,
        "127.0.0.1",
        config,
        Duration::from_secs(5),
        node.dial(),
    )
    .unwrap()
}

fn get(ns: &str, ty: &str, id: &str) -> GetRequest {
    GetRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: id.into(),
        options: None,
    }
}

/// A control plane of upstream's own bundle, every daemon healthy, its link up.
async fn control_plane() -> (Bundle, Node) {
    let bundle = Bundle::from_yaml(support::UPSTREAM).unwrap();
    let node = Node::builder()
        .config(&support::control_plane(&bundle, "tap1", "172.20.97.2"))
        .start();
    node.wait_healthy(
        &["stated", "networkd", "blockd", "secretsd", "trustd", "apid"],
        T,
    )
    .await;
    node.in_netns(&[
        "ip", "link", "add", "tap0", "type", "veth", "peer", "name", "tap1",
    ]);
    node.in_netns(&["ip", "link", "set", "tap0", "up"]);
    (bundle, node)
}

/// Waits until apid answers Version to an admin.
async fn serving(node: &Node, admin: &Channel) {
    let end = Instant::now() + T;
    loop {
        match MachineServiceClient::new(admin.clone()).version(()).await {
            Ok(_) => return,
            Err(e) => assert!(
                Instant::now() < end,
                "apid does not answer: {e:?}\n{}",
                node.log_text()
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apid_serves_each_role_what_it_may_through_its_sandbox_and_survives_a_kill_9() {
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let (bundle, node) = control_plane().await;
    let admin = channel(&node, &bundle, Some("os:admin"));
    let reader = channel(&node, &bundle, Some("os:reader"));
    serving(&node, &admin).await;

    // init's control socket: root's, its group apid's, 0660.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(node.root.join("run/init/init.sock")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (0, APID_UID, 0o660)
    );

    // Through apid to init: the services, apid among them, as the kernel sees them.
    let list = MachineServiceClient::new(reader.clone())
        .service_list(())
        .await
        .unwrap()
        .into_inner();
    let services = &list.messages[0].services;
    let apid = services.iter().find(|s| s.id == "apid").unwrap();
    assert_eq!(apid.state, "Running", "{apid:?}");
    assert!(services.iter().any(|s| s.id == "stated"), "{services:?}");
    // A reader may not restart a service; an admin may.
    let restart = || ServiceRestartRequest {
        id: "networkd".into(),
    };
    let e = MachineServiceClient::new(reader.clone())
        .service_restart(restart())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let before = node.service("networkd").await.unwrap();
    MachineServiceClient::new(admin.clone())
        .service_restart(restart())
        .await
        .unwrap();
    node.wait_until("networkd restarted through apid", T, |l| {
        l.iter()
            .any(|s| s.id == "networkd" && s.healthy && s.pid != before.pid)
    })
    .await;

    // A reader: no sensitive type, not even apid's own certificate.
    let e = StateClient::new(reader.clone())
        .get(get(SECRETS, ApiCertsSpec::TYPE, API_ID))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // An admin reads apid's certificate, but no CA key: stated refuses apid's uid the rest of
    // `secrets` and the full config, whoever asks.
    let api = StateClient::new(admin.clone())
        .get(get(SECRETS, ApiCertsSpec::TYPE, API_ID))
        .await
        .unwrap()
        .into_inner();
    let api = api.resource.unwrap();
    let version = api.metadata.as_ref().unwrap().version.clone();
    for (ns, ty) in [
        (SECRETS, "OSRootSecrets.secrets.talos.dev"),
        (SECRETS, "EtcdRootSecrets.secrets.talos.dev"),
        ("config", "MachineConfigs.config.talos.dev"),
    ] {
        let e = StateClient::new(admin.clone())
            .list(ListRequest {
                namespace: ns.into(),
                r#type: ty.into(),
                options: None,
            })
            .await;
        let e = match e {
            Err(e) => e,
            Ok(s) => {
                let mut s = s.into_inner();
                match s.message().await {
                    Err(e) => e,
                    Ok(r) => panic!("{ns}/{ty} read through apid: {r:?}"),
                }
            }
        };
        assert_eq!(e.code(), Code::PermissionDenied, "{ns}/{ty}: {e:?}");
    }
    // No client certificate: refused at the handshake.
    let e = MachineServiceClient::new(channel(&node, &bundle, None))
        .version(())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "{e:?}"
    );

    // kill -9: restarted by init, the same channel works again, nothing reissued.
    let old = node.service("apid").await.unwrap();
    let host = node.host_pid(old.pid).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    node.wait_until("apid restarted", T, |l| {
        l.iter().any(|s| {
            s.id == "apid" && s.healthy && s.pid != old.pid && s.restarts == old.restarts + 1
        })
    })
    .await;
    serving(&node, &admin).await;
    let again = StateClient::new(admin.clone())
        .get(get(SECRETS, ApiCertsSpec::TYPE, API_ID))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.resource.unwrap().metadata.unwrap().version,
        version,
        "apid's certificate reissued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apid_keeps_answering_with_clear_errors_while_stated_is_down() {
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let (bundle, node) = control_plane().await;
    let admin = channel(&node, &bundle, Some("os:admin"));
    serving(&node, &admin).await;

    // stated stops answering (frozen: its socket is there, nothing comes back).
    let stated = node.service("stated").await.unwrap();
    let host = nix::unistd::Pid::from_raw(node.host_pid(stated.pid).unwrap());
    nix::sys::signal::kill(host, nix::sys::signal::Signal::SIGSTOP).unwrap();
    struct Thaw(nix::unistd::Pid);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    let thaw = Thaw(host);

    // What needs only init still works, at once; a new connection too (apid holds its
    // certificate in memory).
    let fresh = channel(&node, &bundle, Some("os:reader"));
    let started = Instant::now();
    let v = MachineServiceClient::new(fresh.clone())
        .version(())
        .await
        .unwrap()
        .into_inner();
    assert!(v.messages[0].version.as_ref().unwrap().tag.starts_with('v'));
    let list = MachineServiceClient::new(fresh.clone())
        .service_list(())
        .await
        .unwrap()
        .into_inner();
    assert!(list.messages[0].services.iter().any(|s| s.id == "stated"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "Version and ServiceList waited on stated: {:?}",
        started.elapsed()
    );
    // What needs stated fails Unavailable, saying so, within the request timeout.
    let e = StateClient::new(fresh.clone())
        .get(get("network", "HostnameStatuses.net.talos.dev", "hostname"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("stated"), "{}", e.message());
    let e = MachineServiceClient::new(fresh.clone())
        .hostname(())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("stated is not answering apid"),
        "{}",
        e.message()
    );
    let e = MachineServiceClient::new(admin.clone())
        .generate_client_configuration(proto::machine::GenerateClientConfigurationRequest {
            roles: vec!["os:reader".into()],
            crt_ttl: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");

    // stated back: the same channels read again.
    drop(thaw);
    let end = Instant::now() + T;
    loop {
        match MachineServiceClient::new(fresh.clone()).hostname(()).await {
            Ok(h) => {
                assert!(!h.into_inner().messages[0].hostname.is_empty());
                break;
            }
            Err(e) => assert!(Instant::now() < end, "apid never read stated again: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
