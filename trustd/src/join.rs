//! `trustd.JoinController`, on a worker: sends the CSR secretsd published for apid
//! (`secrets/ApiCertificateRequests/api`) to a control plane's trustd with the trustd token,
//! verifying that trustd's certificate chains to the accepted OS CAs ([`crate::client`]), and
//! writes the answer, or why there is none, as `trustd/SignedCertificates/api`. secretsd
//! decides whether the certificate will do; this controller never sees apid's key.
//!
//! An answer already had for the same CSR is kept (a restart of trustd asks nothing again),
//! and so is the last answer once nothing is asked (`talosctl get signedcertificates` shows
//! which trustd signed, or why none did).
//! A failed request is retried with backoff (1 s doubling to 1 min), and at once when the CSR,
//! the token or the CAs change.

use std::future::Future;
use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::secrets::{
    ApiCsrSpec, OsRootSpec, API_CSR_ID, NAMESPACE as SECRETS, OS_ROOT_ID,
};
use machinery::resources::trustd::{SignedCertificateSpec, API_ID, NAMESPACE};
use machinery::secrets::x509::Certificate;

use crate::client::{request_certificate, Signed};

/// How long one endpoint may take to answer.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(60);

/// `trustd.JoinController`.
#[derive(Debug)]
pub struct JoinController {
    retry: Duration,
    timeout: Duration,
}

impl Default for JoinController {
    fn default() -> Self {
        Self::new(ATTEMPT_TIMEOUT)
    }
}

impl JoinController {
    /// A controller giving each endpoint `timeout` to answer.
    pub fn new(timeout: Duration) -> Self {
        Self {
            retry: FIRST_RETRY,
            timeout,
        }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let had = ctx.get::<SignedCertificateSpec>(NAMESPACE, API_ID).await?;
        let Some(request) = ctx.get::<ApiCsrSpec>(SECRETS, API_CSR_ID).await? else {
            // Nothing asked (secretsd has its certificate): the last answer stays, to be seen.
            self.retry = FIRST_RETRY;
            if let Some(had) = had {
                ctx.apply(Resource::<SignedCertificateSpec>::new_default(
                    API_ID, had.spec,
                ))
                .await?;
            }
            return Ok(Action::AwaitChange);
        };
        let request = request.spec;
        if let Some(had) = had {
            if had.spec.csr == request.csr && !had.spec.crt.is_empty() {
                ctx.apply(Resource::<SignedCertificateSpec>::new_default(
                    API_ID, had.spec,
                ))
                .await?;
                return Ok(Action::AwaitChange);
            }
        }
        let root = ctx.get::<OsRootSpec>(SECRETS, OS_ROOT_ID).await?;
        let answer = match root.map(|r| r.spec) {
            None => Err("no OS root secrets yet (no machine configuration)".to_string()),
            Some(root) if root.token.is_empty() => Err(
                "machine.token is empty: there is nothing to authenticate to trustd with"
                    .to_string(),
            ),
            Some(root) => {
                let accepted: Vec<Certificate> = root
                    .accepted_cas
                    .iter()
                    .filter_map(|c| Certificate::from_pem(c.crt.as_bytes()).ok())
                    .collect();
                request_certificate(
                    &request.endpoints,
                    &root.token,
                    &accepted,
                    &request.csr,
                    self.timeout,
                )
                .await
                .map_err(|e| e.to_string())
            }
        };
        let (spec, action) = match answer {
            Ok(Signed { endpoint, ca, crt }) => {
                tracing::info!(%endpoint, "trustd signed apid's CSR");
                self.retry = FIRST_RETRY;
                let spec = SignedCertificateSpec {
                    csr: request.csr,
                    crt,
                    ca,
                    endpoint,
                    error: String::new(),
                };
                (spec, Action::AwaitChange)
            }
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = self.retry.as_millis(), "no trustd signed apid's CSR");
                let spec = SignedCertificateSpec {
                    csr: request.csr,
                    endpoint: request.endpoints.last().cloned().unwrap_or_default(),
                    error,
                    ..SignedCertificateSpec::default()
                };
                let wait = self.retry;
                self.retry = (self.retry * 2).min(LAST_RETRY);
                (spec, Action::RequeueAfter(wait))
            }
        };
        ctx.apply(Resource::<SignedCertificateSpec>::new_default(API_ID, spec))
            .await?;
        Ok(action)
    }
}

impl Controller for JoinController {
    fn name(&self) -> &'static str {
        "trustd.JoinController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<ApiCsrSpec>(SECRETS).with_id(API_CSR_ID),
            Input::weak::<OsRootSpec>(SECRETS).with_id(OS_ROOT_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<SignedCertificateSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}
