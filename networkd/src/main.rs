//! networkd: the network daemon of a talos-rs node (the logic is in the library).

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
    match rt.block_on(networkd::run::run(config, shutdown())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("networkd: {}", cosi::error::Chain(&e));
            ExitCode::FAILURE
        }
    }
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
