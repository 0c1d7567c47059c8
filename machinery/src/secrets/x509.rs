//! Keys and certificates as Talos writes them: PEM with upstream's labels (`ED25519 PRIVATE
//! KEY` around PKCS#8, SEC1 `EC PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY`; `PRIVATE KEY` is read
//! too), self-signed CAs and certificates signed by one.
//!
//! The codecs are kept crates: rcgen (over ring) makes and signs certificates, x509-parser
//! reads them, p256 and rsa convert SEC1 and PKCS#1 keys to the PKCS#8 that ring signs with and
//! generate the RSA key ring cannot.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, SerialNumber, SignatureAlgorithm,
};
use ring::rand::SecureRandom as _;

/// Key usages and extended key usages of a certificate (rcgen's).
pub use rcgen::{ExtendedKeyUsagePurpose as ExtendedUsage, KeyUsagePurpose as Usage};

use super::SecretsError;

/// PEM label of an Ed25519 key (PKCS#8 inside), as upstream writes it.
pub const ED25519_LABEL: &str = "ED25519 PRIVATE KEY";
/// PEM label of a SEC1 EC key.
pub const EC_LABEL: &str = "EC PRIVATE KEY";
/// PEM label of a PKCS#1 RSA key.
pub const RSA_LABEL: &str = "RSA PRIVATE KEY";
/// PEM label of a PKCS#8 key of any algorithm.
pub const PKCS8_LABEL: &str = "PRIVATE KEY";
/// PEM label of a certificate.
pub const CERTIFICATE_LABEL: &str = "CERTIFICATE";

/// Validity of a CA: 87600 h, as upstream's `CAValidityTime`.
pub const CA_VALIDITY: Duration = Duration::from_secs(87_600 * 3600);

/// PEM with LF line endings, as Go's encoding/pem writes it (the pem crate's default is CRLF).
fn encode_pem(label: &str, der: Vec<u8>) -> String {
    pem::encode_config(
        &pem::Pem::new(label, der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Random bytes from the system's generator.
pub fn random(n: usize) -> Result<Vec<u8>, SecretsError> {
    let mut buf = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| SecretsError::Random)?;
    Ok(buf)
}

/// The algorithm of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// Ed25519.
    Ed25519,
    /// ECDSA over P-256 with SHA-256.
    EcdsaP256,
    /// RSA (signing with SHA-256).
    Rsa,
}

impl KeyAlgorithm {
    fn signature(self) -> &'static SignatureAlgorithm {
        match self {
            Self::Ed25519 => &rcgen::PKCS_ED25519,
            Self::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Self::Rsa => &rcgen::PKCS_RSA_SHA256,
        }
    }
}

/// A private key read from, or written as, upstream's PEM. Its `Debug` shows the algorithm
/// only: a key never reaches a log.
#[derive(Clone)]
pub struct PrivateKey {
    algorithm: KeyAlgorithm,
    /// The key as PKCS#8 DER (what ring signs with).
    pkcs8: Vec<u8>,
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateKey")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// A PKCS#8 key without its optional public key (v1, RFC 5208), as upstream (Go's
/// `x509.MarshalPKCS8PrivateKey`) writes Ed25519 keys. ring makes v2 keys (RFC 5958, the
/// public key included), which BoringSSL, and so gRPC's C-core clients, refuse.
fn pkcs8_v1(der: &[u8]) -> Result<Vec<u8>, SecretsError> {
    use rsa::pkcs8::der::{Decode as _, Encode as _};
    let mut info = rsa::pkcs8::PrivateKeyInfoRef::from_der(der)
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    info.public_key = None;
    info.to_der()
        .map_err(|e| SecretsError::Crypto(e.to_string()))
}

impl PrivateKey {
    /// A new key: Ed25519 or ECDSA P-256 from ring, RSA (`bits`) from the rsa crate.
    pub fn generate(algorithm: KeyAlgorithm) -> Result<PrivateKey, SecretsError> {
        let pkcs8 = match algorithm {
            KeyAlgorithm::Ed25519 | KeyAlgorithm::EcdsaP256 => {
                KeyPair::generate_for(algorithm.signature())
                    .map_err(|e| SecretsError::Crypto(e.to_string()))?
                    .serialize_der()
            }
            KeyAlgorithm::Rsa => return Self::generate_rsa(4096),
        };
        Ok(PrivateKey { algorithm, pkcs8 })
    }

