//! `apid.CertificateController`: keeps apid's serving certificate, the client CAs it accepts
//! and its own client identity (for forwarding to other nodes) equal to what secretsd
//! publishes in `ApiCertificates/api`. New values apply from the next handshake on; nothing is
//! restarted, open connections keep theirs.
//!
//! While init says the node is in maintenance (`runtime/MachineStatus` stage `maintenance`: no
//! machine configuration), apid serves the maintenance API instead: a self-signed certificate
//! made here, in memory, its fingerprint logged (the console) for `talosctl apply-config
//! --insecure --cert-fingerprint`, and no client certificate asked for. It is kept in
//! `apid/MaintenanceServerCertificates/maintenance` (sensitive), so that a restarted apid serves the
//! same one and the fingerprint the user pinned still holds; it is removed once the node is
//! configured.

use std::future::Future;
use std::sync::{Arc, RwLock};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::apid::{
    MaintenanceCertificateSpec, MAINTENANCE_ID, NAMESPACE as APID_NS,
};
use machinery::resources::runtime::{
    MachineStage, MachineStatusSpec, MACHINE_STATUS_ID, NAMESPACE as RUNTIME,
};
use machinery::resources::secrets::{ApiCertsSpec, CertificateAndKey, API_ID, NAMESPACE};
use machinery::secrets::x509::{Certificate, ExtendedUsage, LeafRequest, Subject, Usage};
use machinery::secrets::API_SERVING_KEY;
use machinery::tls::{certified_key, client_config, ClientCas, ServerCertificate};
use tokio::sync::watch;

/// What apid presents and accepts.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The serving certificate.
    pub server: ServerCertificate,
    /// The CAs of accepted clients.
    pub client_cas: ClientCas,
    /// The accepted CAs and apid's own client certificate and key (PEM), for calls to other
    /// nodes' apid; a control plane has one, a worker none.
    pub identity: Arc<RwLock<Option<Identity>>>,
}

/// apid's credentials as a client of other nodes: a TLS client configuration trusting the
/// accepted CAs and presenting apid's `os:impersonator` certificate. It is replaced only when
/// the certificate, key or CAs change, so that a user of it (the proxy's connection cache) can
/// tell a change by pointer.
#[derive(Clone)]
pub struct Identity {
    /// The configuration.
    pub config: Arc<machinery::tls::rustls::ClientConfig>,
    /// What it was made from: certificate PEM, key PEM, the CAs' DER.
    source: (String, String, Vec<Vec<u8>>),
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

/// `apid.CertificateController`.
#[derive(Debug)]
pub struct CertificateController {
    creds: Credentials,
    serving: watch::Sender<bool>,
    reported: Option<String>,
    /// The maintenance certificate, once made or found, as served and as stored.
    maintenance: Option<(
        Arc<machinery::tls::rustls::sign::CertifiedKey>,
        MaintenanceCertificateSpec,
    )>,
}

/// How long the maintenance certificate is valid (it lives only as long as this apid).
const MAINTENANCE_VALIDITY: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// The DNS name of the maintenance certificate (its only SAN): what a client that checks the
/// server's name besides its pin names it (gRPC's C-core: `grpc.ssl_target_name_override`).
/// The CN, with its space, is no name a client may send (rustls refuses such an SNI).
pub const MAINTENANCE_SERVER_NAME: &str = "talos-rs-maintenance";

/// A self-signed server certificate for the maintenance API: a throwaway CA (its key dropped
/// at once) signs a leaf for server authentication, named [`MAINTENANCE_SERVER_NAME`]. Both
/// keys are ECDSA P-256 ([`API_SERVING_KEY`]), so that gRPC's C-core clients (BoringSSL: no
/// Ed25519) get in too.
fn maintenance_certificate() -> Result<MaintenanceCertificateSpec, String> {
    let now = std::time::SystemTime::now();
    let subject = Subject {
        organizations: Vec::new(),
        common_name: Some("talos-rs maintenance".into()),
    };
    let ca = machinery::secrets::x509::self_signed_ca(&subject, API_SERVING_KEY, now)
        .map_err(|e| e.to_string())?;
    let (crt, key) = LeafRequest {
        subject,
        dns_names: vec![MAINTENANCE_SERVER_NAME.to_string()],
        key_usages: vec![Usage::DigitalSignature],
        extended: vec![ExtendedUsage::ServerAuth],
        key_algorithm: Some(API_SERVING_KEY),
        ..LeafRequest::default()
    }
    .issue((&ca.0, &ca.1), now, MAINTENANCE_VALIDITY)
    .map_err(|e| e.to_string())?;
    let key = key.to_pem().map_err(|e| e.to_string())?;
    Ok(MaintenanceCertificateSpec {
        server: CertificateAndKey {
            crt: crt.to_pem(),
            key,
        },
    })
}

type Served = (machinery::tls::rustls::sign::CertifiedKey, String);

/// What apid serves of a maintenance certificate: the key pair and the fingerprint it logs;
/// an error when the certificate does not parse, its key is not its own or not of
/// [`API_SERVING_KEY`] (one made by an apid of before, Ed25519), or it ends within a day (a
/// stored one is then replaced).
fn served(spec: &MaintenanceCertificateSpec) -> Result<Served, String> {
    let crt = Certificate::from_pem(spec.server.crt.as_bytes()).map_err(|e| e.to_string())?;
    let info = crt.info().map_err(|e| e.to_string())?;
    let day = std::time::Duration::from_secs(24 * 3600);
    if info.not_after < std::time::SystemTime::now() + day {
        return Err("it expires within a day".into());
    }
    if info.key_algorithm != Some(API_SERVING_KEY) {
        return Err(format!(
            "its key is {:?}, not {API_SERVING_KEY:?}",
            info.key_algorithm
        ));
    }
    let fingerprint = crt.fingerprint().map_err(|e| e.to_string())?;
    let ck = certified_key(&spec.server.crt, &spec.server.key).map_err(|e| e.to_string())?;
    Ok((ck, fingerprint))
}

impl CertificateController {
    /// A controller updating `creds`, and saying on `serving` whether apid has what it needs
    /// to serve (a certificate and accepted CAs).
    pub fn new(creds: Credentials, serving: watch::Sender<bool>) -> Self {
        Self {
            creds,
            serving,
            reported: None,
            maintenance: None,
        }
    }

