//! The daemon: connect to stated, keep the certificate and signer current (a controller), and
//! serve the Certificate RPC on TCP 50001 once there is something to serve with.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cosi::runtime::DaemonError;
use cosi::ResourceSpec;
use machinery::resources::secrets::{TrustdCertsSpec, NAMESPACE as SECRETS};
use machinery::tls::{self, ServerCertificate};
use proto::securityapi::security_service_server::SecurityServiceServer;
use tokio::sync::watch;

use crate::controller::CertificateController;
use crate::join::JoinController;
use crate::service::{Service, SignerSlot};

/// The namespace trustd writes: its dependency graph and, on a worker, the answer to apid's
/// CSR.
pub const NAMESPACE: &str = machinery::resources::trustd::NAMESPACE;
/// trustd's port.
pub const PORT: u16 = 50001;
/// Largest request trustd decodes: a CSR ([`machinery::secrets::x509::MAX_CSR`]) and framing.
pub const MAX_REQUEST: usize = 80 * 1024;

/// What trustd runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// stated's socket.
    pub socket: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Connection bounds.
    pub limits: tls::Limits,
    /// How long a control plane's trustd may take to answer a worker's CSR.
    pub join_timeout: Duration,
}

/// Why trustd stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What every daemon's run may fail with.
    #[error(transparent)]
    Daemon(#[from] cosi::runtime::DaemonError),
    /// The controller runtime's task panicked (a bug).
    #[error("controller runtime task failed: {0}")]
    Join(String),
    /// The TLS configuration cannot be made (a bug).
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
}

/// Runs trustd until `shutdown` completes. `ready` is called once stated answered.
///
/// # Errors
///
/// [`Error`]; an unreachable stated or a busy port is not an error: trustd waits and retries.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let client = cosi::Client::new(&config.socket).map_err(|source| DaemonError::Client {
        socket: config.socket.clone(),
        source,
    })?;
    let cert = ServerCertificate::default();
    let signer = SignerSlot::default();
    let (serving_tx, mut serving) = watch::channel(false);
    let mut registry = cosi::runtime::Registry::new();
    registry
        .register(CertificateController::new(
            cert.clone(),
            signer.clone(),
            serving_tx,
        ))
        .map_err(DaemonError::Register)?;
    registry
        .register(JoinController::new(config.join_timeout))
        .map_err(DaemonError::Register)?;
    let (stop_tx, stop) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(socket = %config.socket.display(), listen = %config.listen, "trustd started");
    tokio::select! {
        () = first_answer(&client) => {}
        _ = &mut shutdown => return Ok(()),
    }
    let definitions = machinery::resources::trustd::definitions();
    if let Err(e) = client.define_types_retrying(&definitions, "trustd").await {
        tracing::warn!(error = %e, "cannot define trustd's resource types");
    }
    ready();
    tracing::info!("stated answered: trustd is ready");
    let runtime = cosi::Runtime::with_registry(client, registry).publish_graph(NAMESPACE, "trustd");
    let runtime = tokio::spawn(runtime.run(stopped(stop.clone())));
    let server_config = Arc::new(tls::server_config(cert, None)?);
    let service = SecurityServiceServer::new(Service::new(signer))
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(1024 * 1024);
    let serve = async {
        if serving.wait_for(|s| *s).await.is_err() {
            return Ok(());
        }
        let listener = bind(config.listen).await;
        tracing::info!(listen = %config.listen, "serving certificates");
        tonic::transport::Server::builder()
            .concurrency_limit_per_connection(16)
            .timeout(Duration::from_secs(30))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .layer(tls::FirstRequestLayer)
            .add_service(service)
            .serve_with_incoming_shutdown(
                tls::incoming(listener, server_config, config.limits),
                stopped(stop.clone()),
            )
            .await
            .map_err(Error::Serve)
    };
    let mut serve = std::pin::pin!(serve);
    let served = tokio::select! {
        r = &mut serve => r,
        _ = &mut shutdown => {
            let _ = stop_tx.send(true);
            serve.await
        }
    };
    let _ = stop_tx.send(true);
    let runtime = match runtime.await {
        Ok(r) => r.map_err(|e| Error::Daemon(DaemonError::Runtime(e))),
        Err(e) => Err(Error::Join(e.to_string())),
    };
    tracing::info!("trustd stopped");
    served.and(runtime)
}

/// Waits until stated answers a read of trustd's certificates (found or not).
async fn first_answer(client: &cosi::Client) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match client
            .list(SECRETS, TrustdCertsSpec::TYPE, &cosi::Query::default())
            .await
        {
            Err(e) if e.is_unavailable() => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "stated refuses trustd's certificates");
                return;
            }
            Ok(_) => return,
        }
    }
}

/// Binds `addr`, retrying every 2 s while it fails (the port is busy, the address not there
/// yet).
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let mut reported = false;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) => {
                if !reported {
                    tracing::error!(%addr, error = %e, "cannot listen; retrying");
                    reported = true;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}
