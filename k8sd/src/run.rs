//! The daemon: connect to stated, define the etcd resource types (the first round-trip with
//! stated, after which k8sd says it is ready), run every controller until shutdown
//! ([`cosi::runtime::DaemonRun`], the shape these daemons share).

use std::future::Future;
use std::path::PathBuf;

use crate::{controllers, etcd};

/// What k8sd runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// stated's socket.
    pub socket: PathBuf,
    /// Controller settings.
    pub options: controllers::Options,
}

/// Why k8sd stopped.
pub type Error = cosi::runtime::DaemonError;

/// Runs k8sd until `shutdown` completes. `ready` is called once, when the resource definitions
/// are written (stated answered), before the controllers start.
///
/// # Errors
///
/// [`Error`]; an unreachable stated is not an error: k8sd waits for it.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let registry = controllers::registry(&config.options).map_err(Error::Register)?;
    let result = cosi::runtime::DaemonRun {
        name: "k8sd",
        socket: config.socket.clone(),
        definitions: machinery::resources::etcd::definitions()
            .into_iter()
            .chain(machinery::resources::k8s::definitions())
            .collect(),
        registry,
        graph_namespace: machinery::resources::etcd::NAMESPACE,
    }
    .run(ready, shutdown)
    .await;
    // The controllers are stopped: give the VIP elections' leases back, so that another
    // control plane takes the shared IPs now rather than when the leases expire.
    config.options.vip.release_all().await;
    if let Ok(client) = cosi::Client::new(&config.socket) {
        match tokio::time::timeout(
            std::time::Duration::from_secs(2),
            etcd::vip::give_up(&client),
        )
        .await
        {
            Ok(Ok(n)) if n > 0 => tracing::info!(ips = n, "shared IPs marked given up"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot mark the shared IPs given up"),
            Err(_) => tracing::warn!("cannot mark the shared IPs given up: stated does not answer"),
        }
    }
    result
}
