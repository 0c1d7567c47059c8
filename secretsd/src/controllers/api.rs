//! `secrets.APIController`: apid's certificates (`ApiCertificates/api`), as upstream's.
//!
//! - On a control plane (the OS root has its CA key) the leaf engine of [`super::leaf`] signs
//!   apid's serving and client certificates locally.
//! - On a worker (the OS root has only the CA certificate) the serving certificate comes from a
//!   control plane's trustd, as upstream's `generateWorker`, but split across two daemons so
//!   that the key never leaves secretsd and the token never reaches apid: secretsd makes a key
//!   (ECDSA P-256, as a control plane's apid key: see [`super::leaf::server_request`]) and a
//!   CSR for the API SANs and publishes the CSR with the trustd endpoints
//!   (`ApiCertificateRequests/api`); the worker's trustd sends it with the trustd token and
//!   writes the answer into its own namespace (`trustd/SignedCertificates/api`); secretsd takes
//!   the certificate only if it answers the CSR it waits on, is for its key, chains to an
//!   accepted CA of the configuration (not to what the network said), is a server certificate
//!   naming what was asked, and is in its validity. A worker gets no client certificate: its
//!   apid does not forward (upstream's too).
//!
//! The worker's certificate is kept while it is good and renewed at half its lifetime (a new
//! key and CSR; the old certificate is served until the new one is there). The pending key is
//! held in memory only: after a restart of secretsd mid-request a new CSR replaces the old one.

use std::future::Future;
use std::time::{Duration, SystemTime};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::secrets::{
    ApiCertsSpec, ApiCsrSpec, CertSanSpec, CertificateAndKey, OsRootSpec, API_CSR_ID, API_ID,
    CERT_SAN_API_ID, NAMESPACE, OS_ROOT_ID,
};
use machinery::resources::trustd::{
    SignedCertificateSpec, API_ID as SIGNED_API_ID, NAMESPACE as TRUSTD_NS,
};
use machinery::secrets::x509::{Certificate, KeyAlgorithm, LeafRequest, PrivateKey, Usage};

use super::leaf::{self, Api, LeafController};
use super::source::{self, Machine, Source};
use super::Options;

/// Clock slack allowed before a certificate's start.
const START_SLACK: Duration = Duration::from_secs(60);
/// The longest the controller sleeps between two looks at the worker's certificate.
const RECHECK: Duration = Duration::from_secs(24 * 3600);
/// How long after a certificate that does not do before a new CSR is made.
const BAD_ANSWER_RETRY: Duration = Duration::from_secs(30);

/// A CSR waiting for trustd's answer.
struct Pending {
    sans: CertSanSpec,
    csr: String,
    key: PrivateKey,
}

/// `secrets.APIController`.
pub struct ApiController {
    leaf: LeafController<Api>,
    source: Source,
    pending: Option<Pending>,
    reported: Option<String>,
}