    fn report(&mut self, problem: Option<String>) {
        if problem != self.reported {
            if let Some(p) = &problem {
                tracing::error!(problem = %p, "unusable API certificates; keeping the last good ones");
            }
            self.reported = problem;
        }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let stage = ctx
            .get::<MachineStatusSpec>(RUNTIME, MACHINE_STATUS_ID)
            .await?
            .map(|m| m.spec.stage);
        if stage == Some(MachineStage::Maintenance) {
            if self.maintenance.is_none() {
                // The one a previous apid of this boot made and logged, else a new one.
                let stored = ctx
                    .get::<MaintenanceCertificateSpec>(APID_NS, MAINTENANCE_ID)
                    .await?
                    .map(|r| r.spec);
                let reused = stored.and_then(|s| served(&s).ok().map(|(ck, fp)| (ck, fp, s)));
                let (ck, fp, spec, fresh) = match reused {
                    Some((ck, fp, spec)) => (ck, fp, spec, false),
                    None => match maintenance_certificate()
                        .and_then(|made| served(&made).map(|(ck, fp)| (ck, fp, made)))
                    {
                        Ok((ck, fp, made)) => (ck, fp, made, true),
                        Err(e) => {
                            self.report(Some(format!("maintenance certificate: {e}")));
                            return Ok(Action::AwaitChange);
                        }
                    },
                };
                tracing::warn!(
                    fingerprint = %fp,
                    reused = !fresh,
                    "maintenance mode: the node has no machine configuration; the \
                     maintenance API is open to clients without a certificate \
                     (apply one with talosctl apply-config --insecure \
                     --cert-fingerprint {fp})"
                );
                self.maintenance = Some((Arc::new(ck), spec));
            }
            if let Some((ck, spec)) = &self.maintenance {
                self.creds.server.set((**ck).clone());
                // Asserted every cycle (the runtime removes an output a cycle does not assert;
                // an unchanged one is not written again).
                ctx.apply(Resource::new_default(MAINTENANCE_ID, spec.clone()))
                    .await?;
            }
            self.creds.client_cas.set_open(true);
            self.serving.send_replace(true);
            return Ok(Action::AwaitChange);
        }
        if self.creds.client_cas.is_open() {
            tracing::info!("maintenance is over: clients need a certificate of the OS CA again");
            self.creds.client_cas.set_open(false);
            self.maintenance = None;
        }
        // Configured: the maintenance certificate is not asserted, so the runtime removes it.
        let spec = ctx
            .get::<ApiCertsSpec>(NAMESPACE, API_ID)
            .await?
            .map(|r| r.spec)
            .unwrap_or_default();
        let mut problems = Vec::new();
        match &spec.server {
            Some(s) => match certified_key(&s.crt, &s.key) {
                Ok(ck) => self.creds.server.set(ck),
                Err(e) => problems.push(format!("server certificate: {e}")),
            },
            None => self.creds.server.clear(),
        }
        let cas: Result<Vec<Certificate>, _> = spec
            .accepted_cas
            .iter()
            .map(|c| Certificate::from_pem(c.crt.as_bytes()))
            .collect();
        let cas = match cas {
            Ok(cas) if cas.is_empty() => {
                self.creds.client_cas.clear();
                cas
            }
            Ok(cas) => {
                if let Err(e) = self.creds.client_cas.set(&cas) {
                    problems.push(format!("accepted CAs: {e}"));
                }
                cas
            }
            Err(e) => {
                problems.push(format!("accepted CAs: {e}"));
                Vec::new()
            }
        };
        let source = match &spec.client {
            Some(c) if !cas.is_empty() => Some((
                c.crt.clone(),
                c.key.clone(),
                cas.iter().map(|c| c.der().to_vec()).collect::<Vec<_>>(),
            )),
            _ => None,
        };
        let mut identity = self
            .creds
            .identity
            .write()
            .unwrap_or_else(|e| e.into_inner());
        match source {
            None => *identity = None,
            Some(source) if identity.as_ref().is_some_and(|i| i.source == source) => {}
            Some(source) => match client_config(&cas, Some((&source.0, &source.1))) {
                Ok(config) => {
                    *identity = Some(Identity {
                        config: Arc::new(config),
                        source,
                    })
                }
                Err(e) => {
                    problems.push(format!("client certificate: {e}"));
                    *identity = None;
                }
            },
        }
        drop(identity);
        self.report((!problems.is_empty()).then(|| problems.join("; ")));
        self.serving
            .send_replace(self.creds.server.is_set() && !spec.accepted_cas.is_empty());
        Ok(Action::AwaitChange)
    }
}

impl Controller for CertificateController {
    fn name(&self) -> &'static str {
        "apid.CertificateController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<ApiCertsSpec>(NAMESPACE).with_id(API_ID),
            Input::weak::<MachineStatusSpec>(RUNTIME).with_id(MACHINE_STATUS_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<MaintenanceCertificateSpec>()]
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
    use machinery::secrets::x509::{KeyAlgorithm, PrivateKey};

