//! The `init` binary: parses arguments, mounts the early filesystems as PID 1, runs the node
//! (`init::run`) and ends the machine. The logic lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// init: PID 1 of a talos-rs node — the daemon supervisor.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// vm (PID 1 of a machine), container (PID 1 of a namespace set) or dev (not PID 1)
    /// [default: detected].
    #[arg(long, value_enum)]
    mode: Option<init::Mode>,
    /// The node's root directory: the node's /run, /system, /etc live under it.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// The directory of the daemon binaries [default: init's own directory].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The daemon manifest [default: the one compiled into init].
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// A machine configuration to seed the config namespace with when it is empty.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The kernel command line outside a VM (a VM's comes from /proc/cmdline).
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Development mode: init runs in a UTS namespace of its own (`unshare --uts`) and sets the
    /// node's hostname there, as it always does as PID 1 (vm, container).
    #[arg(long)]
    own_uts: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mode = args.mode.unwrap_or_else(init::Mode::detect);
    if args.root == std::path::Path::new("/") {
        init::pid1::mount_early(mode);
    }
    init::pid1::disable_ctrl_alt_del(mode);
    let bin = args.bin_dir.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/usr/bin"))
    });
    let paths = init::Paths {
        root: args.root.clone(),
        bin,
    };
    let manifest = match &args.manifest {
        Some(p) => init::manifest::load(p, &paths),
        None => init::manifest::parse(init::DEFAULT_MANIFEST, &paths),
    };
    let manifest = match manifest {
        Ok(m) => m,
        Err(e) => {
            eprintln!("init: {}", cosi::error::Chain(&e));
            return ExitCode::from(init::manifest::PERMANENT_FAILURE_EXIT as u8);
        }
    };
    let cmdline = if mode == init::Mode::Vm {
        std::fs::read_to_string("/proc/cmdline")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    } else {
        args.cmdline.clone()
    };
    let config = init::Config {
        mode,
        paths,
        manifest,
        config_file: args.config.clone(),
        cmdline,
        own_uts: args.own_uts,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("init: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let action = match rt.block_on(init::run(config)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("init: {}", cosi::error::Chain(&e));
            return ExitCode::FAILURE;
        }
    };
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    ExitCode::from(init::pid1::finish(mode, action))
}