impl std::fmt::Debug for ApiController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiController")
            .field("pending", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl ApiController {
    /// A controller with these options.
    pub fn new(options: &Options) -> Self {
        Self {
            leaf: LeafController::new(options),
            source: Source::default(),
            pending: None,
            reported: None,
        }
    }

    fn report(&mut self, problem: Option<String>) {
        if problem != self.reported {
            if let Some(p) = &problem {
                tracing::error!(
                    controller = "secrets.APIController",
                    problem = %p,
                    "no apid certificate from trustd yet"
                );
            }
            self.reported = problem;
        }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(root) = ctx.get::<OsRootSpec>(NAMESPACE, OS_ROOT_ID).await? else {
            self.pending = None;
            return Ok(Action::AwaitChange);
        };
        if root.spec.issuing_ca.is_some() {
            self.pending = None;
            return self.leaf.run(ctx).await;
        }
        self.worker(ctx, root.spec).await
    }

    async fn worker(
        &mut self,
        ctx: &mut Context,
        root: OsRootSpec,
    ) -> Result<Action, ReconcileError> {
        let sans = if leaf::network_ready(ctx).await? {
            ctx.get::<CertSanSpec>(NAMESPACE, CERT_SAN_API_ID).await?
        } else {
            None
        };
        let Some(sans) = sans.map(|s| s.spec) else {
            keep_both(ctx).await?;
            return Ok(Action::AwaitChange);
        };
        let accepted: Vec<Certificate> = root
            .accepted_cas
            .iter()
            .filter_map(|c| Certificate::from_pem(c.crt.as_bytes()).ok())
            .collect();
        if accepted.is_empty() {
            self.report(Some(
                "the configuration names no usable OS CA (machine.ca.crt, machine.acceptedCAs)"
                    .into(),
            ));
            keep_both(ctx).await?;
            return Ok(Action::AwaitChange);
        }
        let request = leaf::server_request(&sans, vec![Usage::DigitalSignature]);
        let now = SystemTime::now();
        let existing = ctx.get::<ApiCertsSpec>(NAMESPACE, API_ID).await?;
        let server = existing.and_then(|e| e.spec.server);
        if let Some(server) = &server {
            let key = PrivateKey::from_pem(server.key.as_bytes()).ok();
            if let Some(renew) = key
                .and_then(|key| worker_good_until(&server.crt, &key, &accepted, &request, now).ok())
            {
                self.pending = None;
                self.report(None);
                ctx.apply(Resource::<ApiCertsSpec>::new_default(
                    API_ID,
                    worker_certs(&root, server.clone()),
                ))
                .await?;
                return Ok(Action::RequeueAfter(until(renew)));
            }
        }
        let endpoints = match self.endpoints(ctx).await? {
            Ok(e) => e,
            Err(problem) => {
                self.report(Some(problem));
                keep_both(ctx).await?;
                return Ok(Action::AwaitChange);
            }
        };
        if !self.pending.as_ref().is_some_and(|p| p.sans == sans) {
            // The request names the key's algorithm (ECDSA P-256: see `server_request`); the
            // last accepted CA's would be upstream's choice.
            let ca_algorithm = accepted
                .last()
                .and_then(Certificate::key_algorithm)
                .unwrap_or(KeyAlgorithm::Ed25519);
            let (csr, key) = request
                .csr(ca_algorithm)
                .map_err(|e| failed("cannot make a CSR for apid's certificate", e))?;
            tracing::info!(
                endpoints = ?endpoints,
                "asking trustd for apid's certificate"
            );
            self.pending = Some(Pending {
                sans: sans.clone(),
                csr,
                key,
            });
        }
        let answer = ctx
            .get::<SignedCertificateSpec>(TRUSTD_NS, SIGNED_API_ID)
            .await?
            .map(|a| a.spec);
        let Some(pending) = self.pending.take() else {
            return Ok(Action::AwaitChange);
        };
        let answer = answer.filter(|a| a.csr == pending.csr);
        if let Some(answer) = answer.as_ref().filter(|a| !a.crt.is_empty()) {
            match worker_good_until(&answer.crt, &pending.key, &accepted, &request, now) {
                Ok(renew) => {
                    let key = pending
                        .key
                        .to_pem()
                        .map_err(|e| failed("cannot encode apid's key", e))?;
                    let server = CertificateAndKey {
                        crt: answer.crt.clone(),
                        key,
                    };
                    tracing::info!(endpoint = %answer.endpoint, "apid's certificate signed by trustd");
                    self.report(None);
                    ctx.apply(Resource::<ApiCertsSpec>::new_default(
                        API_ID,
                        worker_certs(&root, server),
                    ))
                    .await?;
                    return Ok(Action::RequeueAfter(until(renew)));
                }
                Err(why) => {
                    // Another CSR gives trustd another try; a stuck answer is not waited on.
                    self.report(Some(format!(
                        "trustd at {} answered with a certificate that does not do: {why}",
                        answer.endpoint
                    )));
                    source::keep::<ApiCertsSpec>(ctx).await?;
                    return Ok(Action::RequeueAfter(BAD_ANSWER_RETRY));
                }
            }
        }
        if let Some(error) = answer.map(|a| a.error).filter(|e| !e.is_empty()) {
            self.report(Some(error));
        }
        let csr = pending.csr.clone();
        self.pending = Some(pending);
        ctx.apply(Resource::<ApiCsrSpec>::new_default(
            API_CSR_ID,
            ApiCsrSpec { csr, endpoints },
        ))
        .await?;
        // The old certificate, if any, is served until the new one is there.
        source::keep::<ApiCertsSpec>(ctx).await?;
        Ok(Action::AwaitChange)
    }

    /// The trustd endpoints: the host of `cluster.controlPlane.endpoint` (upstream adds the
    /// members found by discovery and Kubernetes' endpoints, neither of which exists here).
    async fn endpoints(
        &mut self,
        ctx: &Context,
    ) -> Result<Result<Vec<String>, String>, ReconcileError> {
        let config = match self.source.machine(ctx).await? {
            Machine::Valid(config) => config,
            Machine::Absent | Machine::Keep => {
                return Ok(Err(
                    "no valid machine configuration to find trustd in".into()
                ))
            }
        };
        let Some(endpoint) = config
            .cluster()
            .and_then(|c| c.control_plane.as_ref())
            .and_then(|c| c.endpoint.clone())
        else {
            return Ok(Err(
                "cluster.controlPlane.endpoint is missing: no trustd to ask".into(),
            ));
        };
        Ok(machinery::config::generate::endpoint_host(&endpoint)
            .map(|host| vec![host])
            .map_err(|e| e.to_string()))
    }
}

/// Re-asserts both outputs unchanged.
async fn keep_both(ctx: &mut Context) -> Result<(), ReconcileError> {
    source::keep::<ApiCertsSpec>(ctx).await?;
    source::keep::<ApiCsrSpec>(ctx).await
}

fn until(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::now())
        .unwrap_or_default()
        .clamp(Duration::from_secs(1), RECHECK)
}

