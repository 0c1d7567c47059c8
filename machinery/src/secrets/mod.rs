//! The secrets bundle (`talosctl gen secrets` → `secrets.yaml`), as upstream's
//! `pkg/machinery/config/generate/secrets`: the cluster identity, the Kubernetes bootstrap token
//! and encryption secret, the trustd token, and the CAs of etcd, Kubernetes, the aggregation
//! layer and the Talos API, with the service-account key.
//!
//! ```yaml
//! cluster: {id: <base64>, secret: <base64>}
//! secrets: {bootstraptoken: abcdef.0123456789abcdef, secretboxencryptionsecret: <base64>}
//! trustdinfo: {token: abcdef.0123456789abcdef}
//! certs:
//!     etcd: {crt: <base64 PEM>, key: <base64 PEM>}     # ECDSA P-256, O=etcd
//!     k8s: {crt, key}                                  # ECDSA P-256, O=kubernetes
//!     k8saggregator: {crt, key}                        # ECDSA P-256, empty subject
//!     k8sserviceaccount: {key}                         # RSA-4096, PKCS#1
//!     os: {crt, key}                                   # Ed25519, O=talos
//! ```
//!
//! A bundle written by upstream's talosctl (YAML, or the JSON form with capitalised keys that
//! Omni and the Terraform provider use) reads as is; fields this version does not know are
//! ignored, as upstream's decoder does. [`Bundle::validate`] names every missing or broken
//! part, with upstream's messages.

pub mod x509;

use std::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::config::v1alpha1::{CertificateAndKey, PrivateKey as ConfigPrivateKey};
use x509::{KeyAlgorithm, Subject};

/// The algorithm of the Talos API's serving keys (apid's, also in maintenance, and trustd's),
/// whatever the OS CA's (Ed25519, upstream's): gRPC's C-core clients (Python's grpcio, C++,
/// Ruby) do their TLS with BoringSSL, which does not accept Ed25519 handshake signatures
/// (grpc/grpc#24252), and would not get in. They verify a certificate the Ed25519 CA signed,
/// and sign with a talosconfig's Ed25519 client key: only the server's key must be another.
pub const API_SERVING_KEY: KeyAlgorithm = KeyAlgorithm::EcdsaP256;

/// Why a bundle or a key cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The system's random generator failed.
    #[error("the system random generator failed")]
    Random,
    /// A crypto library refused to make a key or certificate.
    #[error("{0}")]
    Crypto(String),
    /// Not PEM.
    #[error("failed to parse PEM block")]
    Pem,
    /// A PEM block of a label that is no private key.
    #[error("unsupported key type: {0:?}")]
    UnsupportedKeyType(String),
    /// A key block that does not parse.
    #[error("invalid key: {0}")]
    Key(String),
    /// A certificate that does not parse.
    #[error("invalid certificate: {0}")]
    Certificate(String),
    /// A certificate signing request that does not parse or verify.
    #[error("invalid CSR: {0}")]
    Csr(String),
    /// A field is not base64.
    #[error("{0} is not base64")]
    Base64(&'static str),
    /// The bundle's text does not decode.
    #[error("invalid secrets bundle: {0}")]
    Decode(String),
    /// A name a certificate cannot carry (a SAN that is no DNS name).
    #[error("{0}")]
    Unsupported(String),
    /// Every problem of a bundle, in upstream's order.
    #[error("{}", Problems(.0))]
    Invalid(Vec<String>),
}

struct Problems<'a>(&'a [String]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "{n} {} occurred:",
            if n == 1 { "error" } else { "errors" }
        )?;
        for p in self.0 {
            write!(f, "\n\t* {p}")?;
        }
        Ok(())
    }
}

/// Size of the cluster id and secret (upstream's `DefaultClusterIDSize`/`SecretSize`).
const CLUSTER_ID_SIZE: usize = 32;

/// The cluster's discovery identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterSecrets {
    /// Base64 of 32 random bytes.
    #[serde(alias = "Id")]
    pub id: String,
    /// Base64 of 32 random bytes.
    #[serde(alias = "Secret")]
    pub secret: String,
}

