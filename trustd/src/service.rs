//! The Certificate RPC, as upstream's trustd answers it (see [`Service::certificate`]).

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use machinery::secrets::x509::{self, Certificate, PrivateKey};
use machinery::secrets::{token_matches, SecretsError};
use machinery::tls::ConnectInfo;
use proto::securityapi::security_service_server::SecurityService;
use proto::securityapi::{CertificateRequest, CertificateResponse};
use tonic::{Request, Response, Status};

/// Validity of a certificate trustd signs: 24 h, as upstream's (the requester renews it at half
/// of that).
pub const VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// What trustd signs with: the OS CA with its key, the accepted CAs it returns, the token.
pub struct Signer {
    /// The issuing CA.
    pub ca: Certificate,
    /// Its key.
    pub key: PrivateKey,
    /// The accepted CAs, PEM one after another.
    pub accepted: String,
    /// The trustd token.
    pub token: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

/// The signer, replaced when the OS root changes.
#[derive(Clone, Debug, Default)]
pub struct SignerSlot(Arc<RwLock<Option<Arc<Signer>>>>);

impl SignerSlot {
    /// The current signer.
    pub fn get(&self) -> Option<Arc<Signer>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces it.
    pub fn set(&self, signer: Option<Signer>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = signer.map(Arc::new);
    }
}

/// The SecurityService.
#[derive(Clone, Debug)]
pub struct Service {
    signer: SignerSlot,
}

impl Service {
    /// A service signing with what `signer` holds.
    pub fn new(signer: SignerSlot) -> Self {
        Self { signer }
    }
}

#[tonic::async_trait]
impl SecurityService for Service {
    /// Checks the token (SHA-256, constant time: `missing token`, `invalid token` are
    /// UNAUTHENTICATED), then signs the CSR ([`x509::sign_csr`]: Organization stripped, server
    /// authentication only, 24 h). A CSR that does not parse or verify is INVALID_ARGUMENT.
    async fn certificate(
        &self,
        request: Request<CertificateRequest>,
    ) -> Result<Response<CertificateResponse>, Status> {
        let remote = request
            .extensions()
            .get::<ConnectInfo>()
            .map(|c| c.remote)
            .ok_or_else(|| Status::permission_denied("peer not found"))?;
        let token = request
            .metadata()
            .get("token")
            .ok_or_else(|| Status::unauthenticated("missing token"))?
            .to_str()
            .map_err(|_| Status::unauthenticated("invalid token"))?
            .to_string();
        let signer = self
            .signer
            .get()
            .ok_or_else(|| Status::unavailable("trustd has no CA to sign with"))?;
        if !token_matches(&signer.token, &token) {
            tracing::warn!(%remote, "certificate request with an invalid token refused");
            return Err(Status::unauthenticated("invalid token"));
        }
        let csr = request.into_inner().csr;
        let crt = x509::sign_csr((&signer.ca, &signer.key), &csr, SystemTime::now(), VALIDITY)
            .map_err(|e| match e {
                SecretsError::Csr(_) => Status::invalid_argument(e.to_string()),
                other => {
                    tracing::error!(%remote, error = %other, "cannot sign a CSR");
                    Status::internal("failed to sign CSR")
                }
            })?;
        let info = crt.info().ok();
        tracing::info!(
            %remote,
            common_name = info.as_ref().and_then(|i| i.common_name.clone()).unwrap_or_default(),
            dns_names = ?info.as_ref().map(|i| i.dns_names.clone()).unwrap_or_default(),
            ips = ?info.as_ref().map(|i| i.ips.clone()).unwrap_or_default(),
            "signed a server certificate"
        );
        Ok(Response::new(CertificateResponse {
            ca: signer.accepted.clone().into_bytes(),
            crt: crt.to_pem().into_bytes(),
        }))
    }
}