fn worker_certs(root: &OsRootSpec, server: CertificateAndKey) -> ApiCertsSpec {
    ApiCertsSpec {
        accepted_cas: root.accepted_cas.clone(),
        client: None,
        server: Some(server),
    }
}

/// When a worker's serving certificate `crt` must be renewed, if it may be used at all: it is
/// for `key`, an accepted CA signed it, it is a server certificate and not a CA, its key is of
/// the algorithm `request` names (one of a worker of before, Ed25519, is asked for again), it
/// names what `request` asks, and `now` lies between its start (with slack) and its half-life.
pub fn worker_good_until(
    crt: &str,
    key: &PrivateKey,
    accepted: &[Certificate],
    request: &LeafRequest,
    now: SystemTime,
) -> Result<SystemTime, String> {
    let cert = Certificate::from_pem(crt.as_bytes()).map_err(|e| e.to_string())?;
    let info = cert.info().map_err(|e| e.to_string())?;
    if !cert.matches_key(key) {
        return Err("it is not for the key of the CSR".into());
    }
    if !accepted.iter().any(|ca| cert.is_signed_by(ca)) {
        return Err("no accepted OS CA signed it".into());
    }
    if info.is_ca || !info.server_auth {
        return Err("it is not a server certificate".into());
    }
    if let Some(wanted) = request
        .key_algorithm
        .filter(|&a| info.key_algorithm != Some(a))
    {
        return Err(format!(
            "its key is {:?}, not {wanted:?}",
            info.key_algorithm
        ));
    }
    if !request.matches(&info) {
        return Err(format!(
            "it names {:?} {:?} {:?}, not the API SANs asked for",
            info.common_name, info.dns_names, info.ips
        ));
    }
    if now + START_SLACK < info.not_before {
        return Err("it is not valid yet".into());
    }
    if now >= info.half_life() {
        return Err("it is past half its lifetime".into());
    }
    Ok(info.half_life())
}

