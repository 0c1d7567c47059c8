//! `talosctl`, the talos-rs command-line client.
//!
//! `get`, `inspect`, `services`, `service`, `logs`, `audit`, `reboot`, `shutdown` and `version` go
//! through the Talos API ([`api`], [`remote`]): one endpoint, the nodes as metadata. With
//! `--socket`/`--init-socket` (development) they, and always `apply-config` and `patch`
//! (whose Talos API call is not there yet), reach nodes through their Unix sockets: the
//! local node's, or with `-n` the nodes of a local cluster named in the talosconfig
//! ([`target`]). Commands:
//! - [`get`]: read, list or watch resources of any type, rendered as a table, YAML or JSON;
//! - [`validate`]: check a machine configuration file offline;
//! - [`machineconfig`]: patch a machine configuration file locally;
//! - [`apply`]: `apply-config` and `patch machineconfig` on a node (validated, diffed, CAS);
//! - [`inspect`]: the controller dependency graph of the node;
//! - [`services`], [`logs`], [`power`]: daemons and services, their output, shutdown and reboot,
//!   through init's control socket ([`remote`]: the same through apid);
//! - [`audit`]: the observed sandbox of every daemon and its exposure score;
//! - [`cluster`]: local clusters of nodes in namespaces (`cluster create|show|destroy`);
//! - [`talosconfig`]: the talosconfig file and its contexts (`config contexts|context|info|
//!   endpoint|node|add|remove|merge`; `config new` through the Talos API);
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
pub mod health;
pub mod inspect;
pub mod jsonpath;
pub mod kubeconfig;
pub mod logs;
pub mod machineconfig;
pub mod output;
pub mod power;
pub mod remote;
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
    about = "A CLI for talos-rs nodes: read their resources, manage their services, validate and patch machine configurations.",
    long_about = "A CLI for talos-rs nodes: read their resources, manage their services, validate and patch machine configurations.\n\n\
                  get, inspect, services, service, logs, audit, reboot, shutdown and version go through\n\
                  the Talos API (apid on TCP 50000, mutual TLS with the talosconfig's ca, crt and key): to\n\
                  the first endpoint, for each of the nodes (-n, else the context's).\n\n\
                  For development, --socket / --init-socket talk to Unix sockets instead: the local\n\
                  node's, or with -n the nodes of a local cluster through /proc (root). apply-config\n\
                  and patch still take that route (their Talos API call is not there yet).",
    propagate_version = true
)]
pub struct Cli {
    /// Development: talk to stated over this Unix socket instead of the Talos API (or, with
    /// -n, to each local-cluster node's own socket through /proc; root) [default for the
    /// commands that always do (apply-config, patch): /run/stated/state.sock].
    #[arg(long, global = true, env = "TALOS_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Development: talk to init's control socket instead of the Talos API, root only (or,
    /// with -n, each local-cluster node's own) [default: /run/init/init.sock].
    #[arg(long, global = true, env = "TALOS_INIT_SOCKET", value_name = "PATH")]
    pub init_socket: Option<PathBuf>,

