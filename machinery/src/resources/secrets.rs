//! The `secrets` namespace (sensitive; written by secretsd): the root secrets taken from the
//! machine configuration and the leaf certificates minted from them. Types, IDs and field
//! names follow upstream's `pkg/machinery/resources/secrets`; every type is sensitive.
//!
//! Certificates and keys are held as PEM text and written, as upstream's
//! `PEMEncodedCertificateAndKey` is, as base64 of the PEM (`crt: LS0tLS1CRUdJTi...`).

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// The namespace of CAs and certificates.
pub const NAMESPACE: &str = "secrets";
/// ID of [`OsRootSpec`].
pub const OS_ROOT_ID: &str = "os";
/// ID of [`EtcdRootSpec`].
pub const ETCD_ROOT_ID: &str = "etcd";
/// ID of [`KubernetesRootSpec`].
pub const KUBERNETES_ROOT_ID: &str = "k8s";
/// ID of [`KubeletSpec`].
pub const KUBELET_ID: &str = "kubelet";
/// ID of the Talos API's [`CertSanSpec`].
pub const CERT_SAN_API_ID: &str = "api";
/// ID of [`ApiCertsSpec`].
pub const API_ID: &str = "api";
/// ID of [`TrustdCertsSpec`].
pub const TRUSTD_ID: &str = "trustd";
/// ID of [`EtcdCertsSpec`].
pub const ETCD_ID: &str = "etcd";
/// ID of [`ApiCsrSpec`].
pub const API_CSR_ID: &str = "api";

/// PEM text as base64 in YAML (Go's `[]byte`).
mod pem_b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(pem: &str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(pem))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(serde::de::Error::custom)?;
        String::from_utf8(bytes).map_err(serde::de::Error::custom)
    }
}

/// A PEM certificate and its PEM private key (upstream `PEMEncodedCertificateAndKey`).
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CertificateAndKey {
    /// The certificate, PEM.
    #[serde(with = "pem_b64")]
    pub crt: String,
    /// The private key, PEM (empty when only the certificate is known).
    #[serde(with = "pem_b64", default, skip_serializing_if = "String::is_empty")]
    pub key: String,
}

impl std::fmt::Debug for CertificateAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a key in a log line.
        f.debug_struct("CertificateAndKey")
            .field("crt", &self.crt.len())
            .field("key", &if self.key.is_empty() { "none" } else { "set" })
            .finish()
    }
}

/// A PEM certificate (upstream `PEMEncodedCertificate`).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CertificatePem {
    /// The certificate, PEM.
    #[serde(with = "pem_b64")]
    pub crt: String,
}

/// A PEM private key alone (upstream `PEMEncodedKey`).
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyPem {
    /// The key, PEM.
    #[serde(with = "pem_b64")]
    pub key: String,
}

impl std::fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyPem(..)")
    }
}

fn definition(r#type: &str) -> ResourceDefinition {
    ResourceDefinition::new(r#type, NAMESPACE).sensitive()
}

/// The Talos API's root (`OSRootSecrets`, ID `os`), on every node with a configuration: the
/// issuing CA (with its key only on control planes), the accepted CAs (the issuing one last),
/// `machine.certSANs` split into IPs and names, and the trustd token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsRootSpec {
    /// The CA that signs, when this node holds its key.
    #[serde(rename = "issuingCA", default, skip_serializing_if = "Option::is_none")]
    pub issuing_ca: Option<CertificateAndKey>,
    /// CAs whose certificates are accepted.
    #[serde(rename = "acceptedCAs", default)]
    pub accepted_cas: Vec<CertificatePem>,
    /// IP addresses of `machine.certSANs`.
    #[serde(rename = "certSANIPs", default)]
    pub cert_san_ips: Vec<IpAddr>,
    /// DNS names of `machine.certSANs`.
    #[serde(rename = "certSANDNSNames", default)]
    pub cert_san_dns_names: Vec<String>,
    /// The trustd token (`machine.token`).
    #[serde(default)]
    pub token: String,
}

impl ResourceSpec for OsRootSpec {
    const TYPE: &'static str = "OSRootSecrets.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// An `OSRootSecrets` resource.
pub type OsRoot = Resource<OsRootSpec>;

/// etcd's CA (`EtcdRootSecrets`, ID `etcd`), on control planes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRootSpec {
    /// `cluster.etcd.ca`.
    #[serde(rename = "etcdCA")]
    pub etcd_ca: CertificateAndKey,
}