    /// A new RSA key of `bits` bits.
    pub fn generate_rsa(bits: usize) -> Result<PrivateKey, SecretsError> {
        use rsa::pkcs8::EncodePrivateKey as _;
        let mut rng = RingRng;
        let key = rsa::PrivateKey::new(&mut rng, bits)
            .map_err(|e| SecretsError::Crypto(e.to_string()))?;
        let der = key
            .to_pkcs8_der()
            .map_err(|e| SecretsError::Crypto(e.to_string()))?;
        Ok(PrivateKey {
            algorithm: KeyAlgorithm::Rsa,
            pkcs8: der.as_bytes().to_vec(),
        })
    }

    /// Reads a PEM key with any of the labels upstream writes or reads. Errors say what is
    /// wrong as upstream's do (`failed to parse PEM block`, `unsupported key type: "X"`).
    pub fn from_pem(text: &[u8]) -> Result<PrivateKey, SecretsError> {
        let block = pem::parse(text).map_err(|_| SecretsError::Pem)?;
        let der = block.contents();
        let bad = |e: String| SecretsError::Key(e);
        match block.tag() {
            ED25519_LABEL | PKCS8_LABEL => {
                let pair = KeyPair::try_from(der).map_err(|e| bad(e.to_string()))?;
                let algorithm = if pair.is_compatible(&rcgen::PKCS_ED25519) {
                    KeyAlgorithm::Ed25519
                } else if pair.is_compatible(&rcgen::PKCS_ECDSA_P256_SHA256) {
                    KeyAlgorithm::EcdsaP256
                } else if pair.is_compatible(&rcgen::PKCS_RSA_SHA256) {
                    KeyAlgorithm::Rsa
                } else {
                    return Err(bad("unsupported PKCS#8 key algorithm".into()));
                };
                if block.tag() == ED25519_LABEL && algorithm != KeyAlgorithm::Ed25519 {
                    return Err(bad(format!("an {ED25519_LABEL} block holds another key")));
                }
                Ok(PrivateKey {
                    algorithm,
                    pkcs8: der.to_vec(),
                })
            }
            EC_LABEL => {
                use p256::pkcs8::EncodePrivateKey as _;
                let key = p256::SecretKey::from_sec1_der(der)
                    .map_err(|_| bad("not a SEC1 P-256 EC key (only P-256 is supported)".into()))?;
                let pkcs8 = key.to_pkcs8_der().map_err(|e| bad(e.to_string()))?;
                Ok(PrivateKey {
                    algorithm: KeyAlgorithm::EcdsaP256,
                    pkcs8: pkcs8.as_bytes().to_vec(),
                })
            }
            RSA_LABEL => {
                use rsa::pkcs1::DecodeRsaPrivateKey as _;
                use rsa::pkcs8::EncodePrivateKey as _;
                let key = rsa::PrivateKey::from_pkcs1_der(der).map_err(|e| bad(e.to_string()))?;
                let pkcs8 = key.to_pkcs8_der().map_err(|e| bad(e.to_string()))?;
                Ok(PrivateKey {
                    algorithm: KeyAlgorithm::Rsa,
                    pkcs8: pkcs8.as_bytes().to_vec(),
                })
            }
            other => Err(SecretsError::UnsupportedKeyType(other.to_string())),
        }
    }

