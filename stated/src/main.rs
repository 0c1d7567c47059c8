use std::io::Write as _;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

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
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let manifest = match args
        .manifest
        .as_deref()
        .map(stated::Manifest::load_substituted)
        .transpose()
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("stated: {}", cosi::error::Chain(&e));
            return ExitCode::from(78);
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
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stated: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (notify, listen) = match (take_fd(args.notify_fd), take_fd(args.listen_fd)) {
        (Ok(n), Ok(l)) => (n, l),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("stated: {e}");
            return ExitCode::from(78);
        }
    };
    match rt.block_on(run(config, notify, listen)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stated: {}", cosi::error::Chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Takes ownership of an fd number given on the command line, after checking it is open and
/// not stdio.
fn take_fd(fd: Option<RawFd>) -> Result<Option<OwnedFd>, String> {
    let Some(fd) = fd else { return Ok(None) };
    if fd < 3 {
        return Err(format!("fd {fd} is stdio, not a passed fd"));
    }
    // SAFETY: borrowed only for the F_GETFD query below; a closed fd fails it with EBADF.
    #[allow(unsafe_code)]
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    if nix::fcntl::fcntl(borrowed, nix::fcntl::FcntlArg::F_GETFD).is_err() {
        return Err(format!("fd {fd} is not open"));
    }
    // SAFETY: the fd is open (checked above), was passed by the parent for this process alone,
    // and is owned from here on: nothing else in stated uses that number.
    #[allow(unsafe_code)]
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(Some(owned))
}

/// `stated::run`, with the socket possibly handed over by init and readiness reported once it
/// listens.
async fn run(
    config: stated::Config,
    notify: Option<OwnedFd>,
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
    if let Some(fd) = notify {
        // A reader that went away is init's business; stated serves regardless.
        let _ = std::fs::File::from(fd).write_all(b"READY=1\n");
    }
    stated::serve(store, &config, listener, shutdown()).await
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stated stopping");
}