/// Kubernetes secrets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Secrets {
    /// `[a-z0-9]{6}.[a-z0-9]{16}`.
    #[serde(alias = "BootstrapToken")]
    pub bootstraptoken: String,
    /// Legacy (contracts ≤ 1.2): AES-CBC key, base64 of 32 bytes.
    #[serde(
        alias = "AESCBCEncryptionSecret",
        skip_serializing_if = "String::is_empty"
    )]
    pub aescbcencryptionsecret: String,
    /// Secretbox key, base64 of 32 bytes.
    #[serde(
        alias = "SecretboxEncryptionSecret",
        skip_serializing_if = "String::is_empty"
    )]
    pub secretboxencryptionsecret: String,
}

/// trustd's credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrustdInfo {
    /// `[a-z0-9]{6}.[a-z0-9]{16}`: the `machine.token` of every node.
    #[serde(alias = "Token")]
    pub token: String,
}

/// A base64-encoded PEM certificate and key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CertAndKey {
    /// Base64 of the PEM certificate.
    #[serde(alias = "Crt")]
    pub crt: String,
    /// Base64 of the PEM private key.
    #[serde(alias = "Key")]
    pub key: String,
}

impl CertAndKey {
    /// The certificate and the key as PEM text (decoded from base64).
    pub fn pem(&self) -> Result<(String, String), SecretsError> {
        let text =
            |field, b64: &str| String::from_utf8(unb64(field, b64)?).map_err(|_| SecretsError::Pem);
        Ok((text("crt", &self.crt)?, text("key", &self.key)?))
    }
}

/// A base64-encoded PEM key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeyOnly {
    /// Base64 of the PEM private key.
    #[serde(alias = "Key")]
    pub key: String,
}

/// The CAs and the service-account key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Certs {
    /// etcd CA.
    #[serde(alias = "Etcd", skip_serializing_if = "Option::is_none")]
    pub etcd: Option<CertAndKey>,
    /// Kubernetes CA.
    #[serde(alias = "K8s", skip_serializing_if = "Option::is_none")]
    pub k8s: Option<CertAndKey>,
    /// Kubernetes aggregation layer (front proxy) CA.
    #[serde(alias = "K8sAggregator", skip_serializing_if = "Option::is_none")]
    pub k8saggregator: Option<CertAndKey>,
    /// Service-account token signing key.
    #[serde(alias = "K8sServiceAccount", skip_serializing_if = "Option::is_none")]
    pub k8sserviceaccount: Option<KeyOnly>,
    /// Talos API CA.
    #[serde(alias = "OS", skip_serializing_if = "Option::is_none")]
    pub os: Option<CertAndKey>,
}

/// The secrets bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bundle {
    /// Discovery identity.
    #[serde(alias = "Cluster", skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSecrets>,
    /// Kubernetes secrets.
    #[serde(alias = "Secrets", skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Secrets>,
    /// trustd credentials.
    #[serde(alias = "TrustdInfo", skip_serializing_if = "Option::is_none")]
    pub trustdinfo: Option<TrustdInfo>,
    /// CAs and keys.
    #[serde(alias = "Certs", skip_serializing_if = "Option::is_none")]
    pub certs: Option<Certs>,
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(field: &'static str, s: &str) -> Result<Vec<u8>, SecretsError> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|_| SecretsError::Base64(field))
}

/// A token of the form `[a-z0-9]{first}.[a-z0-9]{second}` (kubeadm's bootstrap token, trustd's
/// token), each character drawn without bias.
pub fn token(first: usize, second: usize) -> Result<String, SecretsError> {
    const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(first + second + 1);
    for (i, n) in [first, second].into_iter().enumerate() {
        if i == 1 {
            out.push('.');
        }
        let mut left = n;
        while left > 0 {
            for b in x509::random(n * 2)? {
                // 252 = 7 * 36: bytes above it would favour the first letters.
                if b < 252 && left > 0 {
                    out.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
                    left -= 1;
                }
            }
        }
    }
    Ok(out)
}

fn ca(
    organization: Option<&str>,
    algorithm: KeyAlgorithm,
    now: SystemTime,
) -> Result<CertAndKey, SecretsError> {
    let subject = Subject {
        organizations: organization.map(str::to_string).into_iter().collect(),
        common_name: None,
    };
    let (crt, key) = x509::self_signed_ca(&subject, algorithm, now)?;
    Ok(CertAndKey {
        crt: b64(crt.to_pem().as_bytes()),
        key: b64(key.to_pem()?.as_bytes()),
    })
}

