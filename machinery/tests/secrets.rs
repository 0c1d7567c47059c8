//! The secrets bundle: upstream's own bundles read as is (the valid one validates, the invalid
//! one gives upstream's six errors), a generated bundle has upstream's key types and CA
//! properties, survives its own YAML, and signs client certificates that chain to its OS CA.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use machinery::secrets::x509::{self, KeyAlgorithm, LeafRequest, PrivateKey, Subject};
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
    // Several roles: one multi-valued Organization RDN, byte for byte as upstream (Go's
    // pkix.Name) writes it: PrintableStrings, the shorter encoding first (DER's SET OF).
    let two = ["os:reader".to_string(), "os:etcd:backup".to_string()];
    let pair = bundle
        .client_certificate(&two, now, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(pem_label(&pair.key), "ED25519 PRIVATE KEY");
    let (crt, _) = pair.parse().unwrap();
    check_client_certificate(
        crt.der(),
        &ca_der,
        &["os:reader", "os:etcd:backup"],
        TWO_ROLES_SUBJECT,
        false,
    );
    assert_eq!(
        cert.subject().as_raw(),
        printable_organizations(&["os:admin"]),
        "one role as before"
    );
    // Signed by another CA, it does not verify against this one.
    let other = Bundle::generate(now).unwrap();
    let foreign = other
        .client_certificate(&roles, now, Duration::from_secs(3600))
        .unwrap();
    let foreign_der = der(&foreign.crt);
    let (_, foreign) = parse_x509_certificate(&foreign_der).unwrap();
    assert!(foreign.verify_signature(Some(ca.public_key())).is_err());
}

/// The Name upstream writes for Organization ["os:reader", "os:etcd:backup"]: one RDN (SET)
/// of two PrintableString values, the shorter encoding first.
const TWO_ROLES_SUBJECT: &[u8] = b"\x30\x2b\x31\x29\
    \x30\x10\x06\x03\x55\x04\x0a\x13\x09os:reader\
    \x30\x15\x06\x03\x55\x04\x0a\x13\x0eos:etcd:backup";

/// A Name of one RDN of these Organization values, each a PrintableString, in this order.
fn printable_organizations(values: &[&str]) -> Vec<u8> {
    let mut set = Vec::new();
    for v in values {
        set.extend_from_slice(&[0x30, 7 + v.len() as u8, 0x06, 0x03, 0x55, 0x04, 0x0a]);
        set.extend_from_slice(&[0x13, v.len() as u8]);
        set.extend_from_slice(v.as_bytes());
    }
    let mut name = vec![0x30, set.len() as u8 + 2, 0x31, set.len() as u8];
    name.extend(set);
    name
}

