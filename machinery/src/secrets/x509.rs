//! Keys and certificates as Talos writes them: PEM with upstream's labels (`ED25519 PRIVATE
//! KEY` around PKCS#8, SEC1 `EC PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY`; `PRIVATE KEY` is read
//! too), self-signed CAs and certificates signed by one.
//!
//! The codecs are kept crates: rcgen (over ring) makes and signs certificates, x509-parser
//! reads them, p256 and rsa convert SEC1 and PKCS#1 keys to the PKCS#8 that ring signs with and
//! generate the RSA key ring cannot. x509-cert's builder writes the Talos API client
//! certificates, whose roles are one multi-valued Organization RDN as upstream writes them
//! (rcgen writes one value per attribute type, rustls/rcgen#81); ring signs them.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, SerialNumber, SignatureAlgorithm,
};
use ring::rand::SecureRandom as _;
use x509_cert::spki::ObjectIdentifier;

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
        spki_algorithm(cert.public_key())
    }
}

/// The algorithm of a SubjectPublicKeyInfo: Ed25519, ECDSA over P-256 (only that curve), RSA;
/// `None` for another.
fn spki_algorithm(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> Option<KeyAlgorithm> {
    match spki.algorithm.algorithm.to_id_string().as_str() {
        "1.3.101.112" => Some(KeyAlgorithm::Ed25519),
        "1.2.840.10045.2.1" => {
            // The curve is the algorithm's parameter: prime256v1 (secp256r1).
            let curve = spki.algorithm.parameters.as_ref()?.as_oid().ok()?;
            (curve.to_id_string() == "1.2.840.10045.3.1.7").then_some(KeyAlgorithm::EcdsaP256)
        }
        "1.2.840.113549.1.1.1" => Some(KeyAlgorithm::Rsa),
        _ => None,
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

/// 128 random bits, positive (the top bit clear, as Go's rand.Int(2^128) is).
fn serial_bytes() -> Result<Vec<u8>, SecretsError> {
    let mut bytes = random(16)?;
    bytes[0] &= 0x7f;
    Ok(bytes)
}

fn serial() -> Result<SerialNumber, SecretsError> {
    Ok(SerialNumber::from_slice(&serial_bytes()?))
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
/// `NewKeyPair`: the leaf's key type follows the CA's), valid from `now` for `validity`. A
/// [`LeafRequest`] may name another algorithm.
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
        None,
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
    /// The algorithm of the certificate's key; `None` follows the signing CA's (upstream's
    /// `NewKeyPair`). A CA of any algorithm signs a key of any other.
    pub key_algorithm: Option<KeyAlgorithm>,
}

impl LeafRequest {
    /// Issues it: [`issue`] with the SANs, for a new key of [`Self::key_algorithm`].
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
            self.key_algorithm,
            &self.subject,
            (self.key_usages.clone(), self.extended.clone(), sans),
            now,
            validity,
        )
    }

    /// Whether `cert` says what this request asks: the same subject and the same SANs (in any
    /// order), and a key of the algorithm it names, if it names one (a certificate of a key of
    /// another algorithm, as asked before, is issued again). Key usages are not compared: they
    /// follow from the kind of certificate.
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
            && self
                .key_algorithm
                .is_none_or(|a| info.key_algorithm == Some(a))
    }
}

type Usages = (
    Vec<KeyUsagePurpose>,
    Vec<ExtendedKeyUsagePurpose>,
    Vec<rcgen::SanType>,
);

