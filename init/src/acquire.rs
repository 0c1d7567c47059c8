//! `config.AcquireController`: a VM node's machine configuration from the URL of its kernel
//! command line (`talos.config=http://…`, as upstream's metal platform and its qemu
//! provisioner use it), fetched once the network is up and applied as an apply in maintenance
//! mode would be (same validation; refused if a configuration is there by then).
//!
//! Plain `http://` only: an `https://` URL needs roots of trust an initramfs does not carry
//! here, and is reported as not supported rather than fetched without verification. The
//! answer is bounded ([`MAX_CONFIG`]), and so is each attempt ([`ATTEMPT`]); a failed attempt
//! retried until one succeeds: at once when the node's addresses change (the usual first
//! failure is a network not up yet), else after [`RETRY_UNREACHABLE`] or, for an answer that
//! was not a usable configuration, [`RETRY_REFUSED`]. Each new kind of failure is logged once.

use std::sync::Arc;
use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use http_body_util::BodyExt as _;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE};

use crate::apply::Applier;

/// The largest configuration accepted from a URL.
pub const MAX_CONFIG: usize = 1 << 20;
/// How long one attempt (connect, request, the whole body) may take.
pub const ATTEMPT: Duration = Duration::from_secs(15);
/// The next attempt after the server could not be reached (or an address change, sooner).
pub const RETRY_UNREACHABLE: Duration = Duration::from_secs(1);
/// The next attempt after an answer that was not a configuration the node takes.
pub const RETRY_REFUSED: Duration = Duration::from_secs(10);

/// Errors of fetching a configuration.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL cannot be used.
    #[error("talos.config={url}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server could not be reached or the exchange failed.
    #[error("GET {url}: {reason}")]
    Exchange {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server answered with something else than 200.
    #[error("GET {url}: the server answered {status}")]
    Status {
        /// The URL.
        url: String,
        /// Its status.
        status: http::StatusCode,
    },
}

/// Whether a `talos.config=` value is a URL this module fetches (rather than a file path).
pub fn is_url(value: &str) -> bool {
    value.contains("://")
}

/// Fetches `url` (plain HTTP, GET, at most [`MAX_CONFIG`] bytes, within [`ATTEMPT`]).
///
/// # Errors
///
/// [`FetchError`].
pub async fn fetch(url: &str) -> Result<Vec<u8>, FetchError> {
    let bad = |reason: &str| FetchError::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "https is not supported (no roots of trust in the image): serve it over http \
                 or apply the configuration with `talosctl apply-config --insecure`",
            ))
        }
        _ => return Err(bad("only http:// URLs are fetched")),
    }
    let host = uri.host().ok_or_else(|| bad("no host"))?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let exchange = |reason: String| FetchError::Exchange {
        url: url.to_string(),
        reason,
    };
    let attempt = async {
        // A bracketed IPv6 literal connects without the brackets.
        let connect_host = host.trim_start_matches('[').trim_end_matches(']');
        let stream = tokio::net::TcpStream::connect((connect_host, port))
            .await
            .map_err(|e| exchange(format!("cannot connect: {e}")))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| exchange(e.to_string()))?;
        let conn = tokio::spawn(conn);
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let authority = uri.authority().map_or(host.clone(), |a| a.to_string());
        let request = http::Request::get(path)
            .header(http::header::HOST, authority)
            .header(http::header::USER_AGENT, "talos-rs/init")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| exchange(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| exchange(e.to_string()))?;
        if response.status() != http::StatusCode::OK {
            conn.abort();
            return Err(FetchError::Status {
                url: url.to_string(),
                status: response.status(),
            });
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_CONFIG)
            .collect()
            .await
            .map_err(|e| exchange(format!("the body: {e} (at most {MAX_CONFIG} bytes)")))?;
        conn.abort();
        Ok(body.to_bytes().to_vec())
    };
    tokio::time::timeout(ATTEMPT, attempt)
        .await
        .map_err(|_| exchange(format!("no complete answer within {} s", ATTEMPT.as_secs())))?
}

