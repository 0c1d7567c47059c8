//! `talosctl`, the talos-rs command-line client.
//!
//! `version` goes through apid ([`api`]); the other commands still reach nodes through their Unix sockets: the local node's (`--socket`,
//! `--init-socket`), or, with `-n`, the nodes of a local cluster named in the talosconfig
//! ([`target`]). Commands:
//! - [`get`]: read, list or watch resources of any type, rendered as a table, YAML or JSON;
//! - [`validate`]: check a machine configuration file offline;
//! - [`machineconfig`]: patch a machine configuration file locally;
//! - [`apply`]: `apply-config` and `patch machineconfig` on a node (validated, diffed, CAS);
//! - [`inspect`]: the controller dependency graph of the node;
//! - [`services`], [`logs`], [`power`]: daemons and services, their output, shutdown and reboot,
//!   through init's control socket;
//! - [`audit`]: the observed sandbox of every daemon and its exposure score;
//! - [`cluster`]: local clusters of nodes in namespaces (`cluster create|show|destroy`);
//! - [`talosconfig`]: the talosconfig file and its contexts (`config contexts|context|info`);
//! - [`gen`]: secrets bundles, machine configurations and talosconfigs (`gen secrets|config`);
//! - [`version`]: the client's and each node's version, through apid ([`api`]: mutual TLS with
//!   the talosconfig's credentials).
//!
//! `main.rs` only parses arguments and maps [`run`]'s outcome to an exit code with [`exit_code`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

pub mod api;
pub mod apply;
pub mod audit;
pub mod cluster;
pub mod files;
pub mod gen;
pub mod get;
pub mod inspect;
pub mod jsonpath;
pub mod logs;
pub mod machineconfig;
pub mod output;
pub mod power;
pub mod resolve;
pub mod services;
pub mod talosconfig;
pub mod target;
pub mod validate;
pub mod version;

/// Where stated listens on a node.
pub const DEFAULT_SOCKET: &str = "/run/stated/state.sock";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "talosctl",
    version,
    about = "A CLI for talos-rs nodes: read their resources, validate and patch machine configurations.",
    long_about = "A CLI for talos-rs nodes: read their resources, validate and patch machine configurations.\n\n\
                  `version` goes through the Talos API (apid, mutual TLS with the talosconfig's\n\
                  credentials). The other commands still talk to nodes over their Unix sockets: the\n\
                  local node's (--socket, --init-socket), or with -n the nodes of a local cluster\n\
                  (talosctl cluster create) found through the talosconfig; they need root (or\n\
                  another user stated lets read).",
    propagate_version = true
)]
pub struct Cli {
    /// Unix socket of the local stated [default: /run/stated/state.sock]. Given (or
    /// TALOS_SOCKET set), it wins over the talosconfig's default nodes.
    #[arg(long, global = true, env = "TALOS_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Unix socket of the local init's control API, root only [default: /run/init/init.sock].
    #[arg(long, global = true, env = "TALOS_INIT_SOCKET", value_name = "PATH")]
    pub init_socket: Option<PathBuf>,

    /// Target nodes (comma-separated) [default: the talosconfig context's nodes]. Commands
    /// through apid (`version`) send them to the endpoint, whose apid forwards to each node:
    /// IP addresses, or names of the context's local cluster's nodes. The other commands
    /// reach nodes of the context's local cluster (names or IPs) from this host, as root
    /// [their default: the local node].
    #[arg(
        short = 'n',
        long,
        global = true,
        value_delimiter = ',',
        value_name = "NODES"
    )]
    pub nodes: Vec<String>,

    /// Talos API endpoints (comma-separated `host[:port]`, port 50000 by default) for the
    /// commands that go through apid (`version`): calls go to the first [default: the
    /// talosconfig context's]. With `-e` and no `-n`, the endpoint answers for itself.
    #[arg(
        short = 'e',
        long,
        global = true,
        value_delimiter = ',',
        value_name = "ENDPOINTS"
    )]
    pub endpoints: Vec<String>,

    /// The talosconfig file [default: $TALOS_HOME/config, else ~/.talos/config].
    #[arg(long, global = true, env = "TALOSCONFIG", value_name = "PATH")]
    pub talosconfig: Option<PathBuf>,

    /// The talosconfig context to use [default: its current context].
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Get a resource or list resources of a type, optionally watching for changes.
    #[command(
        visible_alias = "g",
        long_about = get::LONG_ABOUT,
        after_long_help = get::EXAMPLES
    )]
    Get(get::GetArgs),

    /// Validate a machine configuration file (offline).
    #[command(long_about = validate::LONG_ABOUT)]
    Validate(validate::ValidateArgs),

    /// Work with machine configuration files locally.
    #[command(subcommand, visible_alias = "mc")]
    Machineconfig(machineconfig::Command),

    /// Inspect the internals of the node (controller dependencies).
    #[command(subcommand)]
    Inspect(inspect::Command),

    /// List the daemons and requested services of the node (init's view).
    Services,

    /// Show, start, stop or restart one daemon or service.
    Service(services::ServiceArgs),

    /// Print the output of a daemon or service (init's in-memory ring buffer).
    Logs(logs::LogsArgs),

    /// Audit the observed sandbox of every daemon (exposure on the systemd-analyze model).
    Audit(audit::AuditArgs),

    /// Stop every daemon in reverse dependency order and power the node off.
    Shutdown,

    /// Stop every daemon in reverse dependency order and reboot the node.
    Reboot,

    /// Apply a new machine configuration to a node (validated, diffed; `--dry-run`).
    #[command(visible_alias = "apply")]
    ApplyConfig(apply::ApplyArgs),

    /// Patch a node's machine configuration (`patch machineconfig -p @patch.yaml`).
    Patch(apply::PatchArgs),

    /// Create, show and destroy local clusters of nodes in namespaces on this host.
    #[command(subcommand)]
    Cluster(cluster::Command),

    /// The talosconfig file: contexts.
    #[command(subcommand)]
    Config(talosconfig::Command),

    /// Generate secrets bundles, machine configurations and talosconfigs (offline).
    #[command(subcommand)]
    Gen(gen::Command),

    /// Print the client's version and each node's, through the Talos API (apid, mutual TLS
    /// with the talosconfig context's ca, crt and key).
    Version(version::VersionArgs),
}