/// Issues a leaf for a new key of `algorithm`, else of the CA's (an RSA key has 2048 bits).
fn issue_with(
    ca: (&Certificate, &PrivateKey),
    algorithm: Option<KeyAlgorithm>,
    subject: &Subject,
    (key_usages, extended, sans): Usages,
    now: SystemTime,
    validity: Duration,
) -> Result<(Certificate, PrivateKey), SecretsError> {
    let algorithm = algorithm.unwrap_or_else(|| ca.1.algorithm());
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
    /// The algorithm of its key (`None`: another than those of [`KeyAlgorithm`]).
    pub key_algorithm: Option<KeyAlgorithm>,
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
            key_algorithm: spki_algorithm(cert.public_key()),
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
    /// A certificate signing request for a new key of [`Self::key_algorithm`], else of
    /// `otherwise` (the algorithm of the CA meant to sign it, as [`Self::issue`] follows the
    /// CA's), asking for this subject, these SANs and these uses (what a worker sends trustd).
    /// Returns the CSR's PEM and the key.
    pub fn csr(&self, otherwise: KeyAlgorithm) -> Result<(String, PrivateKey), SecretsError> {
        let key = PrivateKey::generate(self.key_algorithm.unwrap_or(otherwise))?;
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
/// taken. The subject is `roles` (sorted, once each) as one multi-valued organization RDN and
/// no common name, no SAN, key usage DigitalSignature, extended key usage ClientAuth (what
/// [`crate::secrets::Bundle`]'s `client_certificate` issues, through the same code), valid
/// from `now` for `validity`.
pub fn sign_client_csr(
    ca: (&Certificate, &PrivateKey),
    csr_pem: &[u8],
    roles: &[String],
    now: SystemTime,
    validity: Duration,
) -> Result<Certificate, SecretsError> {
    use rcgen::PublicKeyData as _;
    let csr = read_csr(csr_pem, validity)?;
    // Only the key is taken; a certificate signed for a CSR also says who it is (a subject key
    // identifier) and that it is no CA, as `sign_parsed`'s do.
    client_certificate(
        ca,
        &csr.public_key.subject_public_key_info(),
        roles,
        (now, validity),
        true,
    )
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
    let not_after = now + validity;
    let mut csr = read_csr(csr_pem, validity)?;
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

/// Reads a CSR to sign for `validity`: PEM of at most [`MAX_CSR`] bytes whose signature
/// verifies, a validity of at most [`MAX_LEAF_VALIDITY`].
fn read_csr(
    csr_pem: &[u8],
    validity: Duration,
) -> Result<rcgen::CertificateSigningRequestParams, SecretsError> {
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
    let text = std::str::from_utf8(csr_pem)
        .map_err(|_| SecretsError::Csr("the CSR is not PEM text".into()))?;
    rcgen::CertificateSigningRequestParams::from_pem(text)
        .map_err(|e| SecretsError::Csr(e.to_string()))
}

/// A Talos API client certificate for a new key of the CA's algorithm (upstream's
/// `NewAdminCertificateAndKey`; an RSA CA's leaf key has 2048 bits, as [`issue`]'s): the roles
/// as organizations, no common name, key usage DigitalSignature, extended key usage
/// ClientAuth, valid from `now` for `validity`.
pub fn issue_client(
    ca: (&Certificate, &PrivateKey),
    roles: &[String],
    now: SystemTime,
    validity: Duration,
) -> Result<(Certificate, PrivateKey), SecretsError> {
    let algorithm = ca.1.algorithm();
    let key = if algorithm == KeyAlgorithm::Rsa {
        PrivateKey::generate_rsa(2048)?
    } else {
        PrivateKey::generate(algorithm)?
    };
    let cert = client_certificate(ca, &key.public_key_der()?, roles, (now, validity), false)?;
    Ok((cert, key))
}

/// The OID of the Organization (O) attribute.
const ORGANIZATION: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.10");
/// The OID of the ClientAuth extended key usage.
const CLIENT_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.2");

/// The one path of Talos API client certificates ([`issue_client`], [`sign_client_csr`]),
/// built with x509-cert: the subject is every role (sorted, once each, as upstream's
/// `roles.Strings()`) in one multi-valued Organization RDN, as Go's `pkix.Name` writes it, or
/// empty without a role; the issuer is the CA's subject as the CA encodes it; a random 128-bit
/// serial; key usage DigitalSignature (critical), extended key usage ClientAuth, the
/// authority key identifier of the CA (its subject key identifier, else the first 20 bytes of
/// the SHA-256 of its SubjectPublicKeyInfo); `for_csr` adds what every certificate signed for a
/// CSR carries ([`sign_parsed`]'s): a subject key identifier (the same hash of `subject_spki`)
/// and basic constraints CA:FALSE (critical). Signed by the CA's key with ring.
fn client_certificate(
    ca: (&Certificate, &PrivateKey),
    subject_spki: &[u8],
    roles: &[String],
    (now, validity): (SystemTime, Duration),
    for_csr: bool,
) -> Result<Certificate, SecretsError> {
    use x509_cert::builder::{Builder as _, CertificateBuilder};
    use x509_cert::der::{Decode as _, Encode as _};

    let asn1 = |e: x509_cert::der::Error| SecretsError::Crypto(e.to_string());
    let (_, ca_cert) = x509_parser::parse_x509_certificate(ca.0.der())
        .map_err(|e| SecretsError::Certificate(e.to_string()))?;
    let authority_key_id = ca_cert
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(id) => {
                Some(id.0.to_vec())
            }
            _ => None,
        })
        .unwrap_or_else(|| key_id(ca_cert.public_key().raw));
    let profile = ClientProfile {
        issuer: x509_cert::name::Name::from_der(ca_cert.subject().as_raw()).map_err(asn1)?,
        subject: roles_name(roles).map_err(asn1)?,
        authority_key_id,
        subject_key_id: for_csr.then(|| key_id(subject_spki)),
    };
    let time = |t: SystemTime| x509_cert::time::Time::try_from(t).map_err(asn1);
    let validity = x509_cert::time::Validity::new(time(now)?, time(now + validity)?);
    let serial = x509_cert::serial_number::SerialNumber::new(&serial_bytes()?).map_err(asn1)?;
    let spki = x509_cert::spki::SubjectPublicKeyInfoOwned::from_der(subject_spki).map_err(asn1)?;
    let signer = CaSigner {
        algorithm: ca.1.algorithm(),
        key: ca.1.key_pair()?,
        spki: ca_cert.public_key().raw.to_vec(),
    };
    let built = CertificateBuilder::new(profile, serial, validity, spki)
        .and_then(|b| b.build::<_, CaSignature>(&signer))
        .map_err(|e| SecretsError::Crypto(e.to_string()))?;
    Ok(Certificate {
        der: built.to_der().map_err(asn1)?,
    })
}

/// A key identifier as rcgen derives one: the first 20 bytes of the SHA-256 of a DER
/// SubjectPublicKeyInfo.
fn key_id(spki: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, spki).as_ref()[..20].to_vec()
}

