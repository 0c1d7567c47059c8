//! The daemon: connect to stated, keep the credentials and the type catalog current
//! (controllers), and serve the API on TCP 50000 once secretsd gave it a certificate.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cosi::runtime::DaemonError;
use cosi::ResourceSpec;
use machinery::resources::secrets::{ApiCertsSpec, NAMESPACE as SECRETS};
use machinery::tls;
use proto::machine::machine_service_server::MachineServiceServer;
use proto::storage::storage_service_server::StorageServiceServer;
use proto::talosrs::audit::audit_service_server::AuditServiceServer;

use crate::audit::Auditor;
use proto::state_server::StateServer;
use tokio::sync::watch;

use crate::auth::AuthzLayer;
use crate::controller::{CertificateController, Credentials};
use crate::machine::Machine;
use crate::proxy::{Peers, ProxyLayer};
use crate::state::{Catalog, CatalogController, ReadOnlyState};

/// The namespace apid writes: its dependency graph and its requests for client certificates.
pub const NAMESPACE: &str = "apid";
/// apid's port.
pub const PORT: u16 = 50000;
/// Largest request apid decodes (a machine configuration fits many times over).
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;
/// Calls (streams included) one connection may have open at once.
pub const MAX_STREAMS_PER_CONNECTION: usize = 64;

/// What apid runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// stated's socket.
    pub socket: PathBuf,
    /// init's control socket.
    pub init_socket: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Connection bounds.
    pub limits: tls::Limits,
    /// The port of other nodes' apid, where `node`/`nodes` requests go ([`PORT`]; tests run
    /// several apid on one host).
    pub peer_port: u16,
}

/// Why apid stopped.
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

/// Runs apid until `shutdown` completes. `ready` is called once stated answered.
///
/// # Errors
///
/// [`Error`]; an unreachable stated or a busy port is not an error: apid waits and retries.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let client = cosi::Client::new(&config.socket).map_err(|source| DaemonError::Client {
        socket: config.socket.clone(),
        source,
    })?;
    let creds = Credentials::default();
    let catalog = Catalog::default();
    let (serving_tx, mut serving) = watch::channel(false);
    let mut registry = cosi::runtime::Registry::new();
    registry
        .register(CertificateController::new(creds.clone(), serving_tx))
        .map_err(DaemonError::Register)?;
    registry
        .register(CatalogController::new(catalog.clone()))
        .map_err(DaemonError::Register)?;
    let (stop_tx, stop) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(socket = %config.socket.display(), listen = %config.listen, "apid started");
    tokio::select! {
        () = first_answer(&client) => {}
        _ = &mut shutdown => return Ok(()),
    }
    let definitions = machinery::resources::apid::definitions();
    if let Err(e) = client.define_types_retrying(&definitions, "apid").await {
        tracing::warn!(error = %e, "cannot define apid's resource types");
    }
    crate::client_config::forget_stale(&client).await;
    crate::bootstrap::forget_stale(&client).await;
    crate::etcd::forget_stale(&client).await;
    crate::etcd::forget_stale_uploads(&client).await;
    ready();
    tracing::info!("stated answered: apid is ready");
    let runtime =
        cosi::Runtime::with_registry(client.clone(), registry).publish_graph(NAMESPACE, "apid");
    let runtime = tokio::spawn(runtime.run(stopped(stop.clone())));
    let server_config = Arc::new(tls::server_config(
        creds.server.clone(),
        Some(creds.client_cas.clone()),
    )?);
    let pool = crate::share::Pool::default();
    let state = StateServer::new(ReadOnlyState::new(
        cosi::unix_channel(&config.socket),
        client.clone(),
        catalog,
        pool.clone(),
    ))
    .max_decoding_message_size(MAX_REQUEST)
    .max_encoding_message_size(cosi::client::MAX_MESSAGE);
    let storage = StorageServiceServer::new(crate::storage::Storage::new(client.clone()))
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(cosi::client::MAX_MESSAGE);
    let machine = MachineServiceServer::new(Machine::new(
        cosi::unix_channel(&config.init_socket),
        client,
        pool,
    ))
    .max_decoding_message_size(MAX_REQUEST)
    .max_encoding_message_size(cosi::client::MAX_MESSAGE);
    let audit = AuditServiceServer::new(Auditor::new(cosi::unix_channel(&config.init_socket)))
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(cosi::client::MAX_MESSAGE);
    let peers = Peers::new(creds.identity.clone(), config.peer_port);
    let serve = async {
        if serving.wait_for(|s| *s).await.is_err() {
            return Ok(());
        }
        let listener = bind(config.listen).await;
        tracing::info!(listen = %config.listen, "serving the API");
        tonic::transport::Server::builder()
            .concurrency_limit_per_connection(MAX_STREAMS_PER_CONNECTION)
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION as u32))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .layer(
                tower::ServiceBuilder::new()
                    .layer(tls::FirstRequestLayer)
                    .layer(AuthzLayer::new(creds.client_cas.clone()))
                    .layer(ProxyLayer::new(peers)),
            )
            .add_service(state)
            .add_service(machine)
            .add_service(audit)
            .add_service(storage)
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
    tracing::info!("apid stopped");
    served.and(runtime)
}

/// Waits until stated answers a read of apid's certificates (found or not).
async fn first_answer(client: &cosi::Client) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match client
            .list(SECRETS, ApiCertsSpec::TYPE, &cosi::Query::default())
            .await
        {
            Err(e) if e.is_unavailable() => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "stated refuses apid's certificates");
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
