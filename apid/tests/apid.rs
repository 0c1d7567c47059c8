//! apid for real: a stated in process, secretsd's controllers minting apid's certificate from
//! upstream's own secrets bundle, apid serving on loopback over mutual TLS 1.3, and clients
//! with each role, with none, or with a foreign CA's certificate.
//!
//! Here apid reaches stated as root (the test's uid), so stated's own per-daemon grants do not
//! apply: these tests are about apid's own rules. The node tests (init/tests/apid.rs) run apid
//! under its uid and sandbox.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cosi::ResourceSpec as _;
use machinery::secrets::x509::{self, KeyAlgorithm, LeafRequest, Subject};
use machinery::secrets::Bundle;
use machinery::tls;
use proto::machine::machine_service_client::MachineServiceClient;
use proto::state_client::StateClient;
use proto::{CreateRequest, GetRequest, ListRequest, WatchRequest};
use stated::testing::Harness;
use tokio::sync::oneshot;
use tonic::Code;

const UPSTREAM: &str = include_str!("../../machinery/tests/data/upstream-secrets.yaml");
const T: Duration = Duration::from_secs(30);

struct Node {
    _harness: Harness,
    addr: SocketAddr,
    bundle: Bundle,
    _stop: (oneshot::Sender<()>, oneshot::Sender<()>),
}

async fn node() -> Node {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    node_at("127.0.0.1", "cp-1", port).await
}

/// A control plane `hostname` whose apid listens on `ip`:`port` and forwards to other nodes'
/// `port`; every node of a test is made from the same bundle (one cluster).
async fn node_at(ip: &str, hostname: &str, port: u16) -> Node {
    node_with(ip, hostname, port, tls::Limits::default()).await
}

/// [`node_at`] with apid's connection `limits`.
async fn node_with(ip: &str, hostname: &str, port: u16, limits: tls::Limits) -> Node {
    let harness = Harness::start().await;
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let stop_secretsd =
        secretsd::testing::control_plane_named(&harness.client, &bundle, hostname, &[ip]).await;
    let addr = SocketAddr::new(ip.parse().unwrap(), port);
    let (stop_apid, rx) = oneshot::channel::<()>();
    let config = apid::run::Config {
        socket: harness.socket.clone(),
        // No init here: the calls that need it say so.
        init_socket: harness.socket.with_file_name("no-init.sock"),
        listen: addr,
        limits,
        peer_port: port,
    };
    tokio::spawn(async move { apid::run::run(config, || {}, rx).await.unwrap() });
    let end = Instant::now() + T;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < end, "apid never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Node {
        _harness: harness,
        addr,
        bundle,
        _stop: (stop_secretsd, stop_apid),
    }
}

/// A port free on 127.0.0.1, .2 and .3 (the last stays unused: a node that is down).
fn shared_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if ["127.0.0.2", "127.0.0.3"]
            .iter()
            .all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok())
        {
            return port;
        }
    }
}

impl Node {
    fn os_ca(&self) -> x509::Certificate {
        self.bundle.os_ca().unwrap().0
    }

    /// A client certificate of the OS CA with `role`.
    fn identity(&self, role: &str) -> (String, String) {
        let c = self
            .bundle
            .client_certificate(&[role.to_string()], SystemTime::now(), T * 100)
            .unwrap();
        c.pem().unwrap()
    }

    fn channel(&self, identity: Option<(String, String)>) -> tonic::transport::Channel {
        let id = identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
        let config = Arc::new(tls::client_config(&[self.os_ca()], id).unwrap());
        tls::channel(
            self.addr,
            &self.addr.ip().to_string(),
            config,
            Duration::from_secs(5),
        )
        .unwrap()
    }

    fn as_role(&self, role: &str) -> tonic::transport::Channel {
        self.channel(Some(self.identity(role)))
    }

    /// A channel of `role` whose connection comes from `source` (a loopback address), with a
    /// 3 s bound on connecting and the handshake.
    fn as_role_from(&self, role: &str, source: &str) -> tonic::transport::Channel {
        let (c, k) = self.identity(role);
        let config = Arc::new(tls::client_config(&[self.os_ca()], Some((&c, &k))).unwrap());
        let source: std::net::IpAddr = source.parse().unwrap();
        tls::channel_via(
            self.addr,
            &self.addr.ip().to_string(),
            config,
            Duration::from_secs(3),
            move |addr| Box::pin(connect_from(source, addr)),
        )
        .unwrap()
    }
}

/// A TCP connection to `addr` from `source`.
async fn connect_from(
    source: std::net::IpAddr,
    addr: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let s = tokio::net::TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(source, 0))?;
    s.connect(addr).await
}

/// Whether the server closed `s` (a read ends or fails) within `within`.
async fn closed(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(within, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A refusal at the handshake: in TLS 1.3 the client learns it on its first read, as a
/// transport error (Unknown), a connection closed under the call (Cancelled) or one that
/// cannot be made (Unavailable): never an answer of apid's.
fn refused_at_handshake(e: &tonic::Status) {
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "{e:?}"
    );
    assert!(
        format!("{e:?}").contains("tonic::transport::Error"),
        "not a transport failure: {e:?}"
    );
}

fn get(ns: &str, ty: &str, id: &str) -> GetRequest {
    GetRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: id.into(),
        options: None,
    }
}

