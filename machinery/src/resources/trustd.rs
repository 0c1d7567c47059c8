//! trustd's namespace (ours): what a worker's trustd got back for the CSR secretsd asked it to
//! send (`SignedCertificates`, ID `api`).

use cosi::{ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// trustd's namespace.
pub const NAMESPACE: &str = "trustd";
/// ID of [`SignedCertificateSpec`] for apid's certificate.
pub const API_ID: &str = "api";

/// The answer to a CSR (`SignedCertificates`, ID `api`), written by the worker's trustd: the
/// CSR it answers (secretsd takes a certificate only for the CSR it is waiting on), and either
/// the signed certificate with the CAs the control plane's trustd named, or why none was had.
/// A certificate and CAs are public: the type is not sensitive.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignedCertificateSpec {
    /// The CSR answered, PEM.
    pub csr: String,
    /// The signed certificate, PEM (empty while none was had).
    #[serde(default)]
    pub crt: String,
    /// The accepted CAs the signing trustd returned, PEM.
    #[serde(default)]
    pub ca: String,
    /// The trustd that signed it, or the last one tried.
    #[serde(default)]
    pub endpoint: String,
    /// Why no certificate was had (every endpoint's failure), empty once one was.
    #[serde(default)]
    pub error: String,
}

impl ResourceSpec for SignedCertificateSpec {
    const TYPE: &'static str = "SignedCertificates.trustd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Endpoint", "{.endpoint}"), ("Error", "{.error}")])
    }
}

/// Definitions of every type of the namespace.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![SignedCertificateSpec::definition()]
}
