//! `talosctl inspect dependencies`: the controllers of every daemon of the node and the resource
//! types they read and write, as Graphviz dot. Each daemon's runtime publishes its graph as a
//! `DependencyGraphs.cosi.talos.dev` resource in a namespace it writes; this collects them all.

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use cosi::runtime::DependencyGraph;
use cosi::{NamespaceSpec, ResourceSpec};

/// `inspect` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the controller ↔ resource dependency graph of the node as Graphviz dot
    /// (render with `talosctl inspect dependencies | dot -Tpng > deps.png`).
    Dependencies(DependenciesArgs),
}

/// Arguments of `inspect dependencies`.
#[derive(Debug, Args)]
pub struct DependenciesArgs {
    /// Only the controllers of this daemon (e.g. networkd).
    #[arg(long, value_name = "DAEMON")]
    pub daemon: Option<String>,
}

/// Runs an `inspect` command.
pub async fn run(socket: &Path, cmd: &Command, out: &mut impl Write) -> anyhow::Result<()> {
    let client = cosi::Client::new(socket)?;
    run_on(&client, cmd, out).await
}

/// Runs an `inspect` command against a State API (stated's socket, or apid's).
pub async fn run_on(
    client: &cosi::Client,
    cmd: &Command,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let Command::Dependencies(args) = cmd;
    let namespaces = client
        .list("meta", NamespaceSpec::TYPE, &cosi::Query::default())
        .await
        .with_context(|| format!("cannot list namespaces from {}", client.peer()))?;
    let mut graph = DependencyGraph::default();
    let mut daemons = Vec::new();
    for ns in namespaces {
        let ns = ns.metadata.id;
        let graphs = match client
            .list(&ns, DependencyGraph::TYPE, &cosi::Query::default())
            .await
        {
            Ok(g) => g,
            // Namespaces this user may not read hold no graph it may see.
            Err(e) if e.kind() == cosi::ErrorKind::PermissionDenied => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot list dependency graphs in {ns}"))
            }
        };
        for g in graphs {
            if args.daemon.as_deref().is_some_and(|d| d != g.metadata.id) {
                continue;
            }
            let spec: DependencyGraph =
                cosi::resource::decode_spec(&g.spec).with_context(|| {
                    format!(
                        "dependency graph of {} in {ns} does not decode",
                        g.metadata.id
                    )
                })?;
            daemons.push(g.metadata.id.clone());
            graph.extend(spec);
        }
    }
    if let Some(d) = &args.daemon {
        anyhow::ensure!(
            daemons.iter().any(|x| x == d),
            "no dependency graph published by daemon {d:?}"
        );
    }
    out.write_all(graph.to_dot().as_bytes())?;
    Ok(())
}
