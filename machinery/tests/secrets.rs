//! The secrets bundle: upstream's own bundles read as is (the valid one validates, the invalid
//! one gives upstream's six errors), a generated bundle has upstream's key types and CA
//! properties, survives its own YAML, and signs client certificates that chain to its OS CA.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use machinery::secrets::x509::{KeyAlgorithm, PrivateKey};
use machinery::secrets::{Bundle, CertAndKey, SecretsError};
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::*;

const UPSTREAM: &str = include_str!("data/upstream-secrets.yaml");
const UPSTREAM_INVALID: &str = include_str!("data/upstream-invalid-secrets.yaml");

fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn pem_label(b64: &str) -> String {
    ::pem::parse(unb64(b64)).unwrap().tag().to_string()
}

fn der(b64: &str) -> Vec<u8> {
    ::pem::parse(unb64(b64)).unwrap().contents().to_vec()
}

#[test]
fn upstreams_bundle_is_read_as_is_and_validates() {
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    bundle.validate().unwrap();
    let certs = bundle.certs.as_ref().unwrap();
    assert_eq!(
        bundle.trustdinfo.as_ref().unwrap().token,
        "oamejv.9tk1nhuwnlc2nghf"
    );
    assert_eq!(
        pem_label(&certs.os.as_ref().unwrap().key),
        "ED25519 PRIVATE KEY"
    );
    let (_, os_key) = certs.os.as_ref().unwrap().parse().unwrap();
    assert_eq!(os_key.algorithm(), KeyAlgorithm::Ed25519);
    let (_, etcd_key) = certs.etcd.as_ref().unwrap().parse().unwrap();
    assert_eq!(etcd_key.algorithm(), KeyAlgorithm::EcdsaP256);
    // Re-encoding a key writes upstream's label and the same key.
    let again = etcd_key.to_pem().unwrap();
    assert!(
        again.starts_with("-----BEGIN EC PRIVATE KEY-----"),
        "{again}"
    );
    assert_eq!(
        PrivateKey::from_pem(again.as_bytes())
            .unwrap()
            .public_key_der()
            .unwrap(),
        etcd_key.public_key_der().unwrap()
    );
    // The bundle survives our YAML unchanged.
    let text = bundle.to_yaml().unwrap();
    assert_eq!(Bundle::from_yaml(&text).unwrap(), bundle);
}

#[test]
fn upstreams_invalid_bundle_gives_upstreams_six_errors() {
    let bundle = Bundle::from_yaml(UPSTREAM_INVALID).unwrap();
    let err = bundle.validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "6 errors occurred:
\t* cluster.secret is required
\t* one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is required
\t* trustdinfo is required
\t* certs.etcd is invalid: failed to parse PEM block
\t* certs.k8saggregator is required
\t* certs.os is invalid: unsupported key type: \"CERTIFICATE\""
    );
}

#[test]
fn an_empty_or_partial_bundle_names_every_missing_part() {
    let p = Bundle::from_yaml("").unwrap().problems();
    assert_eq!(
        p,
        [
            "cluster is required",
            "secrets is required",
            "trustdinfo is required",
            "certs is required"
        ]
    );
    let mut bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let secrets = bundle.secrets.as_mut().unwrap();
    secrets.aescbcencryptionsecret = "x".into();
    let certs = bundle.certs.as_mut().unwrap();
    certs.k8sserviceaccount.as_mut().unwrap().key = "not base64!".into();
    // The OS CA with etcd's key: both parse, but they are no pair.
    certs.os.as_mut().unwrap().key = certs.etcd.as_ref().unwrap().key.clone();
    assert_eq!(
        bundle.problems(),
        [
            "only one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is allowed",
            "certs.os is invalid: invalid key: the key is not the certificate's",
            "certs.k8sserviceaccount.key is invalid: key is not base64",
        ]
    );
    assert!(matches!(
        Bundle::from_yaml("cluster: [1, 2]"),
        Err(SecretsError::Decode(_))
    ));
}

