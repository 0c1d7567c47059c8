use std::path::PathBuf;
use std::process::ExitCode;

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
        .map(stated::Manifest::load)
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
    match rt.block_on(stated::run(config, shutdown())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stated: {}", cosi::error::Chain(&e));
            ExitCode::FAILURE
        }
    }
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