    /// Target nodes (comma-separated) [default: the talosconfig context's nodes]: IP
    /// addresses, or names of the context's local cluster's nodes. Through the Talos API each
    /// node is called through the endpoint, whose apid forwards the call (`node` metadata;
    /// `version` sends them all at once as `nodes`). Over sockets (--socket, apply-config,
    /// patch) they name nodes of the context's local cluster, reached from this host as
    /// root [default there: the local node].
    #[arg(
        short = 'n',
        long,
        global = true,
        value_delimiter = ',',
        value_name = "NODES"
    )]
    pub nodes: Vec<String>,

    /// Talos API endpoints (comma-separated `host[:port]`, port 50000 by default): calls go
    /// to the first [default: the talosconfig context's]. With `-e` and no `-n`, the endpoint
    /// answers for itself.
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

    /// Print the node's kernel log (a container-mode node of a local cluster has none of its
    /// own and says so).
    Dmesg(remote::DmesgArgs),

    /// List the node's mounted filesystems: size, used and available space (statfs), as init
    /// sees the node's mount namespace.
    #[command(visible_alias = "mount")]
    Mounts,

    /// List the node's disks as blockd describes them (upstream's `disks`: storage.Disks).
    Disks(remote::DisksArgs),

    /// Audit the observed sandbox of every daemon (exposure on the systemd-analyze model).
    Audit(audit::AuditArgs),

    /// Stop every daemon in reverse dependency order and power the node off.
    Shutdown,

    /// Stop every daemon in reverse dependency order and reboot the node.
    Reboot,

    /// Bootstrap etcd on one control plane node: it starts a new cluster of itself (the
    /// others join it). Refused (AlreadyExists) on a node that holds etcd data. Through the
    /// Talos API only.
    Bootstrap(remote::BootstrapArgs),

    /// etcd on control plane nodes: `members`, `status`, `snapshot`, `remove-member`, `leave`,
    /// `forfeit-leadership`, `defrag`, `alarm list|disarm`. Through the Talos API only.
    #[command(subcommand)]
    Etcd(remote::EtcdCommand),

    /// Download an admin kubeconfig from a control plane node (its certificate signed by the
    /// Kubernetes CA) and merge it into ~/.kube/config (or $KUBECONFIG, or PATH). Through the
    /// Talos API only.
    Kubeconfig(kubeconfig::KubeconfigArgs),

    /// Check the cluster's health from here (-n: every node to check): apid, every node's
    /// daemons, etcd healthy with the control planes as its voting members, the control plane's
    /// static pods. Progress lines as upstream's; a non-zero exit when a check does not pass
    /// within --wait-timeout. Through the Talos API only.
    Health(health::HealthArgs),

    /// Apply a new machine configuration to a node (validated, diffed; `--dry-run`).
    #[command(visible_alias = "apply")]
    ApplyConfig(apply::ApplyArgs),

    /// Patch a node's machine configuration (`patch machineconfig -p @patch.yaml`).
    Patch(apply::PatchArgs),

    /// Create, show and destroy local clusters of nodes in namespaces on this host.
    #[command(subcommand)]
    Cluster(cluster::Command),

    /// Manage the client configuration file (talosconfig): contexts, endpoints, nodes, new
    /// client certificates.
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
        Command::Get(args) if args.insecure => {
            let targets = insecure_targets(&cli, "get")?;
            block_on(async {
                // Channels are made inside the runtime (they spawn their connection tasks).
                let mut sources = Vec::new();
                for t in targets {
                    sources.extend(api::Api::insecure(t, &[])?.state_sources()?);
                }
                get::run_on(&sources, args, &mut out).await
            })
        }
        Command::Get(args) if !over_sockets(&cli) => {
            let api = api(&cli)?;
            block_on(async { get::run_on(&api.state_sources()?, args, &mut out).await })
        }
        Command::Get(args) => each_node(&cli, &mut out, |t, out| {
            block_on(get::run(&t.state_socket, args, out))
        }),
        Command::Inspect(cmd) if !over_sockets(&cli) => {
            let api = api(&cli)?;
            let sources = api.state_sources()?;
            let several = sources.len() > 1;
            let mut errors = Vec::new();
            for s in sources {
                let label = s.node.clone().unwrap_or_default();
                if several {
                    writeln!(out, "node: {label}")?;
                }
                if let Err(e) = block_on(inspect::run_on(&s.client, cmd, &mut out)) {
                    errors.push(format!("{label}: {}", cosi::error::Chain(e.as_ref())));
                }
            }
            if errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{}", errors.join("\n")))
            }
        }
        Command::Inspect(cmd) => each_node(&cli, &mut out, |t, out| {
            let mut out = out;
            block_on(inspect::run(&t.state_socket, cmd, &mut out))
        }),
        Command::Disks(args) => block_on(async {
            if !args.insecure {
                return remote::disks(&api(&cli)?, &mut out).await;
            }
            for t in insecure_targets(&cli, "disks")? {
                remote::disks(&api::Api::insecure(t, &[])?, &mut out).await?;
            }
            Ok(())
        }),
        Command::Mounts if !over_sockets(&cli) => {
            block_on(async { remote::mounts(&api(&cli)?, &mut out).await })
        }
        Command::Mounts => each_node(&cli, &mut out, |t, out| {
            block_on(logs::mounts(
                &t.init_socket,
                t.label.as_deref().unwrap_or("local"),
                out,
            ))
        }),
        Command::Services if !over_sockets(&cli) => {
            block_on(async { remote::services(&api(&cli)?, &mut out).await })
        }
        Command::Services => each_node(&cli, &mut out, |t, out| {
            block_on(services::list(&t.init_socket, out))
        }),
        Command::Service(args) if !over_sockets(&cli) => {
            block_on(async { remote::service(&api(&cli)?, args, &mut out).await })
        }
        Command::Service(args) => each_node(&cli, &mut out, |t, out| {
            block_on(services::service(&t.init_socket, args, out))
        }),
        Command::Logs(args) if !over_sockets(&cli) => {
            block_on(async { remote::logs(&api(&cli)?, args, &mut out).await })
        }
        Command::Logs(args) => each_node(&cli, &mut out, |t, out| {
            block_on(logs::run(&t.init_socket, args, out))
        }),
        Command::Dmesg(args) if !over_sockets(&cli) => {
            block_on(async { remote::dmesg(&api(&cli)?, args, &mut out).await })
        }
        Command::Dmesg(args) => each_node(&cli, &mut out, |t, out| {
            block_on(logs::dmesg(&t.init_socket, args, out))
        }),
        Command::Audit(args) if !over_sockets(&cli) => {
            block_on(async { audit::run_api(&api(&cli)?, args, &mut out).await })
        }
        Command::Audit(args) => each_node(&cli, &mut out, |t, out| {
            block_on(audit::run(&t.init_socket, args, out))
        }),
        Command::Shutdown if !over_sockets(&cli) => {
            block_on(async { remote::power(&api(&cli)?, false, &mut out).await })
        }
        Command::Reboot if !over_sockets(&cli) => {
            block_on(async { remote::power(&api(&cli)?, true, &mut out).await })
        }
        Command::Bootstrap(args) if !over_sockets(&cli) => {
            block_on(async { remote::bootstrap(&api(&cli)?, args, &mut out).await })
        }
        Command::Etcd(cmd) if !over_sockets(&cli) => {
            block_on(async { remote::etcd(&api(&cli)?, cmd, &mut out).await })
        }
        Command::Kubeconfig(args) if !over_sockets(&cli) => {
            block_on(async { kubeconfig::run(&api(&cli)?, args, &mut out).await })
        }
        Command::Health(args) if !over_sockets(&cli) => {
            block_on(async { health::run(&api(&cli)?, args, &mut out).await })
        }
        Command::Health(_) => Err(anyhow::anyhow!(
            "health goes through the Talos API (apid): drop --socket/--init-socket"
        )),
        Command::Kubeconfig(_) => Err(anyhow::anyhow!(
            "kubeconfig goes through the Talos API (apid): drop --socket/--init-socket"
        )),
        Command::Etcd(_) => Err(anyhow::anyhow!(
            "etcd goes through the Talos API (apid): drop --socket/--init-socket"
        )),
        Command::Bootstrap(_) => Err(anyhow::anyhow!(
            "bootstrap goes through the Talos API (apid): drop --socket/--init-socket"
        )),
        Command::Shutdown => each_node(&cli, &mut out, |t, out| {
            block_on(power::run(&t.init_socket, false, out))
        }),
        Command::Reboot => each_node(&cli, &mut out, |t, out| {
            block_on(power::run(&t.init_socket, true, out))
        }),
        Command::ApplyConfig(args) if args.insecure => {
            let targets = insecure_targets(&cli, "apply-config")?;
            let mut errors = Vec::new();
            for t in targets {
                let done = api::Api::insecure(t, &args.cert_fingerprint).and_then(|api| {
                    block_on(apply::run_api(&api, apply::Change::Apply(args), &mut out))
                });
                if let Err(e) = done {
                    errors.push(format!("{e:#}"));
                }
            }
            if errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{}", errors.join("\n")))
            }
        }
        Command::ApplyConfig(args) if !over_sockets(&cli) => block_on(async {
            apply::run_api(&api(&cli)?, apply::Change::Apply(args), &mut out).await
        }),
        Command::Patch(args) if !over_sockets(&cli) => block_on(async {
            apply::run_api(&api(&cli)?, apply::Change::Patch(args), &mut out).await
        }),
        Command::ApplyConfig(args) => each_node(&cli, &mut out, |t, out| {
            block_on(apply::run_sockets(t, apply::Change::Apply(args), out))
        }),
        Command::Patch(args) => each_node(&cli, &mut out, |t, out| {
            block_on(apply::run_sockets(t, apply::Change::Patch(args), out))
        }),
        Command::Cluster(cmd) => {
            let path = talosconfig::path(cli.talosconfig.as_deref())?;
            cluster::run(cmd, &path, &mut out)
        }
        Command::Config(talosconfig::Command::New(args)) => {
            let api = api(&cli)?;
            let endpoints = if cli.endpoints.is_empty() {
                let path = talosconfig::path(cli.talosconfig.as_deref())?;
                let config = talosconfig::TalosConfig::load(&path)?;
                config.context(cli.context.as_deref())?.1.endpoints.clone()
            } else {
                cli.endpoints.clone()
            };
            block_on(talosconfig::new(&api, args, endpoints, &mut out))
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
                let api = api(&cli)?;
                block_on(version::servers(&api, args, &mut out))
            }
        }
    }?;
    out.flush()?;
    Ok(())
}