    /// The key in upstream's PEM: Ed25519 as `ED25519 PRIVATE KEY` (PKCS#8 v1, as Go's
    /// `MarshalPKCS8PrivateKey`), EC as SEC1, RSA as PKCS#1.
    pub fn to_pem(&self) -> Result<String, SecretsError> {
        let crypto = |e: String| SecretsError::Crypto(e);
        let (label, der) = match self.algorithm {
            KeyAlgorithm::Ed25519 => (ED25519_LABEL, pkcs8_v1(&self.pkcs8)?),
            KeyAlgorithm::EcdsaP256 => {
                use p256::pkcs8::DecodePrivateKey as _;
                let key = p256::SecretKey::from_pkcs8_der(&self.pkcs8)
                    .map_err(|e| crypto(e.to_string()))?;
                let sec1 = key.to_sec1_der().map_err(|e| crypto(e.to_string()))?;
                (EC_LABEL, sec1.to_vec())
            }
            KeyAlgorithm::Rsa => {
                use rsa::pkcs1::EncodeRsaPrivateKey as _;
                use rsa::pkcs8::DecodePrivateKey as _;
                let key = rsa::PrivateKey::from_pkcs8_der(&self.pkcs8)
                    .map_err(|e| crypto(e.to_string()))?;
                let der = key.to_pkcs1_der().map_err(|e| crypto(e.to_string()))?;
                (RSA_LABEL, der.as_bytes().to_vec())
            }
        };
        Ok(encode_pem(label, der))
    }

    /// The key as PKCS#8 DER (what TLS libraries load).
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// Its algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The rcgen key pair of it.
    fn key_pair(&self) -> Result<KeyPair, SecretsError> {
        let der = rustls_pki_types::PrivatePkcs8KeyDer::from(self.pkcs8.as_slice());
        KeyPair::from_pkcs8_der_and_sign_algo(&der, self.algorithm.signature())
            .map_err(|e| SecretsError::Crypto(e.to_string()))
    }

    /// The DER SubjectPublicKeyInfo of its public key.
    pub fn public_key_der(&self) -> Result<Vec<u8>, SecretsError> {
        use rcgen::PublicKeyData as _;
        Ok(self.key_pair()?.subject_public_key_info())
    }
}

/// ring's generator as the `rand_core` generator the rsa crate takes.
struct RingRng;

/// ring's generator failed.
#[derive(Debug)]
struct RngFailed;

impl std::fmt::Display for RngFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the system random generator failed")
    }
}

impl std::error::Error for RngFailed {}

impl rsa::rand_core::TryRng for RingRng {
    type Error = RngFailed;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0u8; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        ring::rand::SystemRandom::new()
            .fill(dst)
            .map_err(|_| RngFailed)
    }
}

impl rsa::rand_core::TryCryptoRng for RingRng {}

/// A certificate read from PEM.
#[derive(Clone, Debug)]
pub struct Certificate {
    der: Vec<u8>,
}

impl Certificate {
    /// Reads one PEM certificate; the DER must parse as X.509.
    pub fn from_pem(text: &[u8]) -> Result<Certificate, SecretsError> {
        let block = pem::parse(text).map_err(|_| SecretsError::Pem)?;
        if block.tag() != CERTIFICATE_LABEL {
            return Err(SecretsError::Certificate(format!(
                "PEM block is {:?}, not {CERTIFICATE_LABEL:?}",
                block.tag()
            )));
        }
        let der = block.contents().to_vec();
        x509_parser::parse_x509_certificate(&der)
            .map_err(|e| SecretsError::Certificate(e.to_string()))?;
        Ok(Certificate { der })
    }

    /// Reads one DER certificate (what a TLS peer presents).
    pub fn from_der(der: &[u8]) -> Result<Certificate, SecretsError> {
        x509_parser::parse_x509_certificate(der)
            .map_err(|e| SecretsError::Certificate(e.to_string()))?;
        Ok(Certificate { der: der.to_vec() })
    }

    /// The DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The PEM.
    pub fn to_pem(&self) -> String {
        encode_pem(CERTIFICATE_LABEL, self.der.clone())
    }

    /// The DER SubjectPublicKeyInfo of its public key.
    pub fn public_key_der(&self) -> Result<Vec<u8>, SecretsError> {
        let (_, cert) = x509_parser::parse_x509_certificate(&self.der)
            .map_err(|e| SecretsError::Certificate(e.to_string()))?;
        Ok(cert.public_key().raw.to_vec())
    }

    /// Its fingerprint as upstream's `--cert-fingerprint` takes it: the standard base64 of the
    /// SHA-256 of its SubjectPublicKeyInfo (DER).
    pub fn fingerprint(&self) -> Result<String, SecretsError> {
        use base64::Engine as _;
        let spki = self.public_key_der()?;
        let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
        Ok(base64::engine::general_purpose::STANDARD.encode(digest.as_ref()))
    }