impl ResourceSpec for EtcdRootSpec {
    const TYPE: &'static str = "EtcdRootSecrets.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// Kubernetes' root secrets (`KubernetesRootSecrets`, ID `k8s`), on control planes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesRootSpec {
    /// `cluster.clusterName`.
    pub name: String,
    /// `cluster.controlPlane.endpoint`.
    pub endpoint: String,
    /// How components of this node reach the API server (upstream's tag is snake case).
    #[serde(rename = "local_endpoint")]
    pub local_endpoint: String,
    /// `cluster.apiServer.certSANs`.
    #[serde(rename = "certSANs", default)]
    pub cert_sans: Vec<String>,
    /// The first address of each service subnet.
    #[serde(rename = "apiServerIPs", default)]
    pub api_server_ips: Vec<IpAddr>,
    /// `cluster.network.dnsDomain`.
    pub dns_domain: String,
    /// The issuing CA (`cluster.ca`) when this node holds its key.
    #[serde(rename = "issuingCA", default, skip_serializing_if = "Option::is_none")]
    pub issuing_ca: Option<CertificateAndKey>,
    /// Accepted CAs (`cluster.acceptedCAs`, the issuing one last).
    #[serde(rename = "acceptedCAs", default)]
    pub accepted_cas: Vec<CertificatePem>,
    /// The service-account signing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<KeyPem>,
    /// The aggregation layer's CA.
    #[serde(
        rename = "aggregatorCA",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub aggregator_ca: Option<CertificateAndKey>,
    /// `cluster.aescbcEncryptionSecret`.
    #[serde(rename = "aesCBCEncryptionSecret", default)]
    pub aescbc_encryption_secret: String,
    /// The bootstrap token's ID (`cluster.token`, before the dot).
    #[serde(rename = "bootstrapTokenID", default)]
    pub bootstrap_token_id: String,
    /// The bootstrap token's secret (after the dot).
    #[serde(default)]
    pub bootstrap_token_secret: String,
    /// `cluster.secretboxEncryptionSecret`.
    #[serde(default)]
    pub secretbox_encryption_secret: String,
}

impl ResourceSpec for KubernetesRootSpec {
    const TYPE: &'static str = "KubernetesRootSecrets.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// What the kubelet needs to join (`KubeletSecrets`, ID `kubelet`), on every node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSpec {
    /// The API server endpoint the kubelet uses.
    pub endpoint: String,
    /// CAs the kubelet accepts for the API server.
    #[serde(rename = "acceptedCAs", default)]
    pub accepted_cas: Vec<CertificatePem>,
    /// The bootstrap token's ID.
    #[serde(rename = "bootstrapTokenID")]
    pub bootstrap_token_id: String,
    /// The bootstrap token's secret.
    pub bootstrap_token_secret: String,
}

impl ResourceSpec for KubeletSpec {
    const TYPE: &'static str = "KubeletSecrets.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// Subject alternative names of a server certificate (`CertSANs`, ID `api`): sorted,
/// without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertSanSpec {
    /// IP addresses.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// DNS names.
    #[serde(default)]
    pub dns_names: Vec<String>,
    /// The node's FQDN (the certificate's CN).
    #[serde(default)]
    pub fqdn: String,
}

impl CertSanSpec {
    /// Adds `sans`, each as an IP when it parses as one, else as a DNS name.
    pub fn append(&mut self, sans: &[String]) {
        for san in sans {
            match san.parse::<IpAddr>() {
                Ok(ip) => self.ips.push(ip),
                Err(_) => self.dns_names.push(san.clone()),
            }
        }
    }

