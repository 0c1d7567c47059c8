//! The joining side: ask a control plane's trustd to sign a CSR, verifying trustd's
//! certificate against the accepted CAs (upstream shipped without that check once; here it is
//! the only way to connect) and trying each endpoint in turn.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use machinery::secrets::x509::Certificate;
use machinery::tls;
use proto::securityapi::security_service_client::SecurityServiceClient;
use proto::securityapi::CertificateRequest;

use crate::run::PORT;

/// Why no endpoint signed the CSR.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No endpoint to ask.
    #[error("no trustd endpoint")]
    NoEndpoint,
    /// The TLS configuration cannot be made from the accepted CAs.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Every endpoint failed; each failure, in order.
    #[error("no trustd signed the CSR: {}", .0.join("; "))]
    Failed(Vec<String>),
}

/// `host`, `host:port`, `[v6]:port`: the host (the name the certificate must carry) and the
/// port (50001 by default).
fn split(endpoint: &str) -> (String, u16) {
    if let Ok(sa) = endpoint.parse::<SocketAddr>() {
        return (sa.ip().to_string(), sa.port());
    }
    if let Ok(ip) = endpoint.parse::<std::net::IpAddr>() {
        return (ip.to_string(), PORT);
    }
    match endpoint.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => {
            (host.to_string(), port.parse().unwrap_or(PORT))
        }
        _ => (endpoint.to_string(), PORT),
    }
}

/// What a trustd answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    /// The endpoint that signed.
    pub endpoint: String,
    /// The accepted CAs it returned, PEM.
    pub ca: String,
    /// The signed certificate, PEM.
    pub crt: String,
}

/// Asks each endpoint in turn (each within `timeout`) to sign `csr_pem` with `token`, trusting
/// only `accepted` CAs for trustd's own certificate. Returns what the first that answers
/// signed.
///
/// # Errors
///
/// [`ClientError`], with every endpoint's failure.
pub async fn request_certificate(
    endpoints: &[String],
    token: &str,
    accepted: &[Certificate],
    csr_pem: &str,
    timeout: Duration,
) -> Result<Signed, ClientError> {
    if endpoints.is_empty() {
        return Err(ClientError::NoEndpoint);
    }
    let config = Arc::new(tls::client_config(accepted, None)?);
    let mut failures = Vec::new();
    for endpoint in endpoints {
        let (host, port) = split(endpoint);
        let addr = match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(mut addrs) => match addrs.next() {
                Some(a) => a,
                None => {
                    failures.push(format!("{endpoint}: no address"));
                    continue;
                }
            },
            Err(e) => {
                failures.push(format!("{endpoint}: {e}"));
                continue;
            }
        };
        let channel = match tls::channel(addr, &host, config.clone(), timeout) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{endpoint}: {e}"));
                continue;
            }
        };
        let mut request = tonic::Request::new(CertificateRequest {
            csr: csr_pem.as_bytes().to_vec(),
        });
        request.set_timeout(timeout);
        match token.parse() {
            Ok(v) => {
                request.metadata_mut().insert("token", v);
            }
            Err(_) => {
                failures.push(format!("{endpoint}: the token is not valid metadata"));
                continue;
            }
        }
        let mut client = SecurityServiceClient::new(channel);
        match tokio::time::timeout(timeout, client.certificate(request)).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                return Ok(Signed {
                    endpoint: endpoint.clone(),
                    ca: String::from_utf8_lossy(&r.ca).into_owned(),
                    crt: String::from_utf8_lossy(&r.crt).into_owned(),
                });
            }
            Ok(Err(status)) => failures.push(format!("{endpoint}: {}", describe(&status))),
            Err(_) => failures.push(format!("{endpoint}: timed out")),
        }
    }
    Err(ClientError::Failed(failures))
}

/// A status with its transport cause (a certificate the accepted CAs do not sign shows as
/// such, not as a bare "transport error").
fn describe(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_default_to_port_50001() {
        assert_eq!(split("10.5.0.2"), ("10.5.0.2".into(), 50001));
        assert_eq!(split("10.5.0.2:1234"), ("10.5.0.2".into(), 1234));
        assert_eq!(split("[fd00::2]:50001"), ("fd00::2".into(), 50001));
        assert_eq!(split("fd00::2"), ("fd00::2".into(), 50001));
        assert_eq!(split("cp.example"), ("cp.example".into(), 50001));
        assert_eq!(split("cp.example:7"), ("cp.example".into(), 7));
    }
}
