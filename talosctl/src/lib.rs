//! `talosctl`, the talos-rs command-line client.
//!
//! For now it reaches the local `stated` over its Unix socket (`--socket`); remote nodes come with
//! apid. Commands:
//! - [`get`]: read, list or watch resources of any type, rendered as a table, YAML or JSON;
//! - [`validate`]: check a machine configuration file offline;
//! - [`machineconfig`]: patch a machine configuration file locally;
//! - [`inspect`]: the controller dependency graph of the node;
//! - [`services`], [`logs`], [`power`]: daemons and services, their output, shutdown and reboot,
//!   through init's control socket (`--init-socket`);
//! - [`audit`]: the observed sandbox of every daemon and its exposure score.
//!
//! `main.rs` only parses arguments and maps [`run`]'s outcome to an exit code with [`exit_code`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

pub mod audit;
pub mod get;
pub mod inspect;
pub mod jsonpath;
pub mod logs;
pub mod machineconfig;
pub mod output;
pub mod power;
pub mod resolve;
pub mod services;
pub mod validate;

/// Where stated listens on a node.
pub const DEFAULT_SOCKET: &str = "/run/stated/state.sock";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "talosctl",
    version,
    about = "A CLI for talos-rs nodes: read their resources, validate and patch machine configurations.",
    long_about = "A CLI for talos-rs nodes: read their resources, validate and patch machine configurations.\n\n\
                  This version talks to the stated of the local node over its Unix socket (--socket);\n\
                  it needs to run as root (or another user stated lets read). Remote nodes need apid,\n\
                  which is not available yet.",
    propagate_version = true
)]
pub struct Cli {
    /// Unix socket of the local stated.
    #[arg(
        long,
        global = true,
        env = "TALOS_SOCKET",
        default_value = DEFAULT_SOCKET,
        value_name = "PATH"
    )]
    pub socket: PathBuf,

    /// Unix socket of the local init's control API (root only).
    #[arg(
        long,
        global = true,
        env = "TALOS_INIT_SOCKET",
        default_value = services::DEFAULT_INIT_SOCKET,
        value_name = "PATH"
    )]
    pub init_socket: PathBuf,

    /// Target nodes (comma-separated). Reserved: reaching remote nodes needs apid, which is not
    /// available yet, so commands that talk to a node refuse this flag for now.
    #[arg(
        short = 'n',
        long,
        global = true,
        value_delimiter = ',',
        value_name = "NODES"
    )]
    pub nodes: Vec<String>,

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
}

/// Runs a parsed command line, printing results to standard output.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match &cli.command {
        Command::Get(args) => {
            refuse_nodes(&cli.nodes)?;
            block_on(get::run(&cli.socket, args, &mut out))
        }
        Command::Inspect(cmd) => {
            refuse_nodes(&cli.nodes)?;
            block_on(inspect::run(&cli.socket, cmd, &mut out))
        }
        Command::Services => {
            refuse_nodes(&cli.nodes)?;
            block_on(services::list(&cli.init_socket, &mut out))
        }
        Command::Service(args) => {
            refuse_nodes(&cli.nodes)?;
            block_on(services::service(&cli.init_socket, args, &mut out))
        }
        Command::Logs(args) => {
            refuse_nodes(&cli.nodes)?;
            block_on(logs::run(&cli.init_socket, args, &mut out))
        }
        Command::Audit(args) => {
            refuse_nodes(&cli.nodes)?;
            block_on(audit::run(&cli.socket, args, &mut out))
        }
        Command::Shutdown => {
            refuse_nodes(&cli.nodes)?;
            block_on(power::run(&cli.init_socket, false, &mut out))
        }
        Command::Reboot => {
            refuse_nodes(&cli.nodes)?;
            block_on(power::run(&cli.init_socket, true, &mut out))
        }
        Command::Validate(args) => validate::run(args, &mut out),
        Command::Machineconfig(cmd) => machineconfig::run(cmd, &mut out),
    }?;
    out.flush()?;
    Ok(())
}

/// Runs a command that talks to stated on a single-threaded async runtime.
fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(f)
}

fn refuse_nodes(nodes: &[String]) -> anyhow::Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "-n/--nodes {}: remote nodes need apid, not yet available; \
         talosctl reads only the local stated (--socket) for now",
        nodes.join(",")
    )
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