/// The subject of a client certificate: one RDN of every role as an Organization (x509-cert's
/// RDN is a DER SET OF, sorted as Go's encoding/asn1 sorts it), each a PrintableString where
/// it can be one and a UTF8String otherwise, as Go chooses; no RDN without a role.
fn roles_name(roles: &[String]) -> Result<x509_cert::name::Name, x509_cert::der::Error> {
    use x509_cert::der::asn1::{Any, PrintableStringRef, Utf8StringRef};
    use x509_cert::der::{Decode as _, Encode as _};

    let mut roles = roles.to_vec();
    roles.sort();
    roles.dedup();
    let mut rdns = x509_cert::name::RdnSequence::default();
    if !roles.is_empty() {
        let values = roles
            .iter()
            .map(|role| {
                let value = match PrintableStringRef::new(role) {
                    Ok(printable) => Any::encode_from(&printable)?,
                    Err(_) => Any::encode_from(&Utf8StringRef::new(role)?)?,
                };
                Ok(x509_cert::attr::AttributeTypeAndValue {
                    oid: ORGANIZATION,
                    value,
                })
            })
            .collect::<Result<Vec<_>, x509_cert::der::Error>>()?;
        rdns.push(x509_cert::name::RelativeDistinguishedName::try_from(
            values,
        )?);
    }
    // x509-cert makes a `Name` of an RDN sequence only by decoding one (or behind `hazmat`).
    x509_cert::name::Name::from_der(&rdns.to_der()?)
}

/// What x509-cert's builder puts in a client certificate besides the key, serial and validity.
struct ClientProfile {
    issuer: x509_cert::name::Name,
    subject: x509_cert::name::Name,
    authority_key_id: Vec<u8>,
    /// With a subject key identifier and basic constraints CA:FALSE.
    subject_key_id: Option<Vec<u8>>,
}

impl x509_cert::builder::profile::BuilderProfile for ClientProfile {
    fn get_issuer(&self, _subject: &x509_cert::name::Name) -> x509_cert::name::Name {
        self.issuer.clone()
    }

    fn get_subject(&self) -> x509_cert::name::Name {
        self.subject.clone()
    }