    /// Sorts both lists and drops duplicates (and empty names).
    pub fn normalize(&mut self) {
        self.ips.sort();
        self.ips.dedup();
        self.dns_names.retain(|n| !n.is_empty());
        self.dns_names.sort();
        self.dns_names.dedup();
    }
}

impl ResourceSpec for CertSanSpec {
    const TYPE: &'static str = "CertSANs.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// apid's certificates (`ApiCertificates`, ID `api`): the serving certificate, the client
/// certificate apid presents to other nodes' apid (O=os:impersonator), the CAs it accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiCertsSpec {
    /// CAs whose client certificates apid accepts.
    #[serde(rename = "acceptedCAs", default)]
    pub accepted_cas: Vec<CertificatePem>,
    /// The client certificate (control planes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<CertificateAndKey>,
    /// The serving certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<CertificateAndKey>,
}

impl ResourceSpec for ApiCertsSpec {
    const TYPE: &'static str = "ApiCertificates.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// A worker's request for its apid serving certificate (`ApiCertificateRequests`, ID `api`;
/// ours, upstream does this inside one controller): the CSR secretsd made for a key only it
/// holds, and the control planes' trustd to send it to. trustd reads it (and nothing else of
/// apid's), sends it, and answers in `SignedCertificates` of its own namespace; the key never
/// leaves secretsd.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiCsrSpec {
    /// The CSR, PEM.
    pub csr: String,
    /// trustd endpoints (`host` or `host:port`), tried in order.
    #[serde(default)]
    pub endpoints: Vec<String>,
}

impl ResourceSpec for ApiCsrSpec {
    const TYPE: &'static str = "ApiCertificateRequests.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// trustd's serving certificate (`TrustdCertificates`, ID `trustd`), on control planes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustdCertsSpec {
    /// The accepted OS CAs (what trustd hands to a joining node).
    #[serde(rename = "acceptedCAs", default)]
    pub accepted_cas: Vec<CertificatePem>,
    /// The serving certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<CertificateAndKey>,
}

impl ResourceSpec for TrustdCertsSpec {
    const TYPE: &'static str = "TrustdCertificates.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// etcd's certificates (`EtcdSecrets`, ID `etcd`), on control planes: server, peer, the admin
/// client (`talos`) and kube-apiserver's client.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdCertsSpec {
    /// etcd's CA certificate, without its key (ours: upstream's k8sd-side reads the root
    /// secret; here k8sd, which writes etcd's files, never holds the CA key).
    #[serde(default, rename = "ca")]
    pub ca: CertificateAndKey,
    /// etcd's serving certificate.
    pub etcd: CertificateAndKey,
    /// etcd's peer certificate.
    pub etcd_peer: CertificateAndKey,
    /// The admin client (CN `talos`).
    pub etcd_admin: CertificateAndKey,
    /// kube-apiserver's client (CN `kube-apiserver`).
    #[serde(rename = "etcdAPIServer")]
    pub etcd_api_server: CertificateAndKey,
}

impl ResourceSpec for EtcdCertsSpec {
    const TYPE: &'static str = "EtcdSecrets.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// secretsd's answer to apid's `apid/ClientCertificateRequests` of the same ID
/// (`ClientCertificates`, ours): the CSR it answers, and either the client certificate with the
/// OS CA's certificate (upstream's `machine.ca.crt`) or why none was signed (a worker holds no
/// CA key). Certificates are public, but the namespace is sensitive like all of `secrets`:
/// apid reads this type only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificateSpec {
    /// The CSR answered, PEM.
    pub csr: String,
    /// The client certificate, PEM (empty on error).
    #[serde(default)]
    pub crt: String,
    /// The OS CA's certificate, PEM.
    #[serde(default)]
    pub ca: String,
    /// Why no certificate was signed.
    #[serde(default)]
    pub error: String,
}

impl ResourceSpec for ClientCertificateSpec {
    const TYPE: &'static str = "ClientCertificates.secrets.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        definition(Self::TYPE)
    }
}

/// Definitions of every type of the namespace.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![
        OsRootSpec::definition(),
        EtcdRootSpec::definition(),
        KubernetesRootSpec::definition(),
        KubeletSpec::definition(),
        CertSanSpec::definition(),
        ApiCertsSpec::definition(),
        ApiCsrSpec::definition(),
        TrustdCertsSpec::definition(),
        EtcdCertsSpec::definition(),
        ClientCertificateSpec::definition(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_is_base64_in_yaml_as_upstream_writes_it() {
        let spec = TrustdCertsSpec {
            accepted_cas: vec![CertificatePem {
                crt: "-----BEGIN CERTIFICATE-----\n".into(),
            }],
            server: None,
        };
        let yaml = serde_yaml_ng::to_string(&spec).expect("yaml");
        assert!(
            yaml.contains("crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="),
            "{yaml}"
        );
        let back: TrustdCertsSpec = serde_yaml_ng::from_str(&yaml).expect("back");
        assert_eq!(back, spec);
    }

    #[test]
    fn every_type_is_sensitive_and_named_as_upstream() {
        for d in definitions() {
            assert_eq!(
                d.sensitivity,
                cosi::definition::Sensitivity::Sensitive,
                "{}",
                d.resource_type
            );
            assert!(d.resource_type.ends_with(".secrets.talos.dev"));
        }
        assert!(OsRootSpec::definition().matches("osrootsecrets"));
        assert!(ApiCertsSpec::definition().matches("apicertificates"));
    }

    #[test]
    fn keys_are_not_in_debug_output() {
        let c = CertificateAndKey {
            crt: "c".into(),
            key: "-----BEGIN ED25519 PRIVATE KEY-----".into(),
        };
        assert!(!format!("{c:?}").contains("PRIVATE"));
    }

    #[test]
    fn cert_sans_split_sort_and_dedup() {
        let mut s = CertSanSpec::default();
        s.append(&[
            "b.example".into(),
            "10.0.0.2".into(),
            "a.example".into(),
            "10.0.0.2".into(),
        ]);
        s.normalize();
        assert_eq!(s.dns_names, ["a.example", "b.example"]);
        assert_eq!(s.ips, ["10.0.0.2".parse::<IpAddr>().expect("ip")]);
    }
}