    /// The algorithm of its public key (what a key made to be signed by it should use, as
    /// upstream's worker picks its apid key after the last accepted CA); `None` for another.
    pub fn key_algorithm(&self) -> Option<KeyAlgorithm> {
        let (_, cert) = x509_parser::parse_x509_certificate(&self.der).ok()?;
        match cert
            .public_key()
            .algorithm
            .algorithm
            .to_id_string()
            .as_str()
        {
            "1.3.101.112" => Some(KeyAlgorithm::Ed25519),
            "1.2.840.10045.2.1" => Some(KeyAlgorithm::EcdsaP256),
            "1.2.840.113549.1.1.1" => Some(KeyAlgorithm::Rsa),
            _ => None,
        }
    }
}

/// What a certificate says about its subject and use.
#[derive(Clone, Debug, Default)]
pub struct Subject {
    /// Organizations (O), in order.
    pub organizations: Vec<String>,
    /// Common name, if any.
    pub common_name: Option<String>,
}

fn serial() -> Result<SerialNumber, SecretsError> {
    // 128 random bits, positive (the top bit clear, as Go's rand.Int(2^128) is).
    let mut bytes = random(16)?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

fn distinguished_name(subject: &Subject) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for o in &subject.organizations {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    if let Some(cn) = &subject.common_name {
        dn.push(DnType::CommonName, cn.as_str());
    }
    dn
}

fn params(
    subject: &Subject,
    now: SystemTime,
    validity: Duration,
) -> Result<CertificateParams, SecretsError> {
    let mut p = CertificateParams::default();
    p.distinguished_name = distinguished_name(subject);
    p.not_before = time::OffsetDateTime::from(now);
    p.not_after = time::OffsetDateTime::from(now + validity);
    p.serial_number = Some(serial()?);
    Ok(p)
}

/// A self-signed CA as upstream's `NewSelfSignedCertificateAuthority`: IsCA, key usage
/// CertSign + DigitalSignature, extended key usage server and client auth, a random 128-bit
/// serial and a random 20-byte subject key identifier, valid from `now` for [`CA_VALIDITY`].
pub fn self_signed_ca(
    subject: &Subject,
    algorithm: KeyAlgorithm,
    now: SystemTime,
) -> Result<(Certificate, PrivateKey), SecretsError> {
    let key = PrivateKey::generate(algorithm)?;
    let mut p = params(subject, now, CA_VALIDITY)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.key_identifier_method = KeyIdMethod::PreSpecified(random(20)?);
    let cert = p
        .self_signed(&key.key_pair()?)
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    Ok((
        Certificate {
            der: cert.der().to_vec(),
        },
        key,
    ))
}

/// A leaf certificate signed by `ca` for a new key of the CA's algorithm (upstream's
/// `NewKeyPair`: the leaf's key type follows the CA's), valid from `now` for `validity`.
pub fn issue(
    ca: (&Certificate, &PrivateKey),
    subject: &Subject,
    key_usages: Vec<KeyUsagePurpose>,
    extended: Vec<ExtendedKeyUsagePurpose>,
    now: SystemTime,
    validity: Duration,
) -> Result<(Certificate, PrivateKey), SecretsError> {
    issue_with(
        ca,
        subject,
        (key_usages, extended, Vec::new()),
        now,
        validity,
    )
}

/// A leaf certificate to issue: its subject, its subject alternative names and its uses.
#[derive(Clone, Debug, Default)]
pub struct LeafRequest {
    /// Subject (O and CN).
    pub subject: Subject,
    /// DNS names (SANs).
    pub dns_names: Vec<String>,
    /// IP addresses (SANs).
    pub ips: Vec<std::net::IpAddr>,
    /// Key usages.
    pub key_usages: Vec<KeyUsagePurpose>,
    /// Extended key usages.
    pub extended: Vec<ExtendedKeyUsagePurpose>,
}

impl LeafRequest {
    /// Issues it: [`issue`] with the SANs.
    pub fn issue(
        &self,
        ca: (&Certificate, &PrivateKey),
        now: SystemTime,
        validity: Duration,
    ) -> Result<(Certificate, PrivateKey), SecretsError> {
        let mut sans = Vec::with_capacity(self.dns_names.len() + self.ips.len());
        for name in &self.dns_names {
            let name = rcgen::string::Ia5String::try_from(name.as_str()).map_err(|_| {
                SecretsError::Unsupported(format!("{name:?} is not a valid DNS name for a SAN"))
            })?;
            sans.push(rcgen::SanType::DnsName(name));
        }
        sans.extend(self.ips.iter().copied().map(rcgen::SanType::IpAddress));
        issue_with(
            ca,
            &self.subject,
            (self.key_usages.clone(), self.extended.clone(), sans),
            now,
            validity,
        )
    }

    /// Whether `cert` says what this request asks: the same subject and the same SANs (in any
    /// order). Key usages are not compared: they follow from the kind of certificate.
    pub fn matches(&self, info: &CertificateInfo) -> bool {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.dedup();
            v
        };
        let mut ips = self.ips.clone();
        ips.sort();
        ips.dedup();
        let mut theirs = info.ips.clone();
        theirs.sort();
        theirs.dedup();
        info.common_name == self.subject.common_name
            && info.organizations == self.subject.organizations
            && sorted(&info.dns_names) == sorted(&self.dns_names)
            && theirs == ips
    }
}