fn list(ns: &str, ty: &str) -> ListRequest {
    ListRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        options: None,
    }
}

async fn list_all(
    c: &mut StateClient<tonic::transport::Channel>,
    ns: &str,
    ty: &str,
) -> Result<Vec<proto::Resource>, tonic::Status> {
    let mut s = c.list(list(ns, ty)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(r) = s.message().await? {
        out.extend(r.resource);
    }
    Ok(out)
}

const API_CERTS: &str = "ApiCertificates.secrets.talos.dev";
const NODE_ADDRESSES: &str = "NodeAddresses.net.talos.dev";
const DEFINITIONS: &str = "ResourceDefinitions.meta.cosi.dev";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_reads_everything_and_writes_nothing() {
    let n = node().await;
    let mut state = StateClient::new(n.as_role("os:admin"));
    let r = state
        .get(get("secrets", API_CERTS, "api"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.resource.unwrap().metadata.unwrap().id, "api");
    assert!(!list_all(&mut state, "network", NODE_ADDRESSES)
        .await
        .unwrap()
        .is_empty());
    let e = state
        .create(CreateRequest {
            resource: None,
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(e.message(), "write access is not allowed");
    let v = MachineServiceClient::new(n.as_role("os:admin"))
        .version(())
        .await
        .unwrap()
        .into_inner();
    let v = &v.messages[0];
    assert_eq!(v.version.as_ref().unwrap().tag, apid::machine::TAG);
    assert!(v.features.as_ref().unwrap().rbac);
    let h = MachineServiceClient::new(n.as_role("os:admin"))
        .hostname(())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.messages[0].hostname, "cp-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reads_what_is_not_sensitive_and_sees_no_private_key() {
    let n = node().await;
    let mut state = StateClient::new(n.as_role("os:reader"));
    let e = state
        .get(get("secrets", API_CERTS, "api"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().starts_with("not authorized"), "{}", e.message());
    let e = list_all(&mut state, "config", "MachineConfigs.config.talos.dev")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // Every type the reader may list, in every namespace: no key, no token.
    let defs = list_all(&mut state, "meta", DEFINITIONS).await.unwrap();
    let namespaces = list_all(&mut state, "meta", "Namespaces.meta.cosi.dev")
        .await
        .unwrap();
    assert!(defs.len() > 10, "{} definitions", defs.len());
    let token = n.bundle.trustdinfo.as_ref().unwrap().token.clone();
    let mut read = 0;
    for def in defs {
        let raw = cosi::RawResource::from_proto(def).unwrap();
        let ty = cosi::Resource::<cosi::ResourceDefinition>::from_raw(&raw)
            .unwrap()
            .spec
            .resource_type;
        for ns in &namespaces {
            let ns = &ns.metadata.as_ref().unwrap().id;
            match list_all(&mut state, ns, &ty).await {
                Ok(items) => {
                    for r in items {
                        let spec = r.spec.unwrap();
                        let text = format!(
                            "{}{}",
                            spec.yaml_spec,
                            String::from_utf8_lossy(&spec.proto_spec)
                        );
                        assert!(!text.contains("PRIVATE KEY"), "{ns}/{ty}: a private key");
                        assert!(!text.contains(&token), "{ns}/{ty}: the token");
                        read += 1;
                    }
                }
                Err(e) => assert_eq!(e.code(), Code::PermissionDenied, "{ns}/{ty}: {e:?}"),
            }
        }
    }
    assert!(read > 5, "the reader read only {read} resources");
    // Writes and operator calls are not a reader's.
    let e = MachineServiceClient::new(n.as_role("os:reader"))
        .reboot(proto::machine::RebootRequest { mode: 0 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = state
        .create(CreateRequest {
            resource: None,
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().starts_with("not authorized"), "{}", e.message());
    // A watch of a type the reader may read works; one of a sensitive type does not start.
    let mut w = state
        .watch(WatchRequest {
            namespace: "network".into(),
            r#type: NODE_ADDRESSES.into(),
            id: None,
            options: None,
            api_version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(w.message().await.unwrap().is_some());
    let e = state
        .watch(WatchRequest {
            namespace: "secrets".into(),
            r#type: API_CERTS.into(),
            id: None,
            options: None,
            api_version: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_types_and_namespaces_are_not_supported() {
    let n = node().await;
    let mut state = StateClient::new(n.as_role("os:operator"));
    let e = state
        .get(get("network", "Nope.x.dev", "a"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(e.message(), "resource type \"Nope.x.dev\" is not supported");
    let e = state
        .get(get("nowhere", NODE_ADDRESSES, "a"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(e.message(), "namespace \"nowhere\" is not supported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_certificate_of_the_os_ca_are_refused_at_the_handshake() {
    let n = node().await;
    let e = MachineServiceClient::new(n.channel(None))
        .version(())
        .await
        .unwrap_err();
    refused_at_handshake(&e);
    // A client certificate of another CA, with the admin role.
    let (other_ca, other_key) = x509::self_signed_ca(
        &Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        },
        KeyAlgorithm::Ed25519,
        SystemTime::now(),
    )
    .unwrap();
    let (crt, key) = LeafRequest {
        subject: Subject {
            organizations: vec!["os:admin".into()],
            common_name: None,
        },
        extended: vec![x509::ExtendedUsage::ClientAuth],
        ..LeafRequest::default()
    }
    .issue((&other_ca, &other_key), SystemTime::now(), T)
    .unwrap();
    let e = MachineServiceClient::new(n.channel(Some((crt.to_pem(), key.to_pem().unwrap()))))
        .version(())
        .await
        .unwrap_err();
    refused_at_handshake(&e);
    // The node's own server certificate is no client certificate.
    let mut state = StateClient::new(n.as_role("os:admin"));
    let api = state
        .get(get("secrets", API_CERTS, "api"))
        .await
        .unwrap()
        .into_inner();
    let raw = cosi::RawResource::from_proto(api.resource.unwrap()).unwrap();
    let spec = cosi::Resource::<machinery::resources::secrets::ApiCertsSpec>::from_raw(&raw)
        .unwrap()
        .spec;
    let server = spec.server.unwrap();
    let e = MachineServiceClient::new(n.channel(Some((server.crt, server.key))))
        .version(())
        .await
        .unwrap_err();
    refused_at_handshake(&e);
    // TLS 1.2 is refused (openssl as the client: rustls cannot even offer it here).
    if testkit::require_program("openssl", "apt-get install openssl") {
        let out = Command::new("openssl")
            .args(["s_client", "-tls1_2", "-connect", &n.addr.to_string()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "TLS 1.2 accepted: {text}");
        assert!(text.contains("alert") || text.contains("error"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_need_init_say_it_is_not_answering() {
    let n = node().await;
    let e = MachineServiceClient::new(n.as_role("os:operator"))
        .service_list(())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("init's control socket"),
        "{}",
        e.message()
    );
    // An impersonator's forwarded role counts, not its own.
    let e = MachineServiceClient::new(n.as_role("os:impersonator"))
        .version(())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let mut req = tonic::Request::new(());
    req.metadata_mut()
        .insert("talos-role", "os:reader".parse().unwrap());
    MachineServiceClient::new(n.as_role("os:impersonator"))
        .version(req)
        .await
        .unwrap();
    // A reader naming a role in the metadata gets nothing more.
    let mut req = tonic::Request::new(proto::machine::ShutdownRequest { force: false });
    req.metadata_mut()
        .insert("talos-role", "os:admin".parse().unwrap());
    let e = MachineServiceClient::new(n.as_role("os:reader"))
        .shutdown(req)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
}

fn with_metadata<T>(msg: T, key: &'static str, values: &[&str]) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    for v in values {
        req.metadata_mut().append(key, v.parse().unwrap());
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_forwards_to_one_node_or_fans_out_to_many_with_the_callers_roles() {
    let port = shared_port();
    let one = node_at("127.0.0.1", "cp-1", port).await;
    let _two = node_at("127.0.0.2", "cp-2", port).await;
    let admin = || MachineServiceClient::new(one.as_role("os:admin"));

    // node: one-to-one, passed through as it is.
    let h = admin()
        .hostname(with_metadata((), "node", &["127.0.0.2"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.messages.len(), 1);
    assert_eq!(h.messages[0].hostname, "cp-2");
    // Any service one-to-one: a resource of the other node's state.
    let r = StateClient::new(one.as_role("os:admin"))
        .get(with_metadata(
            get("network", "HostnameStatuses.net.talos.dev", "hostname"),
            "node",
            &["127.0.0.2"],
        ))
        .await
        .unwrap()
        .into_inner();
    let spec = r.resource.unwrap().spec.unwrap();
    let spec = spec.yaml_spec + &String::from_utf8_lossy(&spec.proto_spec);
    assert!(spec.contains("cp-2"), "{spec}");

    // nodes: one call, every node's reply, each naming its node; a node that is down is a
    // reply carrying its error, and the call succeeds.
    let h = admin()
        .hostname(with_metadata(
            (),
            "nodes",
            &["127.0.0.1", "127.0.0.2", "127.0.0.3"],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.messages.len(), 3, "{h:?}");
    let meta = |i: usize| h.messages[i].metadata.clone().unwrap();
    assert_eq!(
        (meta(0).hostname.as_str(), h.messages[0].hostname.as_str()),
        ("127.0.0.1", "cp-1")
    );
    assert_eq!(
        (meta(1).hostname.as_str(), h.messages[1].hostname.as_str()),
        ("127.0.0.2", "cp-2")
    );
    assert_eq!(meta(2).hostname, "127.0.0.3");
    assert!(
        meta(2)
            .error
            .starts_with("rpc error: code = Unavailable desc = "),
        "{:?}",
        meta(2)
    );
    assert_eq!(meta(2).status.unwrap().code, Code::Unavailable as i32);
    assert!(meta(0).error.is_empty() && meta(1).error.is_empty());
    let v = admin()
        .version(with_metadata((), "nodes", &["127.0.0.2"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.messages.len(), 1);
    assert_eq!(
        v.messages[0].metadata.as_ref().unwrap().hostname,
        "127.0.0.2"
    );
    assert_eq!(
        v.messages[0].version.as_ref().unwrap().tag,
        apid::machine::TAG
    );

    // A stream fanned out: Logs needs init, absent here, so each node answers with its error,
    // as one message each, and the stream ends OK.
    let mut logs = admin()
        .logs(with_metadata(
            proto::machine::LogsRequest {
                id: "networkd".into(),
                ..Default::default()
            },
            "nodes",
            &["127.0.0.1", "127.0.0.2"],
        ))
        .await
        .unwrap()
        .into_inner();
    let mut from = Vec::new();
    while let Some(d) = logs.message().await.unwrap() {
        let m = d.metadata.unwrap();
        assert!(m.error.contains("init's control socket"), "{m:?}");
        from.push(m.hostname);
    }
    from.sort();
    assert_eq!(from, ["127.0.0.1", "127.0.0.2"]);

    // The target authorizes with the caller's roles, not with the forwarding apid's: a
    // reader is refused a sensitive type there, and may not reboot through the proxy.
    let e = StateClient::new(one.as_role("os:reader"))
        .get(with_metadata(
            get("secrets", API_CERTS, "api"),
            "node",
            &["127.0.0.2"],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = MachineServiceClient::new(one.as_role("os:reader"))
        .reboot(with_metadata(
            proto::machine::RebootRequest { mode: 0 },
            "node",
            &["127.0.0.2"],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // A reader claiming a role in talos-role gets nothing more through the proxy either.
    let mut req = with_metadata(get("secrets", API_CERTS, "api"), "node", &["127.0.0.2"]);
    req.metadata_mut()
        .insert("talos-role", "os:admin".parse().unwrap());
    let e = StateClient::new(one.as_role("os:reader"))
        .get(req)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // The admin's role is what the target sees.
    StateClient::new(one.as_role("os:admin"))
        .get(with_metadata(
            get("secrets", API_CERTS, "api"),
            "node",
            &["127.0.0.2"],
        ))
        .await
        .unwrap();

    // Refusals, each INVALID_ARGUMENT and saying why.
    for (key, values, says) in [
        ("node", &["127.0.0.2:50000"][..], "without a port"),
        ("node", &["cp-2"][..], "resolves no names"),
        ("node", &["127.0.0.1", "127.0.0.2"][..], "single-valued"),
    ] {
        let e = admin()
            .hostname(with_metadata((), key, values))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{values:?}: {e:?}");
        assert!(e.message().contains(says), "{values:?}: {}", e.message());
    }
    let e = StateClient::new(one.as_role("os:admin"))
        .get(with_metadata(
            get("network", NODE_ADDRESSES, "x"),
            "nodes",
            &["127.0.0.2"],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("one-2-many"), "{}", e.message());
    let many: Vec<String> = (1..=65).map(|i| format!("127.0.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let e = admin()
        .version(with_metadata((), "nodes", &many))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

fn gen_request(roles: &[&str], seconds: i64) -> proto::machine::GenerateClientConfigurationRequest {
    proto::machine::GenerateClientConfigurationRequest {
        roles: roles.iter().map(|r| r.to_string()).collect(),
        crt_ttl: Some(prost_types::Duration { seconds, nanos: 0 }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_generates_a_client_configuration_signed_by_secretsd_and_nothing_stays() {
    let n = node().await;
    // Admin only.
    for role in ["os:reader", "os:operator"] {
        let e = MachineServiceClient::new(n.as_role(role))
            .generate_client_configuration(gen_request(&["os:admin"], 3600))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{role}: {e:?}");
    }
    let mut admin = MachineServiceClient::new(n.as_role("os:admin"));
    // Upstream's refusal of the request itself.
    let e = admin
        .generate_client_configuration(gen_request(&["os:reader"], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "crt_ttl should be positive");

    // Several roles: one certificate carrying all of them (one multi-valued Organization RDN,
    // as upstream's), in a context named after the cluster; it works as its roles allow.
    let reply = admin
        .generate_client_configuration(gen_request(
            &["os:reader", "os:etcd:backup", "os:reader"],
            600,
        ))
        .await
        .unwrap()
        .into_inner();
    let m = &reply.messages[0];
    let crt = x509::Certificate::from_pem(&m.crt).unwrap();
    assert!(crt.is_signed_by(&n.os_ca()));
    assert_eq!(
        crt.info().unwrap().organizations,
        ["os:reader", "os:etcd:backup"]
    );
    let talosconfig = String::from_utf8(m.talosconfig.clone()).unwrap();
    assert!(
        talosconfig.starts_with("context: demo\ncontexts:\n  demo:\n"),
        "{talosconfig}"
    );
    let id = (
        String::from_utf8(m.crt.clone()).unwrap(),
        String::from_utf8(m.key.clone()).unwrap(),
    );
    let mut two_roles = MachineServiceClient::new(n.channel(Some(id)));
    two_roles.version(()).await.unwrap();
    let e = two_roles
        .shutdown(proto::machine::ShutdownRequest { force: false })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);

    // Unknown roles are dropped, as upstream's role.Parse does.
    let reply = admin
        .generate_client_configuration(gen_request(&["os:reader", "os:root"], 3600))
        .await
        .unwrap()
        .into_inner();
    let m = &reply.messages[0];
    let ca = x509::Certificate::from_pem(&m.ca).unwrap();
    assert_eq!(ca.der(), n.os_ca().der(), "ca is the OS CA");
    let crt = x509::Certificate::from_pem(&m.crt).unwrap();
    assert!(crt.is_signed_by(&n.os_ca()));
    let key = x509::PrivateKey::from_pem(&m.key).unwrap();
    assert!(crt.matches_key(&key));
    let info = crt.info().unwrap();
    assert_eq!(info.organizations, vec!["os:reader".to_string()]);
    assert!(info.client_auth && !info.server_auth && !info.is_ca);
    let lifetime = info.not_after.duration_since(info.not_before).unwrap();
    assert_eq!(lifetime, Duration::from_secs(3600));
    let talosconfig = String::from_utf8(m.talosconfig.clone()).unwrap();
    assert!(
        talosconfig
            .starts_with("context: reader@demo\ncontexts:\n  reader@demo:\n    endpoints: []\n"),
        "{talosconfig}"
    );

    // The new certificate is a working reader's.
    let id = (
        String::from_utf8(m.crt.clone()).unwrap(),
        String::from_utf8(m.key.clone()).unwrap(),
    );
    let mut reader = MachineServiceClient::new(n.channel(Some(id)));
    reader.version(()).await.unwrap();
    let e = reader
        .shutdown(proto::machine::ShutdownRequest { force: false })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);

    // The request and its answer are gone once the call is over.
    let client = &n._harness.client;
    let end = Instant::now() + T;
    loop {
        let requests = client
            .list(
                "apid",
                "ClientCertificateRequests.apid.talos.dev",
                &cosi::Query::default(),
            )
            .await
            .unwrap();
        let answers = client
            .list(
                "secrets",
                "ClientCertificates.secrets.talos.dev",
                &cosi::Query::default(),
            )
            .await
            .unwrap();
        if requests.is_empty() && answers.is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "left behind: {} requests, {} answers",
            requests.len(),
            answers.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// "Any gRPC client must work": gRPC's C-core (Python here; C++ and Ruby are the same code)
/// does its TLS with BoringSSL, which refuses Ed25519 handshake signatures (grpc/grpc#24252).
/// apid serves with an ECDSA P-256 key its (Ed25519) OS CA signed, so a grpcio client with a
/// talosconfig of the node (GenerateClientConfiguration's, the client key Ed25519) calls
/// Version and lists COSI resources as its role allows; and in maintenance, with the server's
/// certificate pinned by the fingerprint apid logs and no client certificate, as a reader
/// (`tests/clients/grpcio_client.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_c_core_client_calls_apid_with_a_talosconfig_and_in_maintenance() {
    use machinery::resources::apid::MaintenanceCertificateSpec;
    use machinery::resources::runtime::{MachineStage, MachineStatusSpec};

    let python = Command::new("python3")
        .args(["-c", "import grpc, yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !testkit::require(
        python.is_ok_and(|s| s.success()),
        "python3 with grpcio and PyYAML is missing (scripts/install-deps.sh installs them)",
    ) {
        return;
    }
    // README.md's snippet is the script's function, word for word.
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/grpcio_client.py"
    ))
    .unwrap();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let function = script
        .split_once("def talos_credentials")
        .and_then(|(_, rest)| rest.split_once("\n\n\n"))
        .map(|(body, _)| format!("def talos_credentials{body}"))
        .unwrap();
    assert!(
        readme.contains(&function),
        "README.md's Python client differs from the tested one:\n{function}"
    );

    let n = node().await;
    let dir = tempfile::tempdir().unwrap();
    let grpcio = |role: &str, arg: String| {
        let args = [
            n.addr.to_string(),
            apid::machine::TAG.to_string(),
            role.to_string(),
            arg,
        ];
        async move {
            let script = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/clients/grpcio_client.py"
            );
            let role = args[2].clone();
            let out = tokio::task::spawn_blocking(move || {
                Command::new("python3")
                    .arg(script)
                    .args(args)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "grpcio as {role}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let mut admin = MachineServiceClient::new(n.as_role("os:admin"));
    for role in ["admin", "reader"] {
        let reply = admin
            .generate_client_configuration(gen_request(&[&format!("os:{role}")], 600))
            .await
            .unwrap()
            .into_inner();
        let path = dir.path().join(role);
        std::fs::write(&path, &reply.messages[0].talosconfig).unwrap();
        grpcio(role, path.display().to_string()).await;
    }

    // Maintenance: the fingerprint is the one apid logs, of the certificate it keeps.
    let client = &n._harness.client;
    let status = MachineStatusSpec {
        stage: MachineStage::Maintenance,
        ..MachineStatusSpec::default()
    };
    let raw = cosi::Resource::new("runtime", "machine", status)
        .to_raw()
        .unwrap();
    client.create(&raw, "").await.unwrap();
    let end = Instant::now() + T;
    let maintenance = loop {
        if let Ok(r) = client
            .get_typed::<MaintenanceCertificateSpec>("apid", "maintenance")
            .await
        {
            break r.spec;
        }
        assert!(Instant::now() < end, "no maintenance certificate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let fingerprint = x509::Certificate::from_pem(maintenance.server.crt.as_bytes())
        .unwrap()
        .fingerprint()
        .unwrap();
    grpcio("maintenance", fingerprint).await;
}

fn watch_of(ns: &str, ty: &str) -> WatchRequest {
    WatchRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: None,
        api_version: 1,
        options: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_to_a_node_are_bounded_with_a_clear_error_not_a_hang() {
    let port = shared_port();
    let one = node_at("127.0.0.1", "cp-1", port).await;
    let _two = node_at("127.0.0.2", "cp-2", port).await;
    let (limit, per) = (apid::proxy::PEER_CALLS, apid::proxy::PEER_CALLS_PER_CALLER);
    let watch_two = |c: &tonic::transport::Channel| {
        let mut c = StateClient::new(c.clone());
        async move {
            tokio::time::timeout(
                T,
                c.watch(with_metadata(
                    watch_of("network", "HostnameStatuses.net.talos.dev"),
                    "node",
                    &["127.0.0.2"],
                )),
            )
            .await
            .expect("answered, not left waiting")
        }
    };
    // Watches of the other node's state, kept open: each client connection may have `per` of
    // them; `limit / per` connections fill the one connection this apid shares to 127.0.0.2.
    let channels: Vec<_> = (0..=limit / per).map(|_| one.as_role("os:admin")).collect();
    let mut open = Vec::new();
    for c in &channels[..limit / per] {
        for _ in 0..per {
            open.push(watch_two(c).await.unwrap().into_inner());
        }
    }
    // One more on a full connection: that connection's share is used up.
    let e = watch_two(&channels[0]).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("this connection"), "{}", e.message());
    // One more from another connection: the shared connection to the node is full.
    let e = watch_two(&channels[limit / per]).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("127.0.0.2") && e.message().contains("open to it already"),
        "{}",
        e.message()
    );
    // The node itself is still served; and once the watches end, forwarding works again.
    MachineServiceClient::new(channels[0].clone())
        .hostname(())
        .await
        .unwrap();
    drop(open);
    let end = Instant::now() + T;
    loop {
        let r = MachineServiceClient::new(channels[limit / per].clone())
            .hostname(with_metadata((), "node", &["127.0.0.2"]))
            .await;
        match r {
            Ok(h) => {
                assert_eq!(h.into_inner().messages[0].hostname, "cp-2");
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                assert!(Instant::now() < end, "slots never came back");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Writes the chunks of a backup passing through stated, as k8sd (a snapshot) or apid (a
/// recovery upload) do: one resource updated chunk after chunk, then destroyed.
async fn pass_chunks<S: cosi::ResourceSpec + serde::Serialize>(
    client: &cosi::Client,
    ns: &str,
    chunks: impl IntoIterator<Item = S>,
) {
    let mut stored: Option<cosi::RawResource> = None;
    for spec in chunks {
        let mut raw = cosi::Resource::new(ns, "upload-1", spec).to_raw().unwrap();
        stored = Some(match stored {
            None => client.create(&raw, "test").await.unwrap(),
            Some(prev) => {
                raw.metadata.version = prev.metadata.version;
                client.update(&raw, "test", None).await.unwrap()
            }
        });
    }
    client
        .destroy(ns, S::TYPE, "upload-1", "test")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_backup_on_its_way_is_an_admins_only_even_from_a_watchs_history() {
    use machinery::resources::apid::EtcdRecoverChunkSpec;
    use machinery::resources::etcd::EtcdSnapshotChunkSpec;
    let n = node().await;
    let client = &n._harness.client;
    client
        .define_types_retrying(&machinery::resources::etcd::definitions(), "k8sd")
        .await
        .unwrap();
    // A snapshot taken (etcd/EtcdSnapshotChunks) and one restored (apid/EtcdRecoverChunks):
    // both have ended by the time anyone looks.
    pass_chunks(
        client,
        "etcd",
        (1..=3).map(|seq| EtcdSnapshotChunkSpec {
            seq,
            data: format!("U05BUFNIT1Qt{seq}"),
            eof: seq == 3,
        }),
    )
    .await;
    pass_chunks(
        client,
        "apid",
        (1..=3).map(|seq| EtcdRecoverChunkSpec {
            seq,
            data: format!("UkVDT1ZFUi0{seq}"),
            eof: seq == 3,
        }),
    )
    .await;
    let tail = |ns: &str, ty: &str| WatchRequest {
        options: Some(proto::WatchOptions {
            tail_events: 100,
            ..Default::default()
        }),
        ..watch_of(ns, ty)
    };
    // Collects what a watch replays from the history (the first 'established' response,
    // then events until none comes for a while).
    async fn replayed(
        mut w: tonic::Streaming<proto::WatchResponse>,
    ) -> Result<Vec<String>, tonic::Status> {
        let mut out = Vec::new();
        while let Ok(m) = tokio::time::timeout(Duration::from_millis(500), w.message()).await {
            let Some(m) = m? else { break };
            for e in m.event {
                if let Some(r) = e.resource {
                    let spec = r.spec.unwrap();
                    out.push(format!(
                        "{}{}",
                        spec.yaml_spec,
                        String::from_utf8_lossy(&spec.proto_spec)
                    ));
                }
            }
        }
        Ok(out)
    }
    for (ns, ty, data) in [
        ("etcd", EtcdSnapshotChunkSpec::TYPE, "U05BUFNIT1Qt3"),
        ("apid", EtcdRecoverChunkSpec::TYPE, "UkVDT1ZFUi03"),
    ] {
        // The admin sees the backup's last chunk in the history: it is there to be seen.
        let mut admin = StateClient::new(n.as_role("os:admin"));
        let seen = replayed(admin.watch(tail(ns, ty)).await.unwrap().into_inner())
            .await
            .unwrap();
        assert!(
            seen.iter().any(|s| s.contains(data)),
            "{ns}/{ty}: the admin replays {seen:?}"
        );
        // A reader: nothing, neither from the history nor by a read.
        for role in ["os:reader", "os:etcd:backup"] {
            let mut reader = StateClient::new(n.as_role(role));
            let e = match reader.watch(tail(ns, ty)).await {
                Err(e) => e,
                Ok(w) => match replayed(w.into_inner()).await {
                    Err(e) => e,
                    Ok(seen) => panic!("{role} replays {ns}/{ty}: {seen:?}"),
                },
            };
            assert_eq!(e.code(), Code::PermissionDenied, "{role}: {e:?}");
            assert!(e.message().starts_with("not authorized"), "{}", e.message());
            let e = list_all(&mut reader, ns, ty).await.unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{role}: {e:?}");
        }
    }
    // stated keeps only a few past versions of a sensitive kind: a longer backup does not
    // linger in its memory chunk after chunk.
    pass_chunks(
        client,
        "etcd",
        (1..=40).map(|seq| EtcdSnapshotChunkSpec {
            seq,
            data: format!("QkFDS1VQ{seq:02}"),
            eof: seq == 40,
        }),
    )
    .await;
    let mut admin = StateClient::new(n.as_role("os:admin"));
    let seen = replayed(
        admin
            .watch(tail("etcd", EtcdSnapshotChunkSpec::TYPE))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    assert!(
        !seen.is_empty() && seen.len() <= stated::store::SENSITIVE_HISTORY,
        "{} past chunks kept: {seen:?}",
        seen.len()
    );
    assert!(!seen.iter().any(|s| s.contains("QkFDS1VQ01")), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stops_handing_a_reader_a_type_made_sensitive_while_it_runs() {
    use machinery::resources::etcd::EtcdSnapshotChunkSpec;
    let n = node().await;
    let client = &n._harness.client;
    // The type as an older build defined it: not sensitive.
    let mut def = EtcdSnapshotChunkSpec::definition();
    def.sensitivity = cosi::definition::Sensitivity::NonSensitive;
    client.define_types(&[def], "k8sd").await.unwrap();
    let ty = EtcdSnapshotChunkSpec::TYPE;
    // A namespace of a stated without a manifest exists once written.
    pass_chunks(client, "etcd", [EtcdSnapshotChunkSpec::default()]).await;
    let mut reader = StateClient::new(n.as_role("os:reader"));
    let end = Instant::now() + T;
    let mut w = loop {
        match reader.watch(watch_of("etcd", ty)).await {
            Ok(w) => break w.into_inner(),
            // Until apid has seen the definition (the harness defined them all, sensitive).
            Err(e) => assert!(Instant::now() < end, "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(w.message().await.unwrap().is_some(), "established");
    // Made sensitive (the daemon upgraded); once apid knows, a chunk is written.
    client
        .define_types(&[EtcdSnapshotChunkSpec::definition()], "k8sd")
        .await
        .unwrap();
    let end = Instant::now() + T;
    while reader.watch(watch_of("etcd", ty)).await.is_ok() {
        assert!(Instant::now() < end, "apid never learnt the new definition");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pass_chunks(
        client,
        "etcd",
        [EtcdSnapshotChunkSpec {
            seq: 1,
            data: "U0VDUkVU".into(),
            eof: true,
        }],
    )
    .await;
    let e = tokio::time::timeout(T, w.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().starts_with("not authorized"), "{}", e.message());
    // And the stream has ended.
    assert!(matches!(w.message().await, Ok(None) | Err(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_greedy_connections_of_one_address_keep_no_other_client_out() {
    let port = shared_port();
    let limits = tls::Limits {
        handshake_timeout: Duration::from_secs(2),
        first_request_timeout: Duration::from_secs(2),
        ..tls::Limits::default()
    };
    let n = node_with("127.0.0.1", "cp-1", port, limits).await;
    // An admin answered from its own address, before anything else.
    MachineServiceClient::new(n.as_role_from("os:admin", "127.0.0.2"))
        .version(())
        .await
        .unwrap();
    // 400 silent TCP connections from one address: no certificate, not a byte sent.
    let mut silent = Vec::new();
    for _ in 0..400 {
        silent.push(
            connect_from("127.0.0.3".parse().unwrap(), n.addr)
                .await
                .unwrap(),
        );
    }
    // Another client, from another address, still gets in (with a 3 s bound on connecting
    // and its handshake: behind 256 silent connections it used to wait in the backlog).
    MachineServiceClient::new(n.as_role_from("os:admin", "127.0.0.2"))
        .version(())
        .await
        .expect("a client of another address is answered");
    // All but the source's share were closed at once, and the rest once their handshake
    // time passed.
    let mut at_once = 0;
    for s in &mut silent {
        if closed(s, Duration::from_millis(50)).await {
            at_once += 1;
        }
    }
    assert!(
        at_once >= 400 - limits.handshakes_per_source,
        "{at_once} closed at once"
    );
    for s in &mut silent {
        assert!(
            closed(s, Duration::from_secs(10)).await,
            "a silent connection stays open"
        );
    }
    drop(silent);
    // A client that completes its handshake and then says nothing (no HTTP/2 preface, no
    // call) is closed once its first request is late.
    let (c, k) = n.identity("os:admin");
    let config = Arc::new(tls::client_config(&[n.os_ca()], Some((&c, &k))).unwrap());
    let tcp = connect_from("127.0.0.4".parse().unwrap(), n.addr)
        .await
        .unwrap();
    let mut mute = tls::tokio_rustls::TlsConnector::from(config)
        .connect(
            tls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .expect("the handshake completes");
    {
        use tokio::io::AsyncReadExt as _;
        let mut b = [0u8; 256];
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout(Duration::from_secs(10), mute.read(&mut b)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => assert!(Instant::now() < end, "never closed"),
                Err(_) => panic!("a client that made no request is still connected"),
            }
        }
    }
    // Greedy: one address holds its share of connections (each with a call done), the next
    // of that address is closed; another address is still answered.
    let mut held = Vec::new();
    for _ in 0..limits.per_source {
        let ch = n.as_role_from("os:reader", "127.0.0.5");
        MachineServiceClient::new(ch.clone())
            .version(())
            .await
            .unwrap();
        held.push(ch);
    }
    let e = MachineServiceClient::new(n.as_role_from("os:reader", "127.0.0.5"))
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
    MachineServiceClient::new(n.as_role_from("os:admin", "127.0.0.2"))
        .version(())
        .await
        .expect("another address is answered while one holds its share");
    // The held connections still work: a share is not taken back.
    MachineServiceClient::new(held[0].clone())
        .version(())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_holds_its_share_and_never_keeps_an_admin_out() {
    let n = node().await;
    // A configured node (the harness wrote its configuration); no k8sd here, so an etcd
    // operation waits for its answer: it holds its slot as long as a slow k8sd would.
    let reader = n.as_role("os:reader");
    let looping = tokio::spawn({
        let reader = reader.clone();
        async move {
            MachineServiceClient::new(reader)
                .etcd_alarm_list(())
                .await
                .map(drop)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The reader's second call waits for its first.
    let e = MachineServiceClient::new(reader.clone())
        .etcd_alarm_list(())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("its share"), "{}", e.message());
    // An admin's operation is not refused: it is sent to k8sd (which, absent, never answers
    // within the client's 2 s).
    let mut defrag = tonic::Request::new(());
    defrag.set_timeout(Duration::from_secs(2));
    let e = MachineServiceClient::new(n.as_role("os:admin"))
        .etcd_defragment(defrag)
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{e:?}"
    );
    looping.abort();

    // Watches: a client certificate holds its share (64); another reader still gets one, and
    // an admin one of those kept for admins.
    let ns = "network";
    let w = |ch: &tonic::transport::Channel| {
        let mut c = StateClient::new(ch.clone());
        async move { c.watch(watch_of(ns, NODE_ADDRESSES)).await }
    };
    // 64 streams per connection: the share on two connections of one certificate.
    let identity = n.identity("os:reader");
    let one = n.channel(Some(identity.clone()));
    let two = n.channel(Some(identity));
    let mut open = Vec::new();
    for i in 0..64 {
        let ch = if i < 32 { &one } else { &two };
        open.push(w(ch).await.unwrap().into_inner());
    }
    let e = w(&two).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("its share"), "{}", e.message());
    w(&n.as_role("os:reader")).await.expect("another reader");
    w(&n.as_role("os:admin")).await.expect("an admin");
    // A watch closed gives its place back.
    open.pop();
    let end = Instant::now() + T;
    while let Err(e) = w(&two).await {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(Instant::now() < end, "the share never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
