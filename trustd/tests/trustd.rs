//! trustd for real: a stated in process, secretsd's controllers minting trustd's certificate
//! from upstream's own secrets bundle, trustd serving on loopback over TLS 1.3, and clients
//! that join as a worker would, or try not to play by the rules.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use machinery::secrets::x509::{self, Certificate, KeyAlgorithm, LeafRequest, Subject};
use machinery::secrets::Bundle;
use machinery::tls;
use proto::securityapi::security_service_client::SecurityServiceClient;
use proto::securityapi::CertificateRequest;
use stated::testing::Harness;
use tokio::sync::oneshot;
use trustd::client::{request_certificate, ClientError};

const UPSTREAM: &str = include_str!("../../machinery/tests/data/upstream-secrets.yaml");
const T: Duration = Duration::from_secs(30);

struct Cp {
    _harness: Harness,
    client: cosi::Client,
    addr: SocketAddr,
    bundle: Bundle,
    _stop: (oneshot::Sender<()>, oneshot::Sender<()>),
}

/// A control plane: stated, secretsd's controllers (config with 127.0.0.1 in the certSANs,
/// network inputs as networkd would write them) and trustd on a free loopback port.
async fn control_plane() -> Cp {
    let harness = Harness::start().await;
    let client = harness.client.clone();
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let stop_secretsd = secretsd::testing::control_plane(&client, &bundle).await;

    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (stop_trustd, rx) = oneshot::channel::<()>();
    let config = trustd::run::Config {
        socket: harness.socket.clone(),
        listen: addr,
        limits: tls::Limits::default(),
        join_timeout: Duration::from_secs(5),
    };
    tokio::spawn(async move { trustd::run::run(config, || {}, rx).await.unwrap() });
    // Serving once secretsd minted trustd's certificate.
    let end = Instant::now() + T;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < end, "trustd never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Cp {
        _harness: harness,
        client,
        addr,
        bundle,
        _stop: (stop_secretsd, stop_trustd),
    }
}

fn os_ca(b: &Bundle) -> Certificate {
    b.os_ca().unwrap().0
}

fn token(b: &Bundle) -> String {
    b.trustdinfo.as_ref().unwrap().token.clone()
}

/// A worker's CSR: CN, a role it must not get, its names.
fn worker_csr() -> String {
    LeafRequest {
        subject: Subject {
            organizations: vec!["os:admin".into()],
            common_name: Some("w-1".into()),
        },
        dns_names: vec!["w-1".into()],
        ips: vec!["10.5.0.3".parse().unwrap()],
        ..LeafRequest::default()
    }
    .csr(KeyAlgorithm::Ed25519)
    .unwrap()
    .0
}