/// Checks a Talos API client certificate: signed by the CA (and issued under its subject, byte
/// for byte), the subject exactly `subject` (one RDN), `roles` read back by `info()` (in the
/// certificate's order), version 3, a positive serial of at most 128 bits, key usage
/// DigitalSignature (critical), extended key usage ClientAuth, the CA's key identifier as
/// authority key identifier, no SAN; `from_csr`: a subject key identifier (SHA-256 of the key,
/// 20 bytes) and basic constraints CA:FALSE, else neither. openssl agrees when it is installed.
fn check_client_certificate(
    crt_der: &[u8],
    ca_der: &[u8],
    roles: &[&str],
    subject: &[u8],
    from_csr: bool,
) {
    let (_, cert) = parse_x509_certificate(crt_der).unwrap();
    let (_, ca) = parse_x509_certificate(ca_der).unwrap();
    cert.verify_signature(Some(ca.public_key())).unwrap();
    assert_eq!(cert.issuer().as_raw(), ca.subject().as_raw());
    assert_eq!(cert.subject().as_raw(), subject, "the subject's DER");
    assert_eq!(
        cert.subject().iter().count(),
        usize::from(!roles.is_empty())
    );
    assert_eq!(cert.version(), X509Version::V3);
    let serial = cert.raw_serial();
    assert!(serial.len() <= 16 && serial[0] & 0x80 == 0, "{serial:02x?}");
    let crt = x509::Certificate::from_der(crt_der).unwrap();
    let info = crt.info().unwrap();
    assert_eq!(info.organizations, roles);
    assert!(info.common_name.is_none());
    assert!(info.client_auth && !info.server_auth && !info.other_usages && !info.is_ca);
    assert!(info.dns_names.is_empty() && info.ips.is_empty());
    assert!(crt.is_signed_by(&x509::Certificate::from_der(ca_der).unwrap()));
    let ca_key_id = ca
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
            _ => None,
        })
        .unwrap();
    let mut oids = Vec::new();
    for ext in cert.extensions() {
        oids.push(ext.oid.to_id_string());
        match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                assert!(!ext.critical);
                assert_eq!(aki.key_identifier.as_ref().unwrap().0, ca_key_id.as_slice());
                assert!(aki.authority_cert_issuer.is_none() && aki.authority_cert_serial.is_none());
            }
            ParsedExtension::KeyUsage(ku) => {
                assert!(ext.critical);
                assert_eq!(ku.flags, 1, "DigitalSignature only");
            }
            ParsedExtension::ExtendedKeyUsage(eku) => {
                assert!(!ext.critical);
                assert!(eku.client_auth && !eku.server_auth && eku.other.is_empty());
            }
            ParsedExtension::SubjectKeyIdentifier(id) => {
                assert!(!ext.critical);
                let digest = ring_sha256(cert.public_key().raw);
                assert_eq!(id.0, &digest[..20]);
            }
            ParsedExtension::BasicConstraints(bc) => {
                assert!(ext.critical);
                assert!(!bc.ca && bc.path_len_constraint.is_none());
            }
            other => panic!("unexpected extension {other:?}"),
        }
    }
    let mut expected = vec!["2.5.29.35", "2.5.29.15", "2.5.29.37"];
    if from_csr {
        expected.extend(["2.5.29.14", "2.5.29.19"]);
    }
    assert_eq!(oids, expected, "the extensions, in rcgen's order");

    if !testkit::require_program("openssl", "apt-get install openssl") {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "machinery-client-cert-{}-{}",
        std::process::id(),
        testkit::current_test().replace(':', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_pem = dir.join("ca.pem");
    let crt_pem = dir.join("crt.pem");
    std::fs::write(
        &ca_pem,
        x509::Certificate::from_der(ca_der).unwrap().to_pem(),
    )
    .unwrap();
    std::fs::write(&crt_pem, crt.to_pem()).unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "openssl {args:?}: {text}");
        text
    };
    let (ca_path, crt_path) = (ca_pem.to_str().unwrap(), crt_pem.to_str().unwrap());
    let verified = openssl(&[
        "verify",
        "-purpose",
        "sslclient",
        "-CAfile",
        ca_path,
        crt_path,
    ]);
    assert!(verified.contains(": OK"), "{verified}");
    let shown = openssl(&[
        "x509",
        "-noout",
        "-subject",
        "-nameopt",
        "multiline",
        "-in",
        crt_path,
    ]);
    let lines: Vec<&str> = shown
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    if roles.is_empty() {
        assert!(lines.is_empty(), "{shown}");
    } else {
        // One RDN: one line, its values joined by " + ".
        assert_eq!(lines.len(), 1, "{shown}");
        let values: Vec<&str> = lines[0]
            .split(" + ")
            .map(|v| v.trim().strip_prefix("organizationName").unwrap().trim())
            .map(|v| v.strip_prefix("= ").unwrap())
            .collect();
        assert_eq!(values, roles, "{shown}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn ring_sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}

/// Ed25519, ECDSA and RSA CAs sign client certificates of one, two and three roles (and of
/// none) with every role in one RDN; a role that is no PrintableString is a UTF8String, as Go
/// writes it.
#[test]
fn client_certificates_carry_every_role_in_one_organization_rdn_for_every_ca_algorithm() {
    let now = SystemTime::now();
    let three = ["os:reader", "os:operator", "os:etcd:backup"];
    for algorithm in [
        KeyAlgorithm::Ed25519,
        KeyAlgorithm::EcdsaP256,
        KeyAlgorithm::Rsa,
    ] {
        let subject = Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        };
        let (ca, ca_key) = x509::self_signed_ca(&subject, algorithm, now).unwrap();
        let issue = |roles: &[&str]| {
            let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
            let (crt, key) =
                x509::issue_client((&ca, &ca_key), &roles, now, Duration::from_secs(600)).unwrap();
            assert!(crt.matches_key(&key));
            assert_eq!(
                key.algorithm(),
                algorithm,
                "the leaf's key follows the CA's"
            );
            let info = crt.info().unwrap();
            assert_eq!(info.lifetime(), Duration::from_secs(600));
            crt
        };
        let crt = issue(&["os:reader", "os:etcd:backup", "os:reader"]);
        check_client_certificate(
            crt.der(),
            ca.der(),
            &["os:reader", "os:etcd:backup"],
            TWO_ROLES_SUBJECT,
            false,
        );
        let crt = issue(&three);
        check_client_certificate(
            crt.der(),
            ca.der(),
            &three,
            &printable_organizations(&three),
            false,
        );
        let crt = issue(&["os:admin"]);
        check_client_certificate(
            crt.der(),
            ca.der(),
            &["os:admin"],
            &printable_organizations(&["os:admin"]),
            false,
        );
        let crt = issue(&[]);
        check_client_certificate(crt.der(), ca.der(), &[], b"\x30\x00", false);
    }

    // '&' is no PrintableString character (Go's marshaller rejects '*' and '&' too).
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    let pair = bundle
        .client_certificate(
            &["os:reader".into(), "a&b".into()],
            now,
            Duration::from_secs(60),
        )
        .unwrap();
    let (crt, _) = pair.parse().unwrap();
    let (_, cert) = parse_x509_certificate(crt.der()).unwrap();
    let tags: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|a| {
            (
                a.as_str().unwrap().to_string(),
                a.attr_value().header.tag().0,
            )
        })
        .collect();
    assert_eq!(
        tags,
        [("a&b".to_string(), 0x0c), ("os:reader".to_string(), 0x13)],
        "a UTF8String, then a PrintableString (the shorter encoding first)"
    );
}

