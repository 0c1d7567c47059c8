//! The daemon: connect to stated, define the secrets resource types (the first round-trip with
//! stated, after which secretsd says it is ready), run every controller until shutdown.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::controllers;

/// What secretsd runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// stated's socket.
    pub socket: PathBuf,
    /// Controller settings.
    pub options: controllers::Options,
}

/// Why secretsd stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path is unusable.
    #[error("cannot create a stated client for {socket}")]
    Client {
        /// The socket.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: cosi::StateError,
    },
    /// Two controllers conflict (a bug).
    #[error("cannot register the controllers")]
    Register(#[source] cosi::runtime::RuntimeError),
    /// The runtime itself failed (a bug).
    #[error("controller runtime failed")]
    Runtime(#[source] cosi::runtime::RuntimeError),
}

/// Runs secretsd until `shutdown` completes. `ready` is called once, when the resource
/// definitions are written (stated answered), before the controllers start.
///
/// # Errors
///
/// [`Error`]; an unreachable stated is not an error: secretsd waits for it.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let client = cosi::Client::new(&config.socket).map_err(|source| Error::Client {
        socket: config.socket.clone(),
        source,
    })?;
    let registry = controllers::registry(&config.options).map_err(Error::Register)?;
    tracing::info!(
        socket = %config.socket.display(),
        leaf_validity_s = config.options.leaf_validity.as_secs(),
        "secretsd started"
    );
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        () = define_types(client.clone()) => {}
        _ = &mut shutdown => {
            tracing::info!("secretsd stopped before stated answered");
            return Ok(());
        }
    }
    ready();
    tracing::info!("resource types defined: secretsd is ready");
    let result = cosi::Runtime::with_registry(client, registry)
        .publish_graph(machinery::resources::secrets::NAMESPACE, "secretsd")
        .run(shutdown)
        .await
        .map_err(Error::Runtime);
    tracing::info!("secretsd stopped");
    result
}

/// Writes the definitions of the secrets types, retrying while stated is unreachable. A
/// refusal is logged once and not retried.
async fn define_types(client: cosi::Client) {
    let mut backoff = Duration::from_millis(100);
    let definitions = machinery::resources::secrets::definitions();
    loop {
        match client.define_types(&definitions, "secretsd").await {
            Ok(()) => break,
            Err(e) if e.is_unavailable() => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot define the secrets resource types");
                break;
            }
        }
    }
}
