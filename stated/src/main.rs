//! stated: the resource broker of a talos-rs node (the logic is in the library).

use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon, Notifier, EX_CONFIG};

/// stated: the talos-rs resource broker (COSI State API on a Unix socket).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Unix socket to listen on.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// Directory for durable namespaces (survive reboot).
    #[arg(long, default_value = "/system/state")]
    state_dir: PathBuf,
    /// Directory for the run state (survives a restart of stated) [default: <state-dir>/run in
    /// standalone mode, /run/stated with --manifest].
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// The daemon manifest (node mode). Without it only uid 0 may connect.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Events kept per resource kind for watches to resume from.
    #[arg(long, default_value_t = stated::store::DEFAULT_HISTORY)]
    history: usize,
    /// Readiness: write `READY=1\n` to this fd and close it once the socket accepts requests
    /// (init passes the write end of a pipe, as s6's notification-fd).
    #[arg(long, value_name = "FD")]
    notify_fd: Option<RawFd>,
    /// Serve on this already listening Unix socket instead of binding --socket (init holds the
    /// socket across restarts of stated, so clients never see it missing).
    #[arg(long, value_name = "FD")]
    listen_fd: Option<RawFd>,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info` or `stated=debug`); `RUST_LOG`
    /// wins when set.
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let d = match Daemon::start("stated", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let manifest = match args
        .manifest
        .as_deref()
        .map(stated::Manifest::load_substituted)
        .transpose()
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("stated: {}", cosi::error::Chain(&e));
            return ExitCode::from(EX_CONFIG);
        }
    };
    let run_dir = args.run_dir.unwrap_or_else(|| {
        if manifest.is_some() {
            PathBuf::from("/run/stated")
        } else {
            args.state_dir.join("run")
        }
    });
    let config = stated::Config {
        socket: args.socket,
        state_dir: args.state_dir,
        run_dir,
        manifest,
        history: args.history,
        limits: stated::store::Limits::default(),
        peer_limits: stated::server::PeerLimits::default(),
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let listen = match d.take_fd(args.listen_fd) {
        Ok(l) => l,
        Err(code) => return code,
    };
    d.run(None, run(config, notify, listen))
}

/// `stated::run`, with the socket possibly handed over by init and readiness reported once it
/// listens.
async fn run(
    config: stated::Config,
    notify: Notifier,
    listen: Option<OwnedFd>,
) -> Result<(), stated::Error> {
    let store = Arc::new(stated::open_store(&config)?);
    let listener = match listen {
        Some(fd) => {
            let std_listener = std::os::unix::net::UnixListener::from(fd);
            let listen_error = |source| stated::Error::Listen {
                path: config.socket.clone(),
                source,
            };
            std_listener.set_nonblocking(true).map_err(listen_error)?;
            tokio::net::UnixListener::from_std(std_listener).map_err(listen_error)?
        }
        None => stated::bind(&config.socket)?,
    };
    tracing::info!(
        socket = %config.socket.display(),
        resources = store.len(),
        mode = if config.manifest.is_some() { "node" } else { "standalone" },
        "stated ready"
    );
    notify.ready();
    stated::serve(store, &config, listener, async {
        shutdown_signal().await;
        tracing::info!("stated stopping");
    })
    .await
}