/// Runs a parsed command line, printing results to standard output.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match &cli.command {
        Command::Get(args) => each_node(&cli, &mut out, |t, out| {
            block_on(get::run(&t.state_socket, args, out))
        }),
        Command::Inspect(cmd) => each_node(&cli, &mut out, |t, out| {
            let mut out = out;
            block_on(inspect::run(&t.state_socket, cmd, &mut out))
        }),
        Command::Services => each_node(&cli, &mut out, |t, out| {
            block_on(services::list(&t.init_socket, out))
        }),
        Command::Service(args) => each_node(&cli, &mut out, |t, out| {
            block_on(services::service(&t.init_socket, args, out))
        }),
        Command::Logs(args) => each_node(&cli, &mut out, |t, out| {
            block_on(logs::run(&t.init_socket, args, out))
        }),
        Command::Audit(args) => each_node(&cli, &mut out, |t, out| {
            block_on(audit::run(&t.init_socket, args, out))
        }),
        Command::Shutdown => each_node(&cli, &mut out, |t, out| {
            block_on(power::run(&t.init_socket, false, out))
        }),
        Command::Reboot => each_node(&cli, &mut out, |t, out| {
            block_on(power::run(&t.init_socket, true, out))
        }),
        Command::ApplyConfig(args) => each_node(&cli, &mut out, |t, out| {
            block_on(apply::apply(&t.state_socket, args, out))
        }),
        Command::Patch(args) => each_node(&cli, &mut out, |t, out| {
            block_on(apply::patch(&t.state_socket, args, out))
        }),
        Command::Cluster(cmd) => {
            let path = talosconfig::path(cli.talosconfig.as_deref())?;
            cluster::run(cmd, &path, &mut out)
        }
        Command::Config(cmd) => {
            let path = talosconfig::path(cli.talosconfig.as_deref())?;
            talosconfig::run(cmd, &path, cli.context.as_deref(), &mut out)
        }
        Command::Validate(args) => validate::run(args, &mut out),
        Command::Gen(cmd) => gen::run(cmd, &mut out),
        Command::Machineconfig(cmd) => machineconfig::run(cmd, &mut out),
        Command::Version(args) => {
            version::client(args, &mut out)?;
            if args.client {
                Ok(())
            } else {
                let path = talosconfig::path(cli.talosconfig.as_deref())?;
                let api = api::resolve(&api::Selection {
                    endpoints: &cli.endpoints,
                    nodes: &cli.nodes,
                    talosconfig: &path,
                    context: cli.context.as_deref(),
                })?;
                block_on(version::servers(&api, args, &mut out))
            }
        }
    }?;
    out.flush()?;
    Ok(())
}

/// Runs `f` for every target node ([`target::resolve`]); with several, each node's output
/// follows a `node: <name> (<ip>)` line, and errors are collected as `<node>: <error>`.
fn each_node(
    cli: &Cli,
    out: &mut dyn Write,
    mut f: impl FnMut(&target::Target, &mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    // Without $HOME there is no default talosconfig: fine unless -n needs one.
    let path = talosconfig::path(cli.talosconfig.as_deref());
    let path = match (path, cli.nodes.is_empty()) {
        (Ok(p), _) => Some(p),
        (Err(_), true) => None,
        (Err(e), false) => return Err(e),
    };
    let targets = target::resolve(&target::Selection {
        nodes: &cli.nodes,
        socket: cli.socket.as_deref(),
        init_socket: cli.init_socket.as_deref(),
        talosconfig: path.as_deref(),
        context: cli.context.as_deref(),
    })?;
    if let [one] = targets.as_slice() {
        return f(one, out);
    }
    let mut errors = Vec::new();
    for t in &targets {
        let label = t.label.clone().unwrap_or_else(|| "local".into());
        writeln!(out, "node: {label}")?;
        if let Err(e) = f(t, out) {
            errors.push(format!("{label}: {}", cosi::error::Chain(e.as_ref())));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("\n"))
    }
}

/// Runs a command that talks to stated on a single-threaded async runtime.
fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(f)
}

/// Starts logging to standard error, at `warn` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Maps the outcome of [`run`] to the exit code, printing the error: 0 ok, 1 error (clap exits
/// with 2 on usage errors before this). A closed standard output (`talosctl get … | head`) is
/// not an error.
pub fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    let Err(e) = result else {
        return ExitCode::SUCCESS;
    };
    let broken_pipe = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    eprintln!("error: {}", cosi::error::Chain(e.as_ref()));
    ExitCode::FAILURE
}
