//! stated: the resource broker of a talos-rs node.
//!
//! It serves the COSI State API (`cosi.resource.State`) on a Unix socket, identifies every peer by
//! its kernel-verified uid, enforces one writer per namespace, stores resources schema-less
//! (metadata plus opaque spec bytes) and persists every write before acknowledging it.
//!
//! - [`store`]: resources, history, writes; [`persist`]: run log and durable namespaces;
//! - [`access`]: the manifest and the access policy; [`labels`]: queries;
//! - [`server`]: the gRPC service; [`testing`]: an in-process stated for tests.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod access;
pub mod conn;
pub mod labels;
pub mod persist;
pub mod server;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;

pub use access::{Manifest, Policy};
pub use store::Store;

/// Largest request stated accepts.
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// How to run stated.
#[derive(Clone, Debug)]
pub struct Config {
    /// The socket to listen on.
    pub socket: PathBuf,
    /// Where durable namespaces are written (survive reboot).
    pub state_dir: PathBuf,
    /// Where the run state is kept (survives a restart of stated; `/run` on a node).
    pub run_dir: PathBuf,
    /// The daemon manifest; `None` is standalone mode (uid 0 only).
    pub manifest: Option<Manifest>,
    /// Events kept per (namespace, type) for watch resume.
    pub history: usize,
    /// What the store keeps at most.
    pub limits: store::Limits,
    /// What each peer may hold open.
    pub peer_limits: server::PeerLimits,
}

/// Errors of running stated.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state could not be loaded.
    #[error("cannot open the store")]
    Open(#[from] store::OpenError),
    /// The socket could not be set up.
    #[error("cannot listen on {path}")]
    Listen {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("server failed")]
    Serve(#[from] tonic::transport::Error),
}

/// Opens the store described by `config`.
pub fn open_store(config: &Config) -> Result<Store, Error> {
    let policy = policy_of(config);
    let durable_policy = policy.clone();
    let namespaces = config
        .manifest
        .as_ref()
        .map(|m| {
            m.namespaces
                .iter()
                .map(|n| (n.name.clone(), n.description.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok(Store::open(store::StoreConfig {
        run_dir: Some(&config.run_dir),
        state_dir: Some(&config.state_dir),
        durable: Box::new(move |ns| durable_policy.is_durable(ns)),
        namespaces,
        history: config.history,
        limits: config.limits.clone(),
    })?)
}

fn policy_of(config: &Config) -> Policy {
    match &config.manifest {
        Some(m) => Policy::with_manifest(m.clone()),
        None => Policy::standalone(),
    }
}

/// Binds the socket: removes a stale one, listens, and lets every uid connect (access is decided
/// per request from peer credentials, not by file permissions).
pub fn bind(path: &Path) -> Result<UnixListener, Error> {
    let err = |source| Error::Listen {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
    Ok(listener)
}

/// Serves the State API on `listener` until `shutdown` completes.
pub async fn serve(
    store: Arc<Store>,
    config: &Config,
    listener: UnixListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let policy = Arc::new(policy_of(config));
    let limits = config.peer_limits.clone();
    let gate = Arc::new(conn::Gate::new(policy.clone(), limits.clone()));
    let service = server::StateService::new(store, policy, limits.clone());
    let batch = server::BatchService::new(service.clone());
    let (stopping_tx, mut stopping) = tokio::sync::watch::channel(false);
    let signal = async move {
        shutdown.await;
        let _ = stopping_tx.send(true);
    };
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_concurrent_streams(Some(limits.streams_per_connection))
        .add_service(
            proto::state_server::StateServer::new(service)
                .max_decoding_message_size(MAX_REQUEST)
                .max_encoding_message_size(cosi::client::MAX_MESSAGE),
        )
        .add_service(
            proto::talosrs::state::batch_server::BatchServer::new(batch)
                .max_decoding_message_size(MAX_REQUEST)
                .max_encoding_message_size(cosi::client::MAX_MESSAGE),
        )
        .serve_with_incoming_shutdown(gate.incoming(listener), signal);
    // A graceful stop waits for open streams, and watches never end by themselves: give
    // in-flight calls a moment, then stop. Every acknowledged write is already persisted, and
    // watching clients resume from their bookmarks.
    tokio::select! {
        result = server => result?,
        _ = async {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::info!("stopping with watches still open"),
    }
    Ok(())
}

/// How long a stopping stated waits for calls in flight.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

/// Runs stated: opens the store, binds the socket, serves until `shutdown`.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
    let store = Arc::new(open_store(&config)?);
    let listener = bind(&config.socket)?;
    tracing::info!(
        socket = %config.socket.display(),
        resources = store.len(),
        mode = if config.manifest.is_some() { "node" } else { "standalone" },
        "stated ready"
    );
    serve(store, &config, listener, shutdown).await
}