impl Bundle {
    /// A new bundle with every part generated, as upstream's `NewBundle` for the current
    /// contract: secretbox encryption, an RSA-4096 service-account key.
    pub fn generate(now: SystemTime) -> Result<Bundle, SecretsError> {
        let mut bundle = Bundle::default();
        bundle.populate(now)?;
        Ok(bundle)
    }

    /// Generates every part that is missing (upstream's `populate`).
    pub fn populate(&mut self, now: SystemTime) -> Result<(), SecretsError> {
        let certs = self.certs.get_or_insert_with(Certs::default);
        if certs.etcd.is_none() {
            certs.etcd = Some(ca(Some("etcd"), KeyAlgorithm::EcdsaP256, now)?);
        }
        if certs.k8s.is_none() {
            certs.k8s = Some(ca(Some("kubernetes"), KeyAlgorithm::EcdsaP256, now)?);
        }
        if certs.k8saggregator.is_none() {
            // Upstream asks for CN=front-proxy, but its CA subject carries only
            // organizations: the aggregator CA's subject is empty.
            certs.k8saggregator = Some(ca(None, KeyAlgorithm::EcdsaP256, now)?);
        }
        if certs.k8sserviceaccount.is_none() {
            let key = x509::PrivateKey::generate(KeyAlgorithm::Rsa)?;
            certs.k8sserviceaccount = Some(KeyOnly {
                key: b64(key.to_pem()?.as_bytes()),
            });
        }
        if certs.os.is_none() {
            certs.os = Some(ca(Some("talos"), KeyAlgorithm::Ed25519, now)?);
        }
        let secrets = self.secrets.get_or_insert_with(Secrets::default);
        if secrets.bootstraptoken.is_empty() {
            secrets.bootstraptoken = token(6, 16)?;
        }
        if secrets.secretboxencryptionsecret.is_empty() && secrets.aescbcencryptionsecret.is_empty()
        {
            secrets.secretboxencryptionsecret = b64(&x509::random(32)?);
        }
        let trustd = self.trustdinfo.get_or_insert_with(TrustdInfo::default);
        if trustd.token.is_empty() {
            trustd.token = token(6, 16)?;
        }
        let cluster = self.cluster.get_or_insert_with(ClusterSecrets::default);
        if cluster.id.is_empty() {
            cluster.id = b64(&x509::random(CLUSTER_ID_SIZE)?);
        }
        if cluster.secret.is_empty() {
            cluster.secret = b64(&x509::random(CLUSTER_ID_SIZE)?);
        }
        Ok(())
    }

    /// Reads a bundle: YAML (`secrets.yaml`) or its JSON form (a subset of YAML).
    pub fn from_yaml(text: &str) -> Result<Bundle, SecretsError> {
        let bundle: Option<Bundle> =
            serde_yaml_ng::from_str(text).map_err(|e| SecretsError::Decode(e.to_string()))?;
        Ok(bundle.unwrap_or_default())
    }

    /// The bundle as upstream's `secrets.yaml`.
    pub fn to_yaml(&self) -> Result<String, SecretsError> {
        serde_yaml_ng::to_string(self).map_err(|e| SecretsError::Decode(e.to_string()))
    }