type Usages = (
    Vec<KeyUsagePurpose>,
    Vec<ExtendedKeyUsagePurpose>,
    Vec<rcgen::SanType>,
);

fn issue_with(
    ca: (&Certificate, &PrivateKey),
    subject: &Subject,
    (key_usages, extended, sans): Usages,
    now: SystemTime,
    validity: Duration,
) -> Result<(Certificate, PrivateKey), SecretsError> {
    let algorithm = ca.1.algorithm();
    let key = if algorithm == KeyAlgorithm::Rsa {
        PrivateKey::generate_rsa(2048)?
    } else {
        PrivateKey::generate(algorithm)?
    };
    let mut p = params(subject, now, validity)?;
    p.key_usages = key_usages;
    p.extended_key_usages = extended;
    p.subject_alt_names = sans;
    p.use_authority_key_identifier_extension = true;
    let ca_der = rustls_pki_types::CertificateDer::from(ca.0.der());
    let issuer = Issuer::from_ca_cert_der(&ca_der, ca.1.key_pair()?)
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    let cert = p
        .signed_by(&key.key_pair()?, &issuer)
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    Ok((
        Certificate {
            der: cert.der().to_vec(),
        },
        key,
    ))
}

/// What a certificate says, as far as renewing it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Subject CN.
    pub common_name: Option<String>,
    /// Subject O, in order.
    pub organizations: Vec<String>,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ips: Vec<std::net::IpAddr>,
    /// Whether it is a CA.
    pub is_ca: bool,
    /// Extended key usage: server authentication.
    pub server_auth: bool,
    /// Extended key usage: client authentication.
    pub client_auth: bool,
    /// Extended key usages other than server and client authentication (any, code signing,
    /// e-mail, time stamping, OCSP, or an OID of another kind).
    pub other_usages: bool,
}

impl CertificateInfo {
    /// Its lifetime (zero for a certificate that ends before it starts).
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }

    /// Half-way through its lifetime: when a leaf is renewed (upstream re-mints its 24 h
    /// leaves every 12 h).
    pub fn half_life(&self) -> SystemTime {
        self.not_before + self.lifetime() / 2
    }
}

