//! `GenerateClientConfiguration`: a talosconfig with a new client certificate of the OS CA.
//!
//! Upstream's machined signs it with the CA key of the configuration it holds. apid never
//! holds a CA key (DESIGN.md §4): it makes the client's key itself, writes a CSR and the roles
//! into its own namespace (`apid/ClientCertificateRequests`, a random ID), and secretsd, the
//! only daemon with the OS CA key, answers under that ID in `secrets/ClientCertificates`. The
//! key goes from apid to the caller and nowhere else. apid destroys its request when the call
//! ends (answered, refused, timed out or cancelled), and every request of a previous apid at
//! start ([`forget_stale`]).

use std::time::Duration;

use cosi::ResourceSpec;
use machinery::config::Config;
use machinery::resources::apid::{
    ClientCertificateRequestSpec, KNOWN_ROLES, MAX_CLIENT_CERTIFICATE_REQUESTS,
};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::secrets::{ClientCertificateSpec, NAMESPACE as SECRETS};
use machinery::secrets::x509::{KeyAlgorithm, LeafRequest, MAX_LEAF_VALIDITY};
use proto::machine::{GenerateClientConfiguration, GenerateClientConfigurationRequest};
use serde::Serialize;
use tokio::sync::Semaphore;
use tonic::Status;

/// The owner apid writes its requests as.
const OWNER: &str = "apid.GenerateClientConfiguration";
/// How long secretsd may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Upstream's refusals, word for word.
const MAINTENANCE: &str =
    "client configuration (talosconfig) can't be generated in the maintenance mode";
const WORKER: &str = "client configuration (talosconfig) can't be generated on worker nodes";

/// The generator: stated and a bound on calls in flight.
#[derive(Debug)]
pub struct Generator {
    client: cosi::Client,
    in_flight: Semaphore,
}

/// A talosconfig as upstream's `clientconfig.NewConfig` writes it: one context, the CA, the
/// certificate and the key (base64 PEM), `endpoints: []`.
#[derive(Serialize)]
struct TalosConfig<'a> {
    context: &'a str,
    contexts: std::collections::BTreeMap<&'a str, TalosContext>,
}

#[derive(Serialize)]
struct TalosContext {
    endpoints: Vec<String>,
    ca: String,
    crt: String,
    key: String,
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The validity asked for, whole seconds (rounded up), or upstream's refusal.
fn ttl(d: Option<prost_types::Duration>) -> Result<u64, Status> {
    let positive = |d: &prost_types::Duration| d.seconds > 0 || (d.seconds == 0 && d.nanos > 0);
    let Some(d) = d.filter(|d| positive(d) && d.nanos >= 0) else {
        return Err(Status::invalid_argument("crt_ttl should be positive"));
    };
    let secs = u64::try_from(d.seconds).unwrap_or(0) + u64::from(d.nanos > 0);
    if secs > MAX_LEAF_VALIDITY.as_secs() {
        return Err(Status::invalid_argument(format!(
            "crt_ttl should be at most {} years",
            MAX_LEAF_VALIDITY.as_secs() / (365 * 86_400)
        )));
    }
    Ok(secs)
}

/// The roles as upstream's `role.Parse` keeps them: trimmed, known, sorted, once each.
fn roles(asked: &[String]) -> Vec<String> {
    let mut roles: Vec<String> = asked
        .iter()
        .map(|r| r.trim())
        .filter(|r| KNOWN_ROLES.contains(r))
        .map(str::to_string)
        .collect();
    roles.sort();
    roles.dedup();
    roles
}

/// Upstream's context name: `<role without os:>@<cluster>` for one role, else the cluster's.
fn context_name(cluster: &str, roles: &[String]) -> String {
    match roles {
        [one] => format!("{}@{cluster}", one.strip_prefix("os:").unwrap_or(one)),
        _ => cluster.to_string(),
    }
}

use crate::request::unavailable;

impl Generator {
    /// A generator over stated.
    pub fn new(client: cosi::Client) -> Self {
        Self {
            client,
            in_flight: Semaphore::new(MAX_CLIENT_CERTIFICATE_REQUESTS),
        }
    }

    /// stated.
    pub(crate) fn client(&self) -> &cosi::Client {
        &self.client
    }

