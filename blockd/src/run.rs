//! The daemon: connect to stated, define the block resource types (the first round-trip with
//! stated, after which blockd says it is ready), run every controller until shutdown.

use std::future::Future;
use std::path::PathBuf;

use crate::controllers;

/// What blockd runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// stated's socket.
    pub socket: PathBuf,
    /// Controller settings.
    pub options: controllers::Options,
}

/// Why blockd stopped.
pub type Error = cosi::runtime::DaemonError;

/// Runs blockd until `shutdown` completes. `ready` is called once, when the resource
/// definitions are written (stated answered), before the controllers start.
///
/// # Errors
///
/// [`Error`]; an unreachable stated is not an error: blockd waits for it.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let client = cosi::Client::new(&config.socket).map_err(|source| Error::Client {
        socket: config.socket.clone(),
        source,
    })?;
    let registry = controllers::registry(&config.options).map_err(Error::Register)?;
    tracing::info!(
        socket = %config.socket.display(),
        sys_block = %config.options.sys_block.display(),
        "blockd started"
    );
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        () = define_types(client.clone()) => {}
        _ = &mut shutdown => {
            tracing::info!("blockd stopped before stated answered");
            return Ok(());
        }
    }
    ready();
    tracing::info!("resource types defined: blockd is ready");
    let result = cosi::Runtime::with_registry(client, registry)
        .publish_graph(machinery::resources::block::NAMESPACE, "blockd")
        .run(shutdown)
        .await
        .map_err(Error::Runtime);
    tracing::info!("blockd stopped");
    result
}

/// Writes the definitions of the secrets types, retrying while stated is unreachable. A
/// refusal is logged and not retried.
async fn define_types(client: cosi::Client) {
    let definitions = machinery::resources::block::definitions();
    if let Err(e) = client.define_types_retrying(&definitions, "blockd").await {
        tracing::warn!(error = %e, "cannot define the block resource types");
    }
}