fn unix_time(t: x509_parser::time::ASN1Time) -> SystemTime {
    let secs = t.timestamp();
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

impl Certificate {
    /// Reads what the certificate says.
    pub fn info(&self) -> Result<CertificateInfo, SecretsError> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(&self.der)
            .map_err(|e| SecretsError::Certificate(e.to_string()))?;
        let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
            a.as_str().map(str::to_string).unwrap_or_default()
        };
        let mut info = CertificateInfo {
            not_before: unix_time(cert.validity().not_before),
            not_after: unix_time(cert.validity().not_after),
            common_name: cert.subject().iter_common_name().next().map(text),
            organizations: cert.subject().iter_organization().map(text).collect(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            is_ca: cert.is_ca(),
            server_auth: false,
            client_auth: false,
            other_usages: false,
        };
        if let Ok(Some(eku)) = cert.extended_key_usage() {
            let e = eku.value;
            info.server_auth = e.server_auth;
            info.client_auth = e.client_auth;
            info.other_usages = e.any
                || e.code_signing
                || e.email_protection
                || e.time_stamping
                || e.ocsp_signing
                || !e.other.is_empty();
        }
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => info.dns_names.push((*d).to_string()),
                    GeneralName::IPAddress(b) => {
                        if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                            info.ips.push(std::net::IpAddr::from(v4));
                        } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                            info.ips.push(std::net::IpAddr::from(v6));
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(info)
    }

    /// Whether `ca`'s key signed this certificate (the signature checks out; validity times
    /// are not looked at).
    pub fn is_signed_by(&self, ca: &Certificate) -> bool {
        let (Ok((_, cert)), Ok((_, ca))) = (
            x509_parser::parse_x509_certificate(&self.der),
            x509_parser::parse_x509_certificate(&ca.der),
        ) else {
            return false;
        };
        cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
    }

    /// Whether `key` is the private key of this certificate.
    pub fn matches_key(&self, key: &PrivateKey) -> bool {
        matches!((self.public_key_der(), key.public_key_der()), (Ok(a), Ok(b)) if a == b)
    }
}

/// The longest validity [`sign_csr`] and [`sign_client_csr`] sign for: 100 years (a time past
/// year 9999 cannot be encoded).
pub const MAX_LEAF_VALIDITY: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Largest CSR [`sign_csr`] reads (PEM bytes): a CSR with a few hundred SANs fits.
pub const MAX_CSR: usize = 64 * 1024;

impl LeafRequest {
    /// A certificate signing request for a new key of `algorithm`, asking for this subject,
    /// these SANs and these uses (what a worker sends trustd). Returns the CSR's PEM and the key.
    pub fn csr(&self, algorithm: KeyAlgorithm) -> Result<(String, PrivateKey), SecretsError> {
        let key = PrivateKey::generate(algorithm)?;
        let mut p = CertificateParams::default();
        p.distinguished_name = distinguished_name(&self.subject);
        for name in &self.dns_names {
            let name = rcgen::string::Ia5String::try_from(name.as_str()).map_err(|_| {
                SecretsError::Unsupported(format!("{name:?} is not a valid DNS name for a SAN"))
            })?;
            p.subject_alt_names.push(rcgen::SanType::DnsName(name));
        }
        p.subject_alt_names
            .extend(self.ips.iter().copied().map(rcgen::SanType::IpAddress));
        p.key_usages = self.key_usages.clone();
        p.extended_key_usages = self.extended.clone();
        let csr = p
            .serialize_request(&key.key_pair()?)
            .map_err(|e| SecretsError::Crypto(e.to_string()))?;
        let pem = csr.pem().map_err(|e| SecretsError::Crypto(e.to_string()))?;
        Ok((pem.replace("\r\n", "\n"), key))
    }
}

/// Signs a CSR as trustd does (upstream's `reg.Certificate`): the CSR's signature must verify;
/// its Organization is dropped (a token holder never gets a role-bearing certificate), and so is
/// every key usage, CA flag and SAN it asks for but DNS names and IP addresses; the certificate
/// is for server authentication only (key usage DigitalSignature, extended key usage
/// ServerAuth), valid from `now` for `validity`, signed by `ca`.
pub fn sign_csr(
    ca: (&Certificate, &PrivateKey),
    csr_pem: &[u8],
    now: SystemTime,
    validity: Duration,
) -> Result<Certificate, SecretsError> {
    sign_parsed(ca, csr_pem, now, validity, |p| {
        let mut subject = DistinguishedName::new();
        for (ty, value) in p.distinguished_name.iter() {
            if *ty != DnType::OrganizationName {
                subject.push(ty.clone(), value.clone());
            }
        }
        p.distinguished_name = subject;
        p.subject_alt_names
            .retain(|s| matches!(s, rcgen::SanType::DnsName(_) | rcgen::SanType::IpAddress(_)));
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    })
}

