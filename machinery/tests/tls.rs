//! TLS credentials: a certificate is served only with its own key, and clients trust only the
//! CAs they are given.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, SystemTime};

use machinery::secrets::x509::{self, KeyAlgorithm, LeafRequest, Subject};
use machinery::tls::rustls;
use machinery::tls::{certified_key, client_config, server_config, ClientCas, ServerCertificate};

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
    let cas = ClientCas::default();
    cas.set(std::slice::from_ref(&ca_crt)).unwrap();
    assert!(cas.set(&[]).is_err(), "an empty CA list is refused");
    let s = server_config(cert, Some(cas)).unwrap();
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

/// Runs a TLS handshake in memory between a server accepting clients of `client_ca` and a
/// client presenting `identity`: Ok when both sides complete it.
fn handshake(
    server_ca: (&x509::Certificate, &x509::PrivateKey),
    cas: &ClientCas,
    identity: Option<(&str, &str)>,
) -> Result<(), String> {
    use std::sync::Arc;
    let (srv_crt, srv_key) = LeafRequest {
        ips: vec!["127.0.0.1".parse().unwrap()],
        extended: vec![x509::ExtendedUsage::ServerAuth],
        ..LeafRequest::default()
    }
    .issue(server_ca, SystemTime::now(), Duration::from_secs(600))
    .unwrap();
    let cert = ServerCertificate::default();
    cert.set(certified_key(&srv_crt.to_pem(), &srv_key.to_pem().unwrap()).unwrap());
    let scfg = Arc::new(server_config(cert, Some(cas.clone())).unwrap());
    let ccfg = Arc::new(client_config(std::slice::from_ref(server_ca.0), identity).unwrap());
    let mut server = rustls::ServerConnection::new(scfg).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut client = rustls::ClientConnection::new(ccfg, name).unwrap();
    for _ in 0..20 {
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            server.read_tls(&mut buf.as_slice()).unwrap();
            server
                .process_new_packets()
                .map_err(|e| format!("server: {e}"))?;
        }
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            client.read_tls(&mut buf.as_slice()).unwrap();
            client
                .process_new_packets()
                .map_err(|e| format!("client: {e}"))?;
        }
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
    }
    Err("handshake did not finish".into())
}

fn client_leaf(
    ca: (&x509::Certificate, &x509::PrivateKey),
    extended: Vec<x509::ExtendedUsage>,
) -> (String, String) {
    let (crt, key) = LeafRequest {
        subject: Subject {
            organizations: vec!["os:admin".into()],
            common_name: None,
        },
        extended,
        ..LeafRequest::default()
    }
    .issue(ca, SystemTime::now(), Duration::from_secs(600))
    .unwrap();
    (crt.to_pem(), key.to_pem().unwrap())
}

#[test]
fn clients_need_a_client_certificate_of_an_accepted_ca() {
    let (ca_crt, ca_key) = ca();
    let (other_crt, other_key) = ca();
    let cas = ClientCas::default();
    let ok = client_leaf((&ca_crt, &ca_key), vec![x509::ExtendedUsage::ClientAuth]);
    // No CA yet: nobody gets in.
    let e = handshake((&ca_crt, &ca_key), &cas, Some((&ok.0, &ok.1))).unwrap_err();
    assert!(e.contains("server"), "{e}");
    cas.set(std::slice::from_ref(&ca_crt)).unwrap();
    handshake((&ca_crt, &ca_key), &cas, Some((&ok.0, &ok.1))).unwrap();
    // No certificate, a foreign CA's, a server certificate, a certificate for both uses.
    assert!(handshake((&ca_crt, &ca_key), &cas, None).is_err());
    let foreign = client_leaf(
        (&other_crt, &other_key),
        vec![x509::ExtendedUsage::ClientAuth],
    );
    let e = handshake((&ca_crt, &ca_key), &cas, Some((&foreign.0, &foreign.1))).unwrap_err();
    assert!(e.contains("server"), "{e}");
    let server = client_leaf((&ca_crt, &ca_key), vec![x509::ExtendedUsage::ServerAuth]);
    assert!(handshake((&ca_crt, &ca_key), &cas, Some((&server.0, &server.1))).is_err());
    let both = client_leaf(
        (&ca_crt, &ca_key),
        vec![
            x509::ExtendedUsage::ServerAuth,
            x509::ExtendedUsage::ClientAuth,
        ],
    );
    let e = handshake((&ca_crt, &ca_key), &cas, Some((&both.0, &both.1))).unwrap_err();
    assert!(e.contains("purpose") || e.contains("Purpose"), "{e}");
    // The CAs swap in place: the foreign client gets in, the first one no longer does.
    cas.set(std::slice::from_ref(&other_crt)).unwrap();
    let e = handshake((&ca_crt, &ca_key), &cas, Some((&ok.0, &ok.1)));
    assert!(e.is_err());
    handshake((&ca_crt, &ca_key), &cas, Some((&foreign.0, &foreign.1))).unwrap();
}