async fn raw_call(cp: &Cp, server_name: &str, token: Option<&str>, csr: Vec<u8>) -> tonic::Status {
    let config = Arc::new(tls::client_config(&[os_ca(&cp.bundle)], None).unwrap());
    let channel = tls::channel(cp.addr, server_name, config, T).unwrap();
    let mut req = tonic::Request::new(CertificateRequest { csr });
    if let Some(t) = token {
        req.metadata_mut().insert("token", t.parse().unwrap());
    }
    SecurityServiceClient::new(channel)
        .certificate(req)
        .await
        .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_a_server_certificate_of_the_os_ca_without_the_role_it_asked_for() {
    let cp = control_plane().await;
    let endpoints = vec!["127.0.0.1:1".to_string(), cp.addr.to_string()];
    // The first endpoint is closed: the next one answers.
    let trustd::client::Signed { ca, crt, .. } = request_certificate(
        &endpoints,
        &token(&cp.bundle),
        &[os_ca(&cp.bundle)],
        &worker_csr(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(
        ca.contains(&os_ca(&cp.bundle).to_pem()),
        "every accepted CA is returned"
    );
    let crt = Certificate::from_pem(crt.as_bytes()).unwrap();
    assert!(crt.is_signed_by(&os_ca(&cp.bundle)));
    let info = crt.info().unwrap();
    assert_eq!(info.common_name.as_deref(), Some("w-1"));
    assert!(info.organizations.is_empty(), "O is stripped: {info:?}");
    assert!(
        info.server_auth && !info.client_auth && !info.is_ca,
        "{info:?}"
    );
    assert_eq!(info.dns_names, ["w-1"]);
    assert_eq!(info.ips, ["10.5.0.3".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(info.lifetime(), Duration::from_secs(24 * 3600));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_and_bad_csrs_are_refused_with_upstreams_statuses() {
    let cp = control_plane().await;
    let s = raw_call(&cp, "127.0.0.1", None, worker_csr().into_bytes()).await;
    assert_eq!(
        (s.code(), s.message()),
        (tonic::Code::Unauthenticated, "missing token")
    );
    let s = raw_call(
        &cp,
        "127.0.0.1",
        Some("abcdef.0123456789abcdef"),
        worker_csr().into_bytes(),
    )
    .await;
    assert_eq!(
        (s.code(), s.message()),
        (tonic::Code::Unauthenticated, "invalid token")
    );
    let good = token(&cp.bundle);
    let s = raw_call(&cp, "127.0.0.1", Some(&good), b"not a csr".to_vec()).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    // A CSR whose signature does not verify: its last signature byte flipped.
    let csr = worker_csr();
    let block = pem_body(&csr);
    let mut der = block.clone();
    let last = der.len() - 1;
    der[last] ^= 1;
    let forged = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        b64(&der)
    );
    let s = raw_call(&cp, "127.0.0.1", Some(&good), forged.into_bytes()).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    // Larger than any CSR: refused before it is read.
    let s = raw_call(&cp, "127.0.0.1", Some(&good), vec![b'A'; 200 * 1024]).await;
    assert_ne!(s.code(), tonic::Code::Ok);
    assert!(
        matches!(
            s.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted | tonic::Code::InvalidArgument
        ),
        "{s:?}"
    );
}

fn pem_body(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

fn b64(der: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(der)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trustd_whose_certificate_no_accepted_ca_signed_is_not_trusted() {
    let cp = control_plane().await;
    let (foreign, _) = x509::self_signed_ca(
        &Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        },
        KeyAlgorithm::Ed25519,
        std::time::SystemTime::now(),
    )
    .unwrap();
    let e = request_certificate(
        &[cp.addr.to_string()],
        &token(&cp.bundle),
        &[foreign],
        &worker_csr(),
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    let ClientError::Failed(why) = &e else {
        panic!("{e}");
    };
    assert!(
        why[0].to_lowercase().contains("certificate"),
        "the failure names the certificate: {e}"
    );
    // A name the certificate does not carry is refused too.
    let s = raw_call(
        &cp,
        "cp-2.example",
        Some(&token(&cp.bundle)),
        worker_csr().into_bytes(),
    )
    .await;
    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_is_refused_and_tls_1_3_accepted() {
    let cp = control_plane().await;
    let s_client = |version: &str| {
        Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &cp.addr.to_string(),
                version,
                "-alpn",
                "h2",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("openssl s_client")
    };
    let v12 = s_client("-tls1_2");
    let text =
        String::from_utf8_lossy(&v12.stdout).into_owned() + &String::from_utf8_lossy(&v12.stderr);
    assert!(
        !v12.status.success(),
        "TLS 1.2 handshake succeeded:\n{text}"
    );
    // The server answers a 1.2 hello with a protocol_version alert; no cipher is agreed.
    assert!(
        text.contains("alert protocol version") && text.contains("Cipher is (NONE)"),
        "{text}"
    );
    let v13 = s_client("-tls1_3");
    let text = String::from_utf8_lossy(&v13.stdout);
    assert!(
        text.contains("TLSv1.3"),
        "TLS 1.3 handshake failed:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reissued_certificate_is_served_from_the_next_handshake() {
    let cp = control_plane().await;
    let good = token(&cp.bundle);
    // 10.6.0.2 is no name of trustd's certificate yet.
    let s = raw_call(&cp, "10.6.0.2", Some(&good), worker_csr().into_bytes()).await;
    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
    secretsd::testing::addresses(&cp.client, &["10.5.0.2/24", "10.6.0.2/24"]).await;
    let config = Arc::new(tls::client_config(&[os_ca(&cp.bundle)], None).unwrap());
    let end = Instant::now() + T;
    loop {
        let channel = tls::channel(cp.addr, "10.6.0.2", config.clone(), T).unwrap();
        let mut req = tonic::Request::new(CertificateRequest {
            csr: worker_csr().into_bytes(),
        });
        req.metadata_mut().insert("token", good.parse().unwrap());
        match SecurityServiceClient::new(channel).certificate(req).await {
            Ok(_) => break,
            Err(s) => assert!(
                Instant::now() < end,
                "never served the new certificate: {s:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A worker node: its own stated, secretsd's controllers on a worker configuration (no CA
/// key) whose control plane endpoint is `cp`, and its trustd (the joining side).
struct Worker {
    harness: Harness,
    secretsd: Option<oneshot::Sender<()>>,
    _trustd: oneshot::Sender<()>,
}

async fn worker(bundle: &Bundle, cp: &str, hostname: &str, address: &str, sans: &[&str]) -> Worker {
    let harness = Harness::start().await;
    let secretsd =
        start_worker_secretsd(&harness.client, bundle, cp, hostname, address, sans).await;
    let (stop, rx) = oneshot::channel::<()>();
    let config = trustd::run::Config {
        socket: harness.socket.clone(),
        // Not served: a worker's trustd has no certificate (its OS root has no key).
        listen: "127.0.0.1:0".parse().unwrap(),
        limits: tls::Limits::default(),
        join_timeout: Duration::from_secs(5),
    };
    tokio::spawn(async move { trustd::run::run(config, || {}, rx).await.unwrap() });
    Worker {
        harness,
        secretsd: Some(secretsd),
        _trustd: stop,
    }
}

async fn start_worker_secretsd(
    client: &cosi::Client,
    bundle: &Bundle,
    cp: &str,
    hostname: &str,
    address: &str,
    sans: &[&str],
) -> oneshot::Sender<()> {
    let endpoint = format!("https://{cp}:6443");
    secretsd::testing::node(
        client,
        bundle,
        &secretsd::testing::Node {
            machine_type: machinery::config::MachineType::Worker,
            endpoint: &endpoint,
            hostname,
            address,
            cert_sans: sans,
        },
    )
    .await
}

/// Waits until `f` gives something from the resource `id` of `S` in `ns`.
async fn until<S: cosi::ResourceSpec, T>(
    c: &cosi::Client,
    ns: &str,
    id: &str,
    what: &str,
    f: impl Fn(&S) -> Option<T>,
) -> T {
    let end = Instant::now() + T;
    loop {
        if let Ok(r) = c.get_typed::<S>(ns, id).await {
            if let Some(t) = f(&r.spec) {
                return t;
            }
        }
        assert!(Instant::now() < end, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_apids_certificate_through_trustd_with_its_key_kept_in_secretsd() {
    use machinery::resources::secrets::{ApiCertsSpec, ApiCsrSpec, API_ID, NAMESPACE};
    use machinery::resources::trustd::SignedCertificateSpec;
    // A control plane whose trustd listens where the worker's config points: 127.0.77.1:50001.
    let harness = Harness::start().await;
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let _cp_secretsd =
        secretsd::testing::control_plane_named(&harness.client, &bundle, "cp-1", &["127.0.77.1"])
            .await;
    let (_cp_trustd, rx) = oneshot::channel::<()>();
    let config = trustd::run::Config {
        socket: harness.socket.clone(),
        listen: "127.0.77.1:50001".parse().unwrap(),
        limits: tls::Limits::default(),
        join_timeout: Duration::from_secs(5),
    };
    tokio::spawn(async move { trustd::run::run(config, || {}, rx).await.unwrap() });

    let mut w = worker(&bundle, "127.0.77.1", "w-1", "10.5.0.3/24", &["127.0.77.2"]).await;
    let c = w.harness.client.clone();
    let server = until::<ApiCertsSpec, _>(&c, NAMESPACE, API_ID, "apid's certificate", |s| {
        s.server.clone()
    })
    .await;
    let os = os_ca(&bundle);
    let crt = Certificate::from_pem(server.crt.as_bytes()).unwrap();
    assert!(crt.is_signed_by(&os), "chains to the OS CA");
    let key = x509::PrivateKey::from_pem(server.key.as_bytes()).unwrap();
    assert!(crt.matches_key(&key));
    // ECDSA P-256, as a control plane's apid key (gRPC's C-core clients refuse Ed25519), signed
    // by the Ed25519 OS CA.
    assert_eq!(key.algorithm(), KeyAlgorithm::EcdsaP256);
    let info = crt.info().unwrap();
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));
    assert_eq!(info.common_name.as_deref(), Some("w-1"));
    assert!(
        info.server_auth && !info.client_auth && !info.is_ca,
        "{info:?}"
    );
    let mut ips = info.ips.clone();
    ips.sort();
    let want: Vec<std::net::IpAddr> =
        vec!["10.5.0.3".parse().unwrap(), "127.0.77.2".parse().unwrap()];
    assert_eq!(ips, want);
    let certs = c
        .get_typed::<ApiCertsSpec>(NAMESPACE, API_ID)
        .await
        .unwrap()
        .spec;
    assert!(
        certs.client.is_none(),
        "a worker's apid gets no client certificate"
    );
    assert!(certs
        .accepted_cas
        .iter()
        .any(|a| a.crt.trim() == os.to_pem().trim()));
    // The worker's configuration holds no CA key, and what trustd wrote holds no key at all.
    let mc = c
        .get_typed::<machinery::resources::config::MachineConfigSpec>("config", "v1alpha1")
        .await
        .unwrap()
        .spec
        .0;
    let config = machinery::config::Config::from_yaml(&mc).unwrap();
    let ca = config.machine().unwrap().ca.clone().unwrap();
    assert!(
        ca.has_crt() && ca.key.as_deref().unwrap_or("").is_empty(),
        "{ca:?}"
    );
    let signed = c
        .get_typed::<SignedCertificateSpec>("trustd", "api")
        .await
        .unwrap();
    assert_eq!(signed.spec.endpoint, "127.0.77.1");
    assert!(signed.spec.error.is_empty(), "{:?}", signed.spec.error);
    assert!(!format!("{:?}", signed.spec).contains("PRIVATE KEY"));
    // Once the certificate is there, the request is withdrawn.
    let end = Instant::now() + T;
    while c.get_typed::<ApiCsrSpec>(NAMESPACE, "api").await.is_ok() {
        assert!(Instant::now() < end, "the CSR stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A restart of secretsd re-adopts the certificate: nothing is asked or issued again.
    let before = c
        .get_typed::<ApiCertsSpec>(NAMESPACE, API_ID)
        .await
        .unwrap();
    drop(w.secretsd.take());
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.secretsd = Some(
        start_worker_secretsd(
            &c,
            &bundle,
            "127.0.77.1",
            "w-1",
            "10.5.0.3/24",
            &["127.0.77.2"],
        )
        .await,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = c
        .get_typed::<ApiCertsSpec>(NAMESPACE, API_ID)
        .await
        .unwrap();
    assert_eq!(after.spec, before.spec, "reissued after a restart");
    assert!(c.get_typed::<ApiCsrSpec>(NAMESPACE, "api").await.is_err());

    // A worker with a wrong trustd token gets nothing, and says why.
    let mut wrong = Bundle::from_yaml(UPSTREAM).unwrap();
    wrong.trustdinfo.as_mut().unwrap().token = "abcdef.0123456789abcdef".into();
    let w2 = worker(&wrong, "127.0.77.1", "w-2", "10.5.0.4/24", &[]).await;
    let c2 = w2.harness.client.clone();
    let error = until::<SignedCertificateSpec, _>(&c2, "trustd", "api", "trustd's refusal", |s| {
        (!s.error.is_empty()).then(|| s.error.clone())
    })
    .await;
    assert!(error.contains("invalid token"), "{error}");
    let certs = c2.get_typed::<ApiCertsSpec>(NAMESPACE, API_ID).await;
    assert!(
        certs.map(|c| c.spec.server.is_none()).unwrap_or(true),
        "a refused worker has no certificate"
    );
}
