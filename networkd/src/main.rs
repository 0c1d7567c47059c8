//! networkd: the network daemon of a talos-rs node (the logic is in the library).

use std::io::Write as _;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// networkd: links, addresses, routes, hostname, resolvers, DHCP and node addresses, from the
/// machine config to the kernel, through stated.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// stated's Unix socket.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// Root under which etc/resolv.conf, etc/hosts and etc/hostname are written.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info` or `networkd=debug`); `RUST_LOG`
    /// wins when set.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Readiness: write `READY=1\n` to this fd and close it once the resource definitions are
    /// written to stated (its first answer), before the controllers start (init passes the
    /// write end of a pipe, as s6's notification-fd).
    #[arg(long, value_name = "FD")]
    notify_fd: Option<RawFd>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log_level));
    let filter = match filter {
        Ok(f) => f,
        Err(e) => {
            eprintln!("networkd: invalid --log-level {:?}: {e}", args.log_level);
            return ExitCode::from(78);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let notify = match take_fd(args.notify_fd) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("networkd: {e}");
            return ExitCode::from(78);
        }
    };
    let config = networkd::run::Config {
        socket: args.socket,
        etc_root: args.root,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("networkd: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ready = move || {
        if let Some(fd) = notify {
            // A reader that went away is init's business; networkd runs regardless.
            let _ = std::fs::File::from(fd).write_all(b"READY=1\n");
        }
    };
    match rt.block_on(networkd::run::run(config, ready, shutdown())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("networkd: {}", cosi::error::Chain(&e));
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
    // and is owned from here on: nothing else in networkd uses that number.
    #[allow(unsafe_code)]
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(Some(owned))
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => {
            // Without signal handlers, Ctrl-C is all we can wait for.
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