fn failed(context: &str, e: machinery::secrets::SecretsError) -> ReconcileError {
    ReconcileError::Failed {
        context: context.to_string(),
        source: Box::new(e),
    }
}

impl Controller for ApiController {
    fn name(&self) -> &'static str {
        "secrets.APIController"
    }

    fn inputs(&self) -> Vec<Input> {
        let mut inputs = self.leaf.inputs();
        inputs.push(source::input());
        inputs.push(Input::weak::<SignedCertificateSpec>(TRUSTD_NS).with_id(SIGNED_API_ID));
        inputs
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<ApiCertsSpec>(),
            Output::exclusive::<ApiCsrSpec>(),
        ]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::secrets::x509::{self_signed_ca, Subject};

    fn ca(name: &str) -> (Certificate, PrivateKey) {
        self_signed_ca(
            &Subject {
                organizations: vec!["talos".into()],
                common_name: Some(name.into()),
            },
            KeyAlgorithm::Ed25519,
            SystemTime::now(),
        )
        .expect("ca")
    }

    #[test]
    fn a_signed_answer_is_taken_only_for_its_key_from_an_accepted_ca_naming_what_was_asked() {
        let (os, os_key) = ca("os");
        let (rogue, rogue_key) = ca("rogue");
        let sans = CertSanSpec {
            ips: vec!["10.5.0.3".parse().expect("ip")],
            dns_names: vec!["w1".into()],
            fqdn: "w1".into(),
        };
        let request = leaf::server_request(&sans, vec![Usage::DigitalSignature]);
        let (csr, key) = request.csr(KeyAlgorithm::Ed25519).expect("csr");
        assert_eq!(
            key.algorithm(),
            KeyAlgorithm::EcdsaP256,
            "apid's key is ECDSA P-256 whatever the CA's"
        );
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        let sign = |ca: &Certificate, k: &PrivateKey, csr: &str| {
            machinery::secrets::x509::sign_csr((ca, k), csr.as_bytes(), now, day)
                .expect("sign")
                .to_pem()
        };
        let good = sign(&os, &os_key, &csr);
        let renew =
            worker_good_until(&good, &key, std::slice::from_ref(&os), &request, now).expect("good");
        assert!(renew > now + day / 2 - Duration::from_secs(5));
        // Signed by a CA the configuration does not accept.
        let bad = sign(&rogue, &rogue_key, &csr);
        let e =
            worker_good_until(&bad, &key, std::slice::from_ref(&os), &request, now).unwrap_err();
        assert!(e.contains("no accepted OS CA"), "{e}");
        // Another key's CSR.
        let (other_csr, _) = request.csr(KeyAlgorithm::Ed25519).expect("csr");
        let other = sign(&os, &os_key, &other_csr);
        let e =
            worker_good_until(&other, &key, std::slice::from_ref(&os), &request, now).unwrap_err();
        assert!(e.contains("not for the key"), "{e}");
        // Other names than asked.
        let mut elsewhere = sans.clone();
        elsewhere.ips = vec!["10.5.0.9".parse().expect("ip")];
        let asked = leaf::server_request(&elsewhere, vec![Usage::DigitalSignature]);
        let e = worker_good_until(&good, &key, std::slice::from_ref(&os), &asked, now).unwrap_err();
        assert!(e.contains("not the API SANs"), "{e}");
        // A certificate of an Ed25519 key (a worker's of before): a new CSR is made.
        let ed25519 = LeafRequest {
            key_algorithm: None,
            ..request.clone()
        };
        let (old_csr, old_key) = ed25519.csr(KeyAlgorithm::Ed25519).expect("csr");
        let old = sign(&os, &os_key, &old_csr);
        let e = worker_good_until(&old, &old_key, std::slice::from_ref(&os), &request, now)
            .unwrap_err();
        assert!(e.contains("not EcdsaP256"), "{e}");
        // Past its half-life.
        let e = worker_good_until(&good, &key, &[os], &request, now + day / 2).unwrap_err();
        assert!(e.contains("half"), "{e}");
    }
}