/// Whether the command talks to Unix sockets (`--socket` or `--init-socket` given, or their
/// environment variables) instead of the Talos API.
/// The nodes an `--insecure` (maintenance API) command talks to: the endpoints, else the nodes.
fn insecure_targets<'a>(cli: &'a Cli, command: &str) -> anyhow::Result<&'a [String]> {
    let targets = if cli.endpoints.is_empty() {
        &cli.nodes
    } else {
        &cli.endpoints
    };
    if targets.is_empty() {
        anyhow::bail!("{command} --insecure needs the node's address: -n <ip> (or -e <ip[:port]>)");
    }
    Ok(targets)
}

fn over_sockets(cli: &Cli) -> bool {
    cli.socket.is_some() || cli.init_socket.is_some()
}

/// The Talos API endpoint and nodes of the command line and the talosconfig.
fn api(cli: &Cli) -> anyhow::Result<api::Api> {
    let path = talosconfig::path(cli.talosconfig.as_deref()).context(
        "the Talos API needs a talosconfig (--talosconfig, $TALOSCONFIG); --socket talks to a \
         local stated instead",
    )?;
    api::resolve(&api::Selection {
        endpoints: &cli.endpoints,
        nodes: &cli.nodes,
        talosconfig: &path,
        context: cli.context.as_deref(),
    })
    .map_err(|e| {
        e.context(
            "cannot reach the Talos API (for development, --socket talks to a stated socket \
             instead)",
        )
    })
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