#[test]
fn the_json_form_with_capitalised_keys_is_read() {
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let c = bundle.certs.as_ref().unwrap();
    let pair = |p: &Option<CertAndKey>| {
        let p = p.as_ref().unwrap();
        serde_json::json!({"Crt": p.crt, "Key": p.key})
    };
    let json = serde_json::json!({
        "Cluster": {"Id": bundle.cluster.as_ref().unwrap().id, "Secret": bundle.cluster.as_ref().unwrap().secret},
        "Secrets": {"BootstrapToken": bundle.secrets.as_ref().unwrap().bootstraptoken,
                    "SecretboxEncryptionSecret": bundle.secrets.as_ref().unwrap().secretboxencryptionsecret},
        "TrustdInfo": {"Token": bundle.trustdinfo.as_ref().unwrap().token},
        "Certs": {"Etcd": pair(&c.etcd), "K8s": pair(&c.k8s), "K8sAggregator": pair(&c.k8saggregator),
                  "K8sServiceAccount": {"Key": c.k8sserviceaccount.as_ref().unwrap().key},
                  "OS": pair(&c.os)},
    });
    let from_json = Bundle::from_yaml(&json.to_string()).unwrap();
    assert_eq!(from_json, bundle);
}

/// The CA at `pair` as upstream makes one.
fn assert_upstream_ca(name: &str, pair: &CertAndKey, organization: Option<&str>, now: SystemTime) {
    let der = der(&pair.crt);
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    assert!(cert.is_ca(), "{name} is a CA");
    let orgs: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert_eq!(orgs, organization.into_iter().collect::<Vec<_>>(), "{name}");
    assert_eq!(
        cert.subject().iter_common_name().count(),
        0,
        "{name}: no CN"
    );
    assert_eq!(cert.subject(), cert.issuer(), "{name} is self-signed");
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(
        ku.key_cert_sign() && ku.digital_signature(),
        "{name}: {ku:?}"
    );
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth, "{name}");
    let skid = cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.len()),
            _ => None,
        });
    assert_eq!(skid, Some(20), "{name}: a 20-byte subject key identifier");
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!(cert.validity().not_before.timestamp(), secs(now), "{name}");
    assert_eq!(
        cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp(),
        87_600 * 3600,
        "{name}: 87600 h"
    );
    assert!(cert.serial.bits() > 64, "{name}: a random serial");
    cert.verify_signature(None).unwrap();
}

#[test]
fn a_generated_bundle_has_upstreams_key_types_and_ca_properties() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let bundle = Bundle::generate(now).unwrap();
    bundle.validate().unwrap();
    let c = bundle.certs.as_ref().unwrap();
    assert_eq!(
        pem_label(&c.os.as_ref().unwrap().key),
        "ED25519 PRIVATE KEY"
    );
    for p in [&c.etcd, &c.k8s, &c.k8saggregator] {
        assert_eq!(pem_label(&p.as_ref().unwrap().key), "EC PRIVATE KEY");
    }
    let sa = &c.k8sserviceaccount.as_ref().unwrap().key;
    assert_eq!(pem_label(sa), "RSA PRIVATE KEY");
    {
        use rsa::pkcs1::DecodeRsaPrivateKey as _;
        use rsa::traits::PublicKeyParts as _;
        let key = rsa::PrivateKey::from_pkcs1_der(&der(sa)).unwrap();
        assert_eq!(key.size() * 8, 4096, "an RSA-4096 service-account key");
    }
    assert_upstream_ca("os", c.os.as_ref().unwrap(), Some("talos"), now);
    assert_upstream_ca("etcd", c.etcd.as_ref().unwrap(), Some("etcd"), now);
    assert_upstream_ca("k8s", c.k8s.as_ref().unwrap(), Some("kubernetes"), now);
    assert_upstream_ca(
        "k8saggregator",
        c.k8saggregator.as_ref().unwrap(),
        None,
        now,
    );

    let token = regex_lite(&bundle.trustdinfo.as_ref().unwrap().token);
    assert!(token, "trustd token shape");
    assert!(regex_lite(&bundle.secrets.as_ref().unwrap().bootstraptoken));
    let secretbox = unb64(&bundle.secrets.as_ref().unwrap().secretboxencryptionsecret);
    assert_eq!(secretbox.len(), 32);
    assert!(bundle
        .secrets
        .as_ref()
        .unwrap()
        .aescbcencryptionsecret
        .is_empty());
    assert_eq!(unb64(&bundle.cluster.as_ref().unwrap().id).len(), 32);
    assert_eq!(unb64(&bundle.cluster.as_ref().unwrap().secret).len(), 32);

    // PEM as Go writes it: LF line endings.
    for p in [&c.os, &c.etcd, &c.k8s, &c.k8saggregator] {
        let p = p.as_ref().unwrap();
        for field in [&p.crt, &p.key] {
            let text = String::from_utf8(unb64(field)).unwrap();
            assert!(
                !text.contains('\r') && text.ends_with("-----\n"),
                "{text:?}"
            );
        }
    }
    // Its YAML is upstream's layout and reads back the same.
    let text = bundle.to_yaml().unwrap();
    for key in [
        "cluster:\n  id: ",
        "secrets:\n  bootstraptoken: ",
        "trustdinfo:\n  token: ",
        "certs:\n  etcd:\n    crt: ",
        "  k8sserviceaccount:\n    key: ",
    ] {
        assert!(text.contains(key), "{key:?} in\n{text}");
    }
    assert_eq!(Bundle::from_yaml(&text).unwrap(), bundle);

    // Two bundles share nothing.
    let other = Bundle::generate(now).unwrap();
    assert_ne!(other.cluster, bundle.cluster);
    assert_ne!(other.trustdinfo, bundle.trustdinfo);
    assert_ne!(other.certs.as_ref().unwrap().os, c.os);
}