    #[test]
    fn the_maintenance_key_is_ecdsa_and_a_stored_ed25519_one_is_replaced() {
        let made = maintenance_certificate().unwrap();
        let crt = Certificate::from_pem(made.server.crt.as_bytes()).unwrap();
        let key = PrivateKey::from_pem(made.server.key.as_bytes()).unwrap();
        assert_eq!(key.algorithm(), KeyAlgorithm::EcdsaP256);
        assert_eq!(crt.key_algorithm(), Some(KeyAlgorithm::EcdsaP256));
        assert!(crt.matches_key(&key));
        assert_eq!(crt.info().unwrap().dns_names, [MAINTENANCE_SERVER_NAME]);
        served(&made).unwrap();

        // What an apid of before made and stored: an Ed25519 key, otherwise good.
        let now = std::time::SystemTime::now();
        let subject = Subject::default();
        let ca =
            machinery::secrets::x509::self_signed_ca(&subject, KeyAlgorithm::Ed25519, now).unwrap();
        let (crt, key) = LeafRequest {
            subject,
            extended: vec![ExtendedUsage::ServerAuth],
            ..LeafRequest::default()
        }
        .issue((&ca.0, &ca.1), now, MAINTENANCE_VALIDITY)
        .unwrap();
        let old = MaintenanceCertificateSpec {
            server: CertificateAndKey {
                crt: crt.to_pem(),
                key: key.to_pem().unwrap(),
            },
        };
        let e = served(&old).err().unwrap();
        assert!(e.contains("Ed25519"), "{e}");
    }
}
