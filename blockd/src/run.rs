//! The daemon: connect to stated, define the block resource types (the first round-trip with
//! stated, after which blockd says it is ready), run every controller until shutdown
//! ([`cosi::runtime::DaemonRun`], the shape these daemons share).

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

/// Runs blockd until `shutdown` completes ([`cosi::runtime::DaemonRun`]). `ready` is called
/// once, when the resource definitions are written (stated answered), before the controllers
/// start.
///
/// # Errors
///
/// [`Error`]; an unreachable stated is not an error: blockd waits for it.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let registry = controllers::registry(&config.options).map_err(Error::Register)?;
    cosi::runtime::DaemonRun {
        name: "blockd",
        socket: config.socket,
        definitions: machinery::resources::block::definitions(),
        registry,
        graph_namespace: machinery::resources::block::NAMESPACE,
    }
    .run(ready, shutdown)
    .await
}