    /// In rcgen's order (so a one-role certificate is as it was): authority key identifier,
    /// key usage, extended key usage, then subject key identifier and basic constraints.
    /// x509-cert marks key usage and basic constraints critical, the others not, as rcgen.
    fn build_extensions(
        &self,
        _spk: x509_cert::spki::SubjectPublicKeyInfoRef<'_>,
        _issuer_spk: x509_cert::spki::SubjectPublicKeyInfoRef<'_>,
        tbs: &x509_cert::TbsCertificate,
    ) -> x509_cert::builder::Result<Vec<x509_cert::ext::Extension>> {
        use x509_cert::der::asn1::OctetString;
        use x509_cert::ext::pkix::{
            AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages,
            SubjectKeyIdentifier,
        };
        use x509_cert::ext::ToExtension as _;

        let subject = tbs.subject();
        let mut out = Vec::new();
        let aki = AuthorityKeyIdentifier {
            key_identifier: Some(OctetString::new(self.authority_key_id.clone())?),
            authority_cert_issuer: None,
            authority_cert_serial_number: None,
        };
        out.push(aki.to_extension(subject, &out)?);
        out.push(KeyUsage(KeyUsages::DigitalSignature.into()).to_extension(subject, &out)?);
        out.push(ExtendedKeyUsage(vec![CLIENT_AUTH]).to_extension(subject, &out)?);
        if let Some(id) = &self.subject_key_id {
            let ski = SubjectKeyIdentifier(OctetString::new(id.clone())?);
            out.push(ski.to_extension(subject, &out)?);
            let leaf = BasicConstraints {
                ca: false,
                path_len_constraint: None,
            };
            out.push(leaf.to_extension(subject, &out)?);
        }
        Ok(out)
    }
}

/// A CA's key as the signer x509-cert's builder takes: ring signs, through rcgen's key pair
/// (Ed25519; ECDSA P-256 with SHA-256, the signature in ASN.1; RSA PKCS#1 v1.5 with SHA-256).
struct CaSigner {
    algorithm: KeyAlgorithm,
    key: KeyPair,
    /// The CA's DER SubjectPublicKeyInfo.
    spki: Vec<u8>,
}

/// The DER SubjectPublicKeyInfo of a CA's key.
#[derive(Clone)]
struct CaPublicKey(Vec<u8>);

impl x509_cert::spki::EncodePublicKey for CaPublicKey {
    fn to_public_key_der(&self) -> x509_cert::spki::Result<x509_cert::der::Document> {
        Ok(x509_cert::der::Document::try_from(self.0.as_slice())?)
    }
}

/// A signature as the certificate's BIT STRING holds it.
struct CaSignature(Vec<u8>);

impl x509_cert::spki::SignatureBitStringEncoding for CaSignature {
    fn to_bitstring(&self) -> x509_cert::der::Result<x509_cert::der::asn1::BitString> {
        x509_cert::der::asn1::BitString::from_bytes(&self.0)
    }
}

impl signature::Keypair for CaSigner {
    type VerifyingKey = CaPublicKey;

    fn verifying_key(&self) -> CaPublicKey {
        CaPublicKey(self.spki.clone())
    }
}

impl x509_cert::spki::DynSignatureAlgorithmIdentifier for CaSigner {
    /// The signature algorithm as rcgen writes it: no parameters but RSA's NULL.
    fn signature_algorithm_identifier(
        &self,
    ) -> x509_cert::spki::Result<x509_cert::spki::AlgorithmIdentifierOwned> {
        const ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
        const ECDSA_WITH_SHA256: ObjectIdentifier =
            ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
        const SHA256_WITH_RSA: ObjectIdentifier =
            ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
        let (oid, parameters) = match self.algorithm {
            KeyAlgorithm::Ed25519 => (ED25519, None),
            KeyAlgorithm::EcdsaP256 => (ECDSA_WITH_SHA256, None),
            KeyAlgorithm::Rsa => (SHA256_WITH_RSA, Some(x509_cert::der::asn1::Any::null())),
        };
        Ok(x509_cert::spki::AlgorithmIdentifierOwned { oid, parameters })
    }
}

impl signature::Signer<CaSignature> for CaSigner {
    fn try_sign(&self, msg: &[u8]) -> Result<CaSignature, signature::Error> {
        use rcgen::SigningKey as _;
        self.key
            .sign(msg)
            .map(CaSignature)
            .map_err(|_| signature::Error::new())
    }
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
