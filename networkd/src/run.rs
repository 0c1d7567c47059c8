//! The daemon: connect to stated, define the network resource types (the first round-trip with
//! stated, after which networkd says it is ready), run every controller until shutdown,
//! publishing the dependency graph (`talosctl inspect dependencies`).

use std::future::Future;
use std::path::PathBuf;

use cosi::{ResourceDefinition, ResourceSpec};

use crate::controllers;

/// What networkd runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// stated's socket.
    pub socket: PathBuf,
    /// Root of the rendered files (`etc/resolv.conf`, `etc/hosts`, `etc/hostname`).
    pub etc_root: PathBuf,
}

/// Why networkd stopped.
pub type Error = cosi::runtime::DaemonError;

/// The definitions networkd writes: every network type, and its own `DHCP4Lease` and
/// `DHCP6Lease`.
pub fn definitions() -> Vec<ResourceDefinition> {
    let mut defs = machinery::resources::network::definitions();
    defs.push(crate::dhcp::Dhcp4LeaseSpec::definition());
    defs.push(crate::dhcp6::Dhcp6LeaseSpec::definition());
    defs
}

/// Runs networkd until `shutdown` completes. `ready` is called once, when the resource
/// definitions are written (stated answered), before the controllers start.
///
/// # Errors
///
/// [`Error`]; an unreachable stated is not an error: networkd waits for it (not ready meanwhile)
/// and controllers retry until it answers.
pub async fn run(config: Config, ready: impl FnOnce(), shutdown: impl Future) -> Result<(), Error> {
    let client = cosi::Client::new(&config.socket).map_err(|source| Error::Client {
        socket: config.socket.clone(),
        source,
    })?;
    let options = controllers::Options {
        etc_root: config.etc_root.clone(),
    };
    let registry = controllers::registry_with(&options).map_err(Error::Register)?;
    tracing::info!(socket = %config.socket.display(), "networkd started");
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        () = define_types(client.clone()) => {}
        _ = &mut shutdown => {
            tracing::info!("networkd stopped before stated answered");
            return Ok(());
        }
    }
    ready();
    tracing::info!("resource types defined: networkd is ready");
    let result = cosi::Runtime::with_registry(client, registry)
        .publish_graph(machinery::resources::network::NAMESPACE, "networkd")
        .run(shutdown)
        .await
        .map_err(Error::Runtime);
    tracing::info!("networkd stopped");
    result
}

/// Writes the resource definitions of the network types (created, or updated when they
/// differ), retrying while stated is unreachable. A refusal (the manifest does not let
/// networkd define a type) is logged and not retried.
async fn define_types(client: cosi::Client) {
    if let Err(e) = client
        .define_types_retrying(&definitions(), "networkd")
        .await
    {
        tracing::warn!(error = %e, "cannot define the network resource types");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn not_ready_and_no_controller_runs_while_stated_does_not_answer() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = Config {
            socket: dir.path().join("no-stated.sock"),
            etc_root: dir.path().to_path_buf(),
        };
        let ready = std::sync::atomic::AtomicBool::new(false);
        let result = run(
            config,
            || ready.store(true, std::sync::atomic::Ordering::SeqCst),
            tokio::time::sleep(Duration::from_millis(500)),
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        assert!(!ready.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn every_name_of_networkd_s_types_names_one_type_of_the_node() {
        // stated refuses a definition that takes another type's name: networkd's would be
        // left undefined (the acronym `dhcpl` was both DHCP leases').
        let mut seen = std::collections::BTreeMap::new();
        let mut both = Vec::new();
        let ours = super::definitions();
        let mut all = machinery::resources::definitions();
        all.retain(|d| !ours.iter().any(|o| o.resource_type == d.resource_type));
        all.extend(ours);
        for d in all {
            for n in d.names() {
                if let Some(other) = seen.insert(n.clone(), d.resource_type.clone()) {
                    both.push(format!("{n}: {other} {}", d.resource_type));
                }
            }
        }
        assert!(both.is_empty(), "{both:#?}");
    }
}