    /// A slot among the certificates being signed, or `ResourceExhausted`.
    pub(crate) fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, Status> {
        self.in_flight.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!(
                "{MAX_CLIENT_CERTIFICATE_REQUESTS} client certificates are being signed: try again"
            ))
        })
    }

    /// Answers one call.
    pub async fn generate(
        &self,
        req: GenerateClientConfigurationRequest,
    ) -> Result<GenerateClientConfiguration, Status> {
        let config = match self
            .client
            .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
            .await
        {
            Ok(c) => c.spec.0,
            Err(e) if e.is_not_found() => return Err(Status::unimplemented(MAINTENANCE)),
            Err(e) => return Err(unavailable(&e)),
        };
        let config = Config::from_yaml(&config)
            .map_err(|e| Status::internal(format!("the node's configuration: {e}")))?;
        if !config.machine_type().is_some_and(|t| t.is_control_plane()) {
            return Err(Status::failed_precondition(WORKER));
        }
        let cluster = config
            .cluster()
            .and_then(|c| c.cluster_name.clone())
            .unwrap_or_default();
        let ttl_seconds = ttl(req.crt_ttl)?;
        let roles = roles(&req.roles);
        let _permit = self.permit()?;
        // Upstream makes the key of the CA's type; any key type works with any CA in TLS 1.3,
        // and Ed25519 keys are made at once where an RSA one takes seconds.
        let (csr, key) = LeafRequest::default()
            .csr(KeyAlgorithm::Ed25519)
            .map_err(|e| Status::internal(format!("cannot make a key: {e}")))?;
        let key = key
            .to_pem()
            .map_err(|e| Status::internal(format!("cannot encode the key: {e}")))?;
        let request = crate::request::Pending::create(
            &self.client,
            OWNER,
            ClientCertificateRequestSpec {
                csr: csr.clone(),
                roles: roles.clone(),
                ttl_seconds,
                authority: machinery::resources::apid::AUTHORITY_OS.to_string(),
            },
        )
        .await?;
        let answer = request
            .answer::<ClientCertificateSpec>(
                SECRETS,
                ANSWER_TIMEOUT,
                "secretsd did not sign the client certificate",
                |a| a.csr == csr,
            )
            .await?;
        if !answer.error.is_empty() {
            return Err(Status::failed_precondition(answer.error));
        }
        let name = context_name(&cluster, &roles);
        let mut contexts = std::collections::BTreeMap::new();
        contexts.insert(
            name.as_str(),
            TalosContext {
                endpoints: Vec::new(),
                ca: b64(answer.ca.as_bytes()),
                crt: b64(answer.crt.as_bytes()),
                key: b64(key.as_bytes()),
            },
        );
        let talosconfig = serde_yaml_ng::to_string(&TalosConfig {
            context: &name,
            contexts,
        })
        .map_err(|e| Status::internal(e.to_string()))?;
        tracing::info!(roles = ?roles, ttl_seconds, context = %name, "client configuration generated");
        Ok(GenerateClientConfiguration {
            metadata: None,
            ca: answer.ca.into_bytes(),
            crt: answer.crt.into_bytes(),
            key: key.into_bytes(),
            talosconfig: talosconfig.into_bytes(),
        })
    }
}

/// Destroys the requests a previous apid left (it was killed mid-call).
pub async fn forget_stale(client: &cosi::Client) {
    crate::request::forget_stale(client, ClientCertificateRequestSpec::TYPE).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_context_names_follow_upstream() {
        let asked = vec![" os:reader".to_string(), "bogus".into(), "os:reader".into()];
        let r = roles(&asked);
        assert_eq!(r, vec!["os:reader".to_string()]);
        assert_eq!(context_name("demo", &r), "reader@demo");
        assert_eq!(context_name("demo", &[]), "demo");
    }

    #[test]
    fn ttl_must_be_positive_and_encodable() {
        let d = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
        assert_eq!(ttl(d(3600, 0)).unwrap(), 3600);
        assert_eq!(ttl(d(0, 1)).unwrap(), 1);
        for bad in [None, d(0, 0), d(-1, 0), d(1, -5)] {
            let e = ttl(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
        }
        assert!(ttl(d(i64::MAX, 0))
            .unwrap_err()
            .message()
            .contains("at most 100 years"));
    }
}