/// secretsd's signing of apid's CSR (`GenerateClientConfiguration`): every role in one RDN,
/// sorted and once each, for the CSR's key, by Ed25519 and ECDSA CAs, the CSR's subject and
/// extensions ignored.
#[test]
fn a_client_csr_is_signed_with_every_role_in_one_organization_rdn() {
    let now = SystemTime::now();
    for (ca_algorithm, key_algorithm) in [
        (KeyAlgorithm::Ed25519, KeyAlgorithm::Ed25519),
        (KeyAlgorithm::EcdsaP256, KeyAlgorithm::Ed25519),
        (KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP256),
    ] {
        let subject = Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        };
        let (ca, ca_key) = x509::self_signed_ca(&subject, ca_algorithm, now).unwrap();
        let (csr, key) = LeafRequest {
            subject: Subject {
                organizations: vec!["os:admin".into()],
                common_name: Some("someone".into()),
            },
            dns_names: vec!["example.org".into()],
            extended: vec![x509::ExtendedUsage::ServerAuth],
            ..LeafRequest::default()
        }
        .csr(key_algorithm)
        .unwrap();
        let sign = |roles: &[&str]| {
            let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
            let crt = x509::sign_client_csr(
                (&ca, &ca_key),
                csr.as_bytes(),
                &roles,
                now,
                Duration::from_secs(3600),
            )
            .unwrap();
            assert!(crt.matches_key(&key));
            assert_eq!(crt.info().unwrap().lifetime(), Duration::from_secs(3600));
            crt
        };
        let crt = sign(&["os:reader", "os:etcd:backup"]);
        check_client_certificate(
            crt.der(),
            ca.der(),
            &["os:reader", "os:etcd:backup"],
            TWO_ROLES_SUBJECT,
            true,
        );
        let three = ["os:reader", "os:operator", "os:etcd:backup"];
        let crt = sign(&["os:operator", "os:etcd:backup", "os:reader", "os:operator"]);
        check_client_certificate(
            crt.der(),
            ca.der(),
            &three,
            &printable_organizations(&three),
            true,
        );
        let crt = sign(&["os:admin"]);
        check_client_certificate(
            crt.der(),
            ca.der(),
            &["os:admin"],
            &printable_organizations(&["os:admin"]),
            true,
        );
    }
    // A CSR whose signature does not verify is refused, whatever the roles.
    let (ca, ca_key) =
        x509::self_signed_ca(&Subject::default(), KeyAlgorithm::Ed25519, now).unwrap();
    let (csr, _) = LeafRequest::default().csr(KeyAlgorithm::EcdsaP256).unwrap();
    let mut bad = ::pem::parse(csr.as_bytes()).unwrap().contents().to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let bad = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", bad));
    let err = x509::sign_client_csr(
        (&ca, &ca_key),
        bad.as_bytes(),
        &["os:reader".into(), "os:operator".into()],
        now,
        Duration::from_secs(60),
    )
    .unwrap_err();
    assert!(matches!(err, SecretsError::Csr(_)), "{err}");
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

