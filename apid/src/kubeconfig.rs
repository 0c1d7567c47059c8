//! `MachineService.Kubeconfig`: an admin kubeconfig for the cluster, as upstream's
//! `kubeconfig.GenerateAdmin` writes it (cluster and user `admin@<cluster>`, the control plane
//! endpoint as server, every accepted Kubernetes CA as its authority data), streamed as a
//! tar.gz holding one file `kubeconfig`, as upstream's.
//!
//! Upstream's machined signs the certificate with the Kubernetes CA key it holds. apid holds no
//! CA key: it makes the client key (ECDSA P-256), and secretsd signs its CSR with the
//! Kubernetes CA (`apid/ClientCertificateRequests` with authority `kubernetes`): subject
//! `admin` / `system:masters` whatever the CSR says, valid for
//! `cluster.adminKubeconfig.certLifetime` (1 year by default).

use std::time::Duration;

use machinery::config::Config;
use machinery::resources::apid::{ClientCertificateRequestSpec, AUTHORITY_KUBERNETES};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::secrets::{ClientCertificateSpec, NAMESPACE as SECRETS};
use machinery::secrets::x509::{KeyAlgorithm, LeafRequest};
use tonic::Status;

use crate::client_config::Generator;
use crate::request::unavailable;

/// The owner apid writes its requests as.
const OWNER: &str = "apid.Kubeconfig";
/// How long secretsd may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Upstream's default `cluster.adminKubeconfig.certLifetime`.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(8760 * 3600);
/// Upstream's refusal on a worker (its `checkControlplane`), word for word.
pub const WORKER: &str = "kubeconfig is only available on control plane nodes";

/// What goes into the kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// `cluster.clusterName`.
    pub cluster: String,
    /// `cluster.controlPlane.endpoint`.
    pub endpoint: String,
    /// The CAs, PEM, concatenated.
    pub ca: String,
    /// The client certificate, PEM.
    pub crt: String,
    /// Its key, PEM.
    pub key: String,
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

/// The kubeconfig, upstream's template line for line.
pub fn render(a: &Admin) -> String {
    let name = &a.cluster;
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {endpoint}\n    certificate-authority-data: {ca}\nusers:\n- name: admin@{name}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\ncontexts:\n- context:\n    cluster: {name}\n    namespace: default\n    user: admin@{name}\n  name: admin@{name}\ncurrent-context: admin@{name}\n",
        endpoint = a.endpoint,
        ca = b64(&a.ca),
        crt = b64(&a.crt),
        key = b64(&a.key),
    )
}

/// A tar.gz of one file `kubeconfig` (0600) holding `text`.
///
/// # Errors
///
/// An I/O error of the in-memory archive.
pub fn archive(text: &str) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(text.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    header.set_cksum();
    tar.append_data(&mut header, "kubeconfig", text.as_bytes())?;
    tar.into_inner()?.finish()
}

impl Generator {
    /// Answers one `Kubeconfig` call: the tar.gz.
    ///
    /// # Errors
    ///
    /// `Unimplemented` in maintenance and on a worker (upstream's); `ResourceExhausted` while
    /// too many certificates are being signed; `FailedPrecondition` when secretsd refused;
    /// `Unavailable` / `DeadlineExceeded` without stated or secretsd.
    pub async fn kubeconfig(&self) -> Result<Vec<u8>, Status> {
        let config = match self
            .client()
            .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
            .await
        {
            Ok(c) => c.spec.0,
            Err(e) if e.is_not_found() => {
                return Err(Status::unimplemented(
                    "kubeconfig is not available in maintenance mode",
                ))
            }
            Err(e) => return Err(unavailable(&e)),
        };
        let config = Config::from_yaml(&config)
            .map_err(|e| Status::internal(format!("the node's configuration: {e}")))?;
        if !config.machine_type().is_some_and(|t| t.is_control_plane()) {
            return Err(Status::unimplemented(WORKER));
        }
        let cluster = config.cluster();
        let name = cluster
            .and_then(|c| c.cluster_name.clone())
            .unwrap_or_default();
        let endpoint = cluster
            .and_then(|c| c.control_plane.as_ref())
            .and_then(|cp| cp.endpoint.clone())
            .ok_or_else(|| {
                Status::failed_precondition(
                    "the configuration has no cluster.controlPlane.endpoint",
                )
            })?;
        let lifetime = match cluster
            .and_then(|c| c.admin_kubeconfig.as_ref())
            .and_then(|a| a.cert_lifetime.as_deref())
        {
            None => DEFAULT_LIFETIME,
            Some(s) => machinery::config::parse_go_duration(s).map_err(|e| {
                Status::failed_precondition(format!("cluster.adminKubeconfig.certLifetime: {e}"))
            })?,
        };
        if lifetime.is_zero() {
            return Err(Status::failed_precondition(
                "cluster.adminKubeconfig.certLifetime should be positive",
            ));
        }
        let _permit = self.permit()?;
        let (csr, key) = LeafRequest::default()
            .csr(KeyAlgorithm::EcdsaP256)
            .map_err(|e| Status::internal(format!("cannot make a key: {e}")))?;
        let key = key
            .to_pem()
            .map_err(|e| Status::internal(format!("cannot encode the key: {e}")))?;
        let request = crate::request::Pending::create(
            self.client(),
            OWNER,
            ClientCertificateRequestSpec {
                csr: csr.clone(),
                roles: Vec::new(),
                ttl_seconds: lifetime.as_secs().max(1),
                authority: AUTHORITY_KUBERNETES.to_string(),
            },
        )
        .await?;
        let answer = request
            .answer::<ClientCertificateSpec>(
                SECRETS,
                ANSWER_TIMEOUT,
                "secretsd did not sign the Kubernetes client certificate",
                |a| a.csr == csr,
            )
            .await?;
        if !answer.error.is_empty() {
            return Err(Status::failed_precondition(answer.error));
        }
        let text = render(&Admin {
            cluster: name.clone(),
            endpoint,
            ca: answer.ca,
            crt: answer.crt,
            key,
        });
        tracing::info!(cluster = %name, lifetime_seconds = lifetime.as_secs(), "admin kubeconfig generated");
        archive(&text).map_err(|e| Status::internal(format!("cannot archive the kubeconfig: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_is_upstreams_and_the_archive_holds_it() {
        let a = Admin {
            cluster: "demo".into(),
            endpoint: "https://10.5.0.2:6443".into(),
            ca: "CA".into(),
            crt: "CRT".into(),
            key: "KEY".into(),
        };
        let text = render(&a);
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(v["current-context"], "admin@demo");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.5.0.2:6443"
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            b64("CA")
        );
        assert_eq!(v["users"][0]["name"], "admin@demo");
        assert_eq!(v["contexts"][0]["context"]["namespace"], "default");

        let gz = archive(&text).unwrap();
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(gz.as_slice()));
        let mut entries = tar.entries().unwrap();
        let mut e = entries.next().unwrap().unwrap();
        assert_eq!(e.path().unwrap().to_str(), Some("kubeconfig"));
        assert_eq!(e.header().mode().unwrap(), 0o600);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut e, &mut out).unwrap();
        assert_eq!(out, text);
        assert!(entries.next().is_none());
    }
}