/// `config.AcquireController`: while the node has no active configuration, fetches it from
/// `url` and applies it.
pub struct AcquireController {
    /// The `talos.config=` URL.
    pub url: String,
    /// The node's config writer.
    pub applier: Arc<Applier>,
    /// The last failure logged.
    pub last_failure: Option<String>,
}

impl AcquireController {
    /// The controller for `url`.
    pub fn new(url: String, applier: Arc<Applier>) -> Self {
        Self {
            url,
            applier,
            last_failure: None,
        }
    }

    fn failed(&mut self, message: String, retry: Duration) -> Action {
        // Logged when the failure changes, not at every retry.
        if self.last_failure.as_deref() != Some(message.as_str()) {
            tracing::warn!(retry_in = ?retry, "cannot take the configuration yet: {message}");
            self.last_failure = Some(message);
        }
        Action::RequeueAfter(retry)
    }
}

impl Controller for AcquireController {
    fn name(&self) -> &'static str {
        "config.AcquireController"
    }

    fn inputs(&self) -> Vec<Input> {
        // The node's addresses: an attempt that failed for want of a network is made again as
        // soon as an address appears, not after the backoff.
        vec![
            Input::weak::<MachineConfigSpec>(NAMESPACE).with_id(ACTIVE_ID),
            Input::weak::<machinery::resources::network::AddressStatusSpec>(
                machinery::resources::network::NAMESPACE,
            ),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        if ctx
            .get::<MachineConfigSpec>(NAMESPACE, ACTIVE_ID)
            .await?
            .is_some()
        {
            return Ok(Action::AwaitChange);
        }
        let data = match fetch(&self.url).await {
            Ok(d) => d,
            Err(e @ FetchError::Exchange { .. }) => {
                return Ok(self.failed(e.to_string(), RETRY_UNREACHABLE))
            }
            Err(e) => return Ok(self.failed(e.to_string(), RETRY_REFUSED)),
        };
        let len = data.len();
        let request = proto::init::ApplyRequest {
            data,
            mode: crate::apply::Mode::NoReboot as i32,
            maintenance: true,
            ..Default::default()
        };
        match self.applier.apply(request).await {
            Ok(_) => {
                tracing::info!(url = %self.url, bytes = len, "applied the machine configuration from talos.config");
                Ok(Action::AwaitChange)
            }
            // A configuration appeared meanwhile (applied through the maintenance API): done.
            Err(s) if s.code() == tonic::Code::PermissionDenied => Ok(Action::AwaitChange),
            Err(s) => {
                let message = format!(
                    "the configuration of talos.config={} was not applied: {}",
                    self.url,
                    s.message()
                );
                Ok(self.failed(message, RETRY_REFUSED))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    /// A server on 127.0.0.1 that answers one request with `response`; its URL.
    fn serve_once(response: Vec<u8>) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(&response);
            }
        });
        format!("http://127.0.0.1:{port}/t/config.yaml")
    }

    fn ok(body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    #[tokio::test]
    async fn a_config_is_fetched_and_bad_answers_are_errors() {
        let url = serve_once(ok(b"version: v1alpha1\n"));
        assert_eq!(fetch(&url).await.unwrap(), b"version: v1alpha1\n");

        let url = serve_once(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec());
        assert!(matches!(
            fetch(&url).await,
            Err(FetchError::Status { status, .. }) if status == 404
        ));

        // Larger than MAX_CONFIG: refused, not buffered without bound.
        let url = serve_once(ok(&vec![b'a'; MAX_CONFIG + 1]));
        assert!(matches!(
            fetch(&url).await,
            Err(FetchError::Exchange { .. })
        ));

        assert!(matches!(
            fetch("https://10.0.0.1/c").await,
            Err(FetchError::Url { reason, .. }) if reason.contains("https")
        ));
        assert!(matches!(
            fetch("ftp://10.0.0.1/c").await,
            Err(FetchError::Url { .. })
        ));
        assert!(is_url("http://x/y") && !is_url("/etc/talos/config.yaml"));
    }
}