/// `[a-z0-9]{6}.[a-z0-9]{16}`.
fn regex_lite(t: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    matches!(t.split_once('.'), Some((a, b)) if ok(a, 6) && ok(b, 16))
}

#[test]
fn client_certificates_chain_to_the_os_ca_of_upstreams_bundle() {
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let now = SystemTime::now();
    let roles = vec!["os:admin".to_string(), "os:admin".to_string()];
    let pair = bundle
        .client_certificate(&roles, now, Duration::from_secs(8760 * 3600))
        .unwrap();
    assert_eq!(pem_label(&pair.key), "ED25519 PRIVATE KEY");
    pair.parse().unwrap();
    let der_crt = der(&pair.crt);
    let (_, cert) = parse_x509_certificate(&der_crt).unwrap();
    let ca_der = der(&bundle.certs.as_ref().unwrap().os.as_ref().unwrap().crt);
    let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
    cert.verify_signature(Some(ca.public_key())).unwrap();
    assert_eq!(cert.issuer(), ca.subject());
    assert!(!cert.is_ca());
    let orgs: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert_eq!(orgs, ["os:admin"], "the role, as organization");
    assert_eq!(cert.subject().iter_common_name().count(), 0);
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && !ku.key_cert_sign());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    assert_eq!(
        cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp(),
        8760 * 3600
    );
    // Several roles: upstream's multi-valued RDN is not written yet, and that is an error,
    // not a certificate with one of them.
    let two = ["os:reader".to_string(), "os:operator".to_string()];
    let err = bundle
        .client_certificate(&two, now, Duration::from_secs(3600))
        .unwrap_err();
    assert!(matches!(err, SecretsError::Unsupported(_)), "{err}");
    // Signed by another CA, it does not verify against this one.
    let other = Bundle::generate(now).unwrap();
    let foreign = other
        .client_certificate(&roles, now, Duration::from_secs(3600))
        .unwrap();
    let foreign_der = der(&foreign.crt);
    let (_, foreign) = parse_x509_certificate(&foreign_der).unwrap();
    assert!(foreign.verify_signature(Some(ca.public_key())).is_err());
}

/// Ed25519 keys are written as upstream writes them: PKCS#8 v1 (Go's `MarshalPKCS8PrivateKey`,
/// 48 bytes, no public key), which BoringSSL-based clients (gRPC's C-core) also read; and
/// they read back as the same key.
#[test]
fn ed25519_keys_are_written_as_pkcs8_v1_and_read_back() {
    let key = PrivateKey::generate(KeyAlgorithm::Ed25519).unwrap();
    let pem = key.to_pem().unwrap();
    assert!(
        pem.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\nMC4CAQAwBQYDK2Vw"),
        "{pem}"
    );
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    assert_eq!(der.len(), 48);
    let again = PrivateKey::from_pem(pem.as_bytes()).unwrap();
    assert_eq!(again.to_pem().unwrap(), pem);
    assert_eq!(
        again.public_key_der().unwrap(),
        key.public_key_der().unwrap()
    );
}