    /// Every problem of the bundle, in upstream's words and order; empty if it is complete.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        match &self.cluster {
            None => p.push("cluster is required".to_string()),
            Some(c) => {
                if c.id.is_empty() {
                    p.push("cluster.id is required".into());
                }
                if c.secret.is_empty() {
                    p.push("cluster.secret is required".into());
                }
            }
        }
        match &self.secrets {
            None => p.push("secrets is required".into()),
            Some(s) => {
                if s.bootstraptoken.is_empty() {
                    p.push("secrets.bootstraptoken is required".into());
                }
                match (
                    s.secretboxencryptionsecret.is_empty(),
                    s.aescbcencryptionsecret.is_empty(),
                ) {
                    (true, true) => p.push(
                        "one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is required"
                            .into(),
                    ),
                    (false, false) => p.push(
                        "only one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is allowed"
                            .into(),
                    ),
                    _ => {}
                }
            }
        }
        match &self.trustdinfo {
            None => p.push("trustdinfo is required".into()),
            Some(t) if t.token.is_empty() => p.push("trustdinfo.token is required".into()),
            Some(_) => {}
        }
        let Some(certs) = &self.certs else {
            p.push("certs is required".into());
            return p;
        };
        for (name, pair) in [
            ("etcd", &certs.etcd),
            ("k8s", &certs.k8s),
            ("k8saggregator", &certs.k8saggregator),
            ("os", &certs.os),
        ] {
            match pair {
                None => p.push(format!("certs.{name} is required")),
                Some(pair) => {
                    if let Err(e) = pair.parse() {
                        p.push(format!("certs.{name} is invalid: {e}"));
                    }
                }
            }
        }
        match &certs.k8sserviceaccount {
            None => p.push("certs.k8sserviceaccount is required".into()),
            Some(k) => {
                if let Err(e) =
                    unb64("key", &k.key).and_then(|pem| x509::PrivateKey::from_pem(&pem))
                {
                    p.push(format!("certs.k8sserviceaccount.key is invalid: {e}"));
                }
            }
        }
        p
    }

    /// Ok if the bundle is complete, else every problem ([`SecretsError::Invalid`]).
    pub fn validate(&self) -> Result<(), SecretsError> {
        let p = self.problems();
        if p.is_empty() {
            Ok(())
        } else {
            Err(SecretsError::Invalid(p))
        }
    }

    /// The Talos API CA of a valid bundle.
    pub fn os_ca(&self) -> Result<(x509::Certificate, x509::PrivateKey), SecretsError> {
        self.certs
            .as_ref()
            .and_then(|c| c.os.as_ref())
            .ok_or_else(|| SecretsError::Invalid(vec!["certs.os is required".into()]))?
            .parse()
    }

    /// The OS CA's certificate as the talosconfig's `ca` holds it (base64 PEM); empty when the
    /// bundle has none.
    pub fn os_ca_crt(&self) -> String {
        self.certs
            .as_ref()
            .and_then(|c| c.os.as_ref())
            .map(|os| os.crt.clone())
            .unwrap_or_default()
    }

    /// A Talos API client certificate signed by the OS CA, as upstream's
    /// `NewAdminCertificateAndKey`: the roles (sorted, once each) as one multi-valued
    /// organization RDN, no common name, key usage DigitalSignature, extended key usage
    /// ClientAuth, valid from `now` for `ttl` ([`x509::issue_client`]).
    pub fn client_certificate(
        &self,
        roles: &[String],
        now: SystemTime,
        ttl: Duration,
    ) -> Result<CertAndKey, SecretsError> {
        let (ca_crt, ca_key) = self.os_ca()?;
        let (crt, key) = x509::issue_client((&ca_crt, &ca_key), roles, now, ttl)?;
        Ok(CertAndKey {
            crt: b64(crt.to_pem().as_bytes()),
            key: b64(key.to_pem()?.as_bytes()),
        })
    }
}

impl CertAndKey {
    /// The certificate and key, parsed; the key must be the certificate's.
    pub fn parse(&self) -> Result<(x509::Certificate, x509::PrivateKey), SecretsError> {
        // Upstream reads the key first, then the certificate.
        let key = x509::PrivateKey::from_pem(&unb64("key", &self.key)?)?;
        let crt = x509::Certificate::from_pem(&unb64("crt", &self.crt)?)?;
        if crt.public_key_der()? != key.public_key_der()? {
            return Err(SecretsError::Key(
                "the key is not the certificate's".to_string(),
            ));
        }
        Ok((crt, key))
    }

    /// As a machine config `crt`/`key` pair; `with_key: false` leaves the key out.
    pub fn to_config(&self, with_key: bool) -> CertificateAndKey {
        CertificateAndKey {
            crt: Some(self.crt.clone()),
            key: with_key.then(|| self.key.clone()),
        }
    }
}

impl KeyOnly {
    /// As a machine config key.
    pub fn to_config(&self) -> ConfigPrivateKey {
        ConfigPrivateKey {
            key: Some(self.key.clone()),
        }
    }
}

/// Whether `given` is the token `expected`, compared as upstream's trustd does: the SHA-256 of
/// each, in constant time (the time taken says nothing about how much of a guess was right).
/// An empty `expected` matches nothing.
pub fn token_matches(expected: &str, given: &str) -> bool {
    let a = ring::digest::digest(&ring::digest::SHA256, expected.as_bytes());
    let b = ring::digest::digest(&ring::digest::SHA256, given.as_bytes());
    let diff = a
        .as_ref()
        .iter()
        .zip(b.as_ref())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    !expected.is_empty() && diff == 0
}
