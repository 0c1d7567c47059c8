//! The life of a daemon that is only controllers (secretsd, blockd): connect to stated, define
//! its resource types (the first round-trip, after which it says it is ready), run its
//! controllers until shutdown.

use std::future::Future;
use std::path::PathBuf;

use super::{DaemonError, Registry, Runtime};
use crate::{Client, ResourceDefinition};

/// What such a daemon runs with.
#[derive(Debug)]
pub struct DaemonRun {
    /// Its name (logs, the definitions' owner, its dependency graph).
    pub name: &'static str,
    /// stated's socket.
    pub socket: PathBuf,
    /// The resource types it defines.
    pub definitions: Vec<ResourceDefinition>,
    /// Its controllers.
    pub registry: Registry,
    /// Where its dependency graph is published (a namespace it writes).
    pub graph_namespace: &'static str,
}

impl DaemonRun {
    /// Runs until `shutdown` completes. `ready` is called once, when the definitions are
    /// written (stated answered), before the controllers start. A refused definition is
    /// logged, not retried; an unreachable stated is waited for.
    ///
    /// # Errors
    ///
    /// [`DaemonError`].
    pub async fn run(self, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), DaemonError> {
        let name = self.name;
        let client = Client::new(&self.socket).map_err(|source| DaemonError::Client {
            socket: self.socket.clone(),
            source,
        })?;
        tracing::info!(socket = %self.socket.display(), "{name} started");
        let mut shutdown = std::pin::pin!(shutdown);
        let define = async {
            if let Err(e) = client.define_types_retrying(&self.definitions, name).await {
                // Its resources are still written, but clients cannot list the undefined
                // types by name: a bug of the definitions (a name another owner has).
                tracing::error!(error = %e, "cannot define {name}'s resource types: talosctl cannot name them");
            }
        };
        tokio::select! {
            () = define => {}
            _ = &mut shutdown => {
                tracing::info!("{name} stopped before stated answered");
                return Ok(());
            }
        }
        ready();
        tracing::info!("resource types defined: {name} is ready");
        let result = Runtime::with_registry(client, self.registry)
            .publish_graph(self.graph_namespace, name)
            .run(shutdown)
            .await
            .map_err(DaemonError::Runtime);
        tracing::info!("{name} stopped");
        result
    }
}
