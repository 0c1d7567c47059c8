//! `trustd.CertificateController`: keeps trustd's serving certificate and its signer equal to
//! what secretsd publishes (`TrustdCertificates/trustd`, `OSRootSecrets/os`). A new certificate
//! is served from the next handshake on; nothing is restarted.

use std::future::Future;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use machinery::resources::secrets::{
    OsRootSpec, TrustdCertsSpec, NAMESPACE, OS_ROOT_ID, TRUSTD_ID,
};
use machinery::secrets::x509::{Certificate, PrivateKey};
use machinery::tls::{certified_key, ServerCertificate};
use tokio::sync::watch;

use crate::service::{Signer, SignerSlot};

/// `trustd.CertificateController`.
#[derive(Debug)]
pub struct CertificateController {
    cert: ServerCertificate,
    signer: SignerSlot,
    serving: watch::Sender<bool>,
    reported: Option<String>,
}

impl CertificateController {
    /// A controller updating `cert` and `signer`, and saying on `serving` whether there is a
    /// certificate to serve with.
    pub fn new(cert: ServerCertificate, signer: SignerSlot, serving: watch::Sender<bool>) -> Self {
        Self {
            cert,
            signer,
            serving,
            reported: None,
        }
    }

    fn report(&mut self, problem: Option<String>) {
        if problem != self.reported {
            if let Some(p) = &problem {
                tracing::error!(problem = %p, "unusable certificate or CA; keeping the last good ones");
            }
            self.reported = problem;
        }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let certs = ctx.get::<TrustdCertsSpec>(NAMESPACE, TRUSTD_ID).await?;
        let root = ctx.get::<OsRootSpec>(NAMESPACE, OS_ROOT_ID).await?;
        let mut problem = None;
        match certs.as_ref().and_then(|c| c.spec.server.as_ref()) {
            Some(server) => match certified_key(&server.crt, &server.key) {
                Ok(ck) => self.cert.set(ck),
                Err(e) => problem = Some(format!("TrustdCertificates: {e}")),
            },
            None => self.cert.clear(),
        }
        match root.map(|r| r.spec) {
            Some(OsRootSpec {
                issuing_ca: Some(ca),
                accepted_cas,
                token,
                ..
            }) if !token.is_empty() => {
                match (
                    Certificate::from_pem(ca.crt.as_bytes()),
                    PrivateKey::from_pem(ca.key.as_bytes()),
                ) {
                    (Ok(ca), Ok(key)) => self.signer.set(Some(Signer {
                        ca,
                        key,
                        accepted: pem_bundle(&accepted_cas),
                        token,
                    })),
                    (Err(e), _) | (_, Err(e)) => {
                        problem = Some(format!("OSRootSecrets: {e}"));
                    }
                }
            }
            _ => self.signer.set(None),
        }
        self.report(problem);
        self.serving
            .send_replace(self.cert.is_set() && self.signer.get().is_some());
        Ok(Action::AwaitChange)
    }
}

/// The accepted CAs one after another, each ending in a newline (a PEM without its last
/// newline would otherwise run into the next one's BEGIN line).
fn pem_bundle(cas: &[machinery::resources::secrets::CertificatePem]) -> String {
    let mut out = String::new();
    for ca in cas {
        out.push_str(ca.crt.trim_end());
        out.push('\n');
    }
    out
}

impl Controller for CertificateController {
    fn name(&self) -> &'static str {
        "trustd.CertificateController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<TrustdCertsSpec>(NAMESPACE).with_id(TRUSTD_ID),
            Input::weak::<OsRootSpec>(NAMESPACE).with_id(OS_ROOT_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
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
    use machinery::resources::secrets::CertificatePem;

    #[test]
    fn a_bundle_keeps_pems_apart() {
        let pem = |s: &str| CertificatePem { crt: s.into() };
        assert_eq!(
            super::pem_bundle(&[pem("-----END CERTIFICATE-----"), pem("B\n")]),
            "-----END CERTIFICATE-----\nB\n"
        );
    }
}
