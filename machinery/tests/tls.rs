//! TLS credentials: a certificate is served only with its own key, and clients trust only the
//! CAs they are given.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, SystemTime};

use machinery::secrets::x509::{self, KeyAlgorithm, LeafRequest, Subject};
use machinery::tls::{certified_key, client_config, server_config, ServerCertificate};

fn ca() -> (x509::Certificate, x509::PrivateKey) {
    x509::self_signed_ca(
        &Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        },
        KeyAlgorithm::Ed25519,
        SystemTime::now(),
    )
    .unwrap()
}

#[test]
fn a_certificate_is_served_only_with_its_own_key() {
    let (ca_crt, ca_key) = ca();
    let (crt, key) = LeafRequest::default()
        .issue(
            (&ca_crt, &ca_key),
            SystemTime::now(),
            Duration::from_secs(60),
        )
        .unwrap();
    let (_, other) = LeafRequest::default()
        .issue(
            (&ca_crt, &ca_key),
            SystemTime::now(),
            Duration::from_secs(60),
        )
        .unwrap();
    certified_key(&crt.to_pem(), &key.to_pem().unwrap()).unwrap();
    let e = certified_key(&crt.to_pem(), &other.to_pem().unwrap()).unwrap_err();
    assert!(e.to_string().contains("not the certificate's"), "{e}");
    assert!(certified_key("garbage", &key.to_pem().unwrap()).is_err());
    assert!(certified_key(&crt.to_pem(), "garbage").is_err());
}

#[test]
fn configs_are_tls_1_3_only_and_speak_h2() {
    let (ca_crt, _) = ca();
    let cert = ServerCertificate::default();
    assert!(!cert.is_set());
    let s = server_config(cert, Some(std::slice::from_ref(&ca_crt))).unwrap();
    assert_eq!(s.alpn_protocols, [b"h2".to_vec()]);
    assert_eq!(s.send_tls13_tickets, 0);
    let c = client_config(&[ca_crt], None).unwrap();
    assert_eq!(c.alpn_protocols, [b"h2".to_vec()]);
}

#[test]
fn a_csr_signed_by_trustds_rules_loses_its_organization_and_client_use() {
    let (ca_crt, ca_key) = ca();
    let (csr, key) = LeafRequest {
        subject: Subject {
            organizations: vec!["os:admin".into()],
            common_name: Some("w-1".into()),
        },
        dns_names: vec!["w-1".into()],
        ips: vec!["10.5.0.3".parse().unwrap()],
        extended: vec![x509::ExtendedUsage::ClientAuth],
        ..LeafRequest::default()
    }
    .csr(KeyAlgorithm::Ed25519)
    .unwrap();
    let crt = x509::sign_csr(
        (&ca_crt, &ca_key),
        csr.as_bytes(),
        SystemTime::now(),
        Duration::from_secs(3600),
    )
    .unwrap();
    assert!(crt.is_signed_by(&ca_crt));
    assert!(crt.matches_key(&key));
    let info = crt.info().unwrap();
    assert!(info.organizations.is_empty());
    assert!(info.server_auth && !info.client_auth && !info.is_ca);
    assert_eq!(info.common_name.as_deref(), Some("w-1"));
    let big = vec![b'x'; x509::MAX_CSR + 1];
    assert!(x509::sign_csr(
        (&ca_crt, &ca_key),
        &big,
        SystemTime::now(),
        Duration::from_secs(1)
    )
    .is_err());
}
