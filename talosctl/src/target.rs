//! Which node a command talks to, and through which sockets.
//!
//! The development route (`--socket`, `--init-socket`) reaches a node through its Unix sockets:
//! the local node's, or those of a node of a local cluster (`talosctl cluster create`), which
//! the host reaches through init's root: `/proc/<init pid>/root/run/...`. Without those flags
//! every command goes through apid ([`crate::api`]).
//!
//! - `-n/--nodes` names nodes of the talosconfig's context (`--context`, else the current
//!   one) by name or IP; the context's `localCluster` tells where their cluster is;
//! - without `-n`, an explicit `--socket`/`--init-socket` (or `TALOS_SOCKET`,
//!   `TALOS_INIT_SOCKET`) means the local node;
//! - otherwise the context's default `nodes`, if the talosconfig has a local-cluster context;
//! - otherwise the local node's default sockets.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::cluster::record::Cluster;
use crate::talosconfig::TalosConfig;

/// A node to talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `name (ip)` of a cluster node; `None` for the local node.
    pub label: Option<String>,
    /// stated's socket.
    pub state_socket: PathBuf,
    /// init's control socket.
    pub init_socket: PathBuf,
}

/// What [`resolve`] needs from the command line.
#[derive(Clone, Debug)]
pub struct Selection<'a> {
    /// `-n/--nodes`.
    pub nodes: &'a [String],
    /// `--socket`, if given.
    pub socket: Option<&'a Path>,
    /// `--init-socket`, if given.
    pub init_socket: Option<&'a Path>,
    /// The talosconfig file (`None`: there is none, e.g. without `$HOME`).
    pub talosconfig: Option<&'a Path>,
    /// `--context`, if given.
    pub context: Option<&'a str>,
}

/// The local node, with defaults for the sockets not given.
fn local(sel: &Selection<'_>) -> Target {
    Target {
        label: None,
        state_socket: sel
            .socket
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_SOCKET)),
        init_socket: sel
            .init_socket
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(crate::services::DEFAULT_INIT_SOCKET)),
    }
}

/// The nodes a command talks to.
pub fn resolve(sel: &Selection<'_>) -> anyhow::Result<Vec<Target>> {
    if sel.nodes.is_empty() {
        if sel.socket.is_some() || sel.init_socket.is_some() {
            return Ok(vec![local(sel)]);
        }
        let Some(path) = sel.talosconfig else {
            return Ok(vec![local(sel)]);
        };
        let config = TalosConfig::load(path)?;
        if let Ok((_, ctx)) = config.context(sel.context) {
            if ctx.local_cluster.is_some() && !ctx.nodes.is_empty() {
                return cluster_targets(sel, &ctx.nodes);
            }
        }
        return Ok(vec![local(sel)]);
    }
    cluster_targets(sel, sel.nodes)
}

fn cluster_targets(sel: &Selection<'_>, nodes: &[String]) -> anyhow::Result<Vec<Target>> {
    let path = sel
        .talosconfig
        .context("-n needs a talosconfig: give --talosconfig or set $TALOSCONFIG")?;
    let config = TalosConfig::load(path)?;
    let (name, ctx) = config.context(sel.context).with_context(|| {
        format!(
            "-n {}: no talosconfig context to find the nodes in ({}): -n names nodes of a \
             local cluster (talosctl cluster create) on this route (sockets, as root)",
            nodes.join(","),
            path.display()
        )
    })?;
    let Some(dir) = &ctx.local_cluster else {
        anyhow::bail!(
            "-n {}: context {name:?} is not a local cluster: over sockets (--socket, \
             apply-config, patch) -n names a local cluster's nodes",
            nodes.join(",")
        );
    };
    let cluster = Cluster::load(dir).with_context(|| {
        format!(
            "context {name:?}: its cluster ({}) is gone (talosctl cluster create)",
            dir.display()
        )
    })?;
    nodes
        .iter()
        .map(|wanted| {
            let node = cluster.find(wanted).with_context(|| {
                format!(
                    "node {wanted:?} is not in cluster {} (context {name:?}): {}",
                    cluster.name,
                    cluster
                        .nodes
                        .iter()
                        .map(|n| format!("{} ({})", n.name, n.ip))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            let (Some(state_socket), Some(init_socket)) = (
                node.path_in_node(crate::DEFAULT_SOCKET),
                node.path_in_node(crate::services::DEFAULT_INIT_SOCKET),
            ) else {
                anyhow::bail!(
                    "node {} is not running (talosctl cluster show --name {})",
                    node.name,
                    cluster.name
                );
            };
            Ok(Target {
                label: Some(format!("{} ({})", node.name, node.ip)),
                state_socket,
                init_socket,
            })
        })
        .collect()
}
