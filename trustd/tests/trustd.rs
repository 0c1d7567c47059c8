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
    let (ca, crt) = request_certificate(
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