/// Signs a Talos API client certificate for the key of a CSR (GenerateClientConfiguration,
/// signed by secretsd for apid): the CSR's signature must verify, and only its public key is
/// taken. The subject is `roles` as organizations and no common name, no SAN, key usage
/// DigitalSignature, extended key usage ClientAuth (what [`crate::secrets::Bundle`]'s
/// `client_certificate` issues), valid from `now` for `validity`.
pub fn sign_client_csr(
    ca: (&Certificate, &PrivateKey),
    csr_pem: &[u8],
    roles: &[String],
    now: SystemTime,
    validity: Duration,
) -> Result<Certificate, SecretsError> {
    if roles.len() > 1 {
        // As `client_certificate`: rcgen keeps one value per attribute type (rustls/rcgen#81).
        return Err(SecretsError::Unsupported(format!(
            "a client certificate carries one role in talos-rs so far, not {}: {}",
            roles.len(),
            roles.join(", ")
        )));
    }
    sign_parsed(ca, csr_pem, now, validity, |p| {
        p.distinguished_name = distinguished_name(&Subject {
            organizations: roles.to_vec(),
            common_name: None,
        });
        p.subject_alt_names.clear();
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    })
}

/// Signs a Kubernetes client certificate for a CSR (`talosctl kubeconfig`'s admin), as
/// upstream's `kubeconfig.Generate`: the subject is `common_name` and `organization` whatever
/// the CSR says, key usage digital signature and key encipherment, client auth only, valid
/// from 10 s before `now` (upstream's allowed skew).
///
/// # Errors
///
/// As [`sign_client_csr`].
pub fn sign_kubernetes_client_csr(
    ca: (&Certificate, &PrivateKey),
    csr_pem: &[u8],
    common_name: &str,
    organization: &str,
    now: SystemTime,
    validity: Duration,
) -> Result<Certificate, SecretsError> {
    let skew = Duration::from_secs(10);
    sign_parsed(ca, csr_pem, now - skew, validity + skew, |p| {
        p.distinguished_name = distinguished_name(&Subject {
            organizations: vec![organization.to_string()],
            common_name: Some(common_name.to_string()),
        });
        p.subject_alt_names.clear();
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    })
}

/// Parses and verifies a CSR, lets `shape` say what the certificate holds, and signs it: never
/// a CA, a fresh serial, valid from `now` for `validity`.
fn sign_parsed(
    ca: (&Certificate, &PrivateKey),
    csr_pem: &[u8],
    now: SystemTime,
    validity: Duration,
    shape: impl FnOnce(&mut CertificateParams),
) -> Result<Certificate, SecretsError> {
    if csr_pem.len() > MAX_CSR {
        return Err(SecretsError::Csr(format!(
            "the CSR is larger than {MAX_CSR} bytes"
        )));
    }
    if validity > MAX_LEAF_VALIDITY {
        return Err(SecretsError::Csr(format!(
            "a validity of {} s is longer than {} years",
            validity.as_secs(),
            MAX_LEAF_VALIDITY.as_secs() / (365 * 86_400)
        )));
    }
    let not_after = now + validity;
    let text = std::str::from_utf8(csr_pem)
        .map_err(|_| SecretsError::Csr("the CSR is not PEM text".into()))?;
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(text)
        .map_err(|e| SecretsError::Csr(e.to_string()))?;
    let p = &mut csr.params;
    shape(p);
    p.is_ca = IsCa::ExplicitNoCa;
    p.not_before = time::OffsetDateTime::from(now);
    p.not_after = time::OffsetDateTime::from(not_after);
    p.serial_number = Some(serial()?);
    p.use_authority_key_identifier_extension = true;
    let ca_der = rustls_pki_types::CertificateDer::from(ca.0.der());
    let issuer = Issuer::from_ca_cert_der(&ca_der, ca.1.key_pair()?)
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    let cert = csr
        .signed_by(&issuer)
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    Ok(Certificate {
        der: cert.der().to_vec(),
    })
}

/// Every certificate of a PEM bundle (the accepted CAs trustd returns, one after another).
pub fn certificates(text: &[u8]) -> Result<Vec<Certificate>, SecretsError> {
    let blocks = pem::parse_many(text).map_err(|_| SecretsError::Pem)?;
    blocks
        .iter()
        .filter(|b| b.tag() == CERTIFICATE_LABEL)
        .map(|b| Certificate::from_pem(pem::encode(b).as_bytes()))
        .collect()
}