/// A leaf may name its key's algorithm, another than its CA's (the Talos API's serving keys
/// are ECDSA P-256 under the Ed25519 OS CA): issued locally or signed for a CSR (trustd's
/// `sign_csr`), the certificate is the CA's and for a key of that algorithm; a request naming
/// an algorithm does not match a certificate of another (so it is issued again), one naming
/// none follows the CA as upstream's `NewKeyPair`.
#[test]
fn a_leaf_of_another_key_algorithm_than_its_cas_is_issued_and_signed() {
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let (ca, ca_key) =
        x509::self_signed_ca(&Subject::default(), KeyAlgorithm::Ed25519, now).unwrap();
    let ecdsa = LeafRequest {
        subject: Subject {
            organizations: Vec::new(),
            common_name: Some("cp-1".into()),
        },
        ips: vec!["10.5.0.2".parse().unwrap()],
        extended: vec![x509::ExtendedUsage::ServerAuth],
        key_algorithm: Some(KeyAlgorithm::EcdsaP256),
        ..LeafRequest::default()
    };
    let following = LeafRequest {
        key_algorithm: None,
        ..ecdsa.clone()
    };

    let (crt, key) = ecdsa.issue((&ca, &ca_key), now, day).unwrap();
    assert_eq!(key.algorithm(), KeyAlgorithm::EcdsaP256);
    assert!(key
        .to_pem()
        .unwrap()
        .starts_with("-----BEGIN EC PRIVATE KEY-----"));
    assert!(crt.is_signed_by(&ca) && crt.matches_key(&key));
    let info = crt.info().unwrap();
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));
    assert_eq!(crt.key_algorithm(), Some(KeyAlgorithm::EcdsaP256));
    assert!(ecdsa.matches(&info) && following.matches(&info));
    let (_, cert) = X509Certificate::from_der(crt.der()).unwrap();
    assert_eq!(
        cert.signature_algorithm.algorithm.to_id_string(),
        "1.3.101.112",
        "signed with Ed25519"
    );

    // Upstream's default: the CA's algorithm, which a request naming ECDSA does not match.
    let (old, old_key) = following.issue((&ca, &ca_key), now, day).unwrap();
    assert_eq!(old_key.algorithm(), KeyAlgorithm::Ed25519);
    let old_info = old.info().unwrap();
    assert_eq!(old_info.key_algorithm, Some(KeyAlgorithm::Ed25519));
    assert!(following.matches(&old_info));
    assert!(!ecdsa.matches(&old_info), "an Ed25519 key is issued again");

    // A worker's CSR: the request's algorithm, whatever the one given for a request naming none.
    let (csr, csr_key) = ecdsa.csr(KeyAlgorithm::Ed25519).unwrap();
    assert_eq!(csr_key.algorithm(), KeyAlgorithm::EcdsaP256);
    let (_, plain_key) = following.csr(KeyAlgorithm::Ed25519).unwrap();
    assert_eq!(plain_key.algorithm(), KeyAlgorithm::Ed25519);
    // trustd signs the ECDSA key with the Ed25519 CA.
    let signed = x509::sign_csr((&ca, &ca_key), csr.as_bytes(), now, day).unwrap();
    assert!(signed.is_signed_by(&ca) && signed.matches_key(&csr_key));
    let info = signed.info().unwrap();
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));
    assert!(ecdsa.matches(&info));
}
