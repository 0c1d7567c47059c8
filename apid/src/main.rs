//! apid: the API daemon of a talos-rs node (the logic is in the library).

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon};

/// apid: the Talos API (cosi.resource.State read-only, machine.MachineService) on TCP 50000,
/// mutual TLS 1.3, roles from the client certificate's Organization.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// stated's Unix socket.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// init's control socket (services, logs, reboot, shutdown).
    #[arg(long, default_value = "/run/init/init.sock")]
    init_socket: PathBuf,
    /// Address and port to listen on.
    #[arg(long, default_value = "0.0.0.0:50000")]
    listen: SocketAddr,
    /// Connections open at once.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` wins when set.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Readiness: write `READY=1\n` to this fd and close it once stated answered.
    #[arg(long, value_name = "FD")]
    notify_fd: Option<RawFd>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let d = match Daemon::start("apid", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = apid::run::Config {
        socket: args.socket,
        init_socket: args.init_socket,
        listen: args.listen,
        limits: machinery::tls::Limits {
            max_connections: args.max_connections,
            ..machinery::tls::Limits::default()
        },
        peer_port: apid::run::PORT,
    };
    d.run(
        Some(2),
        apid::run::run(config, move || notify.ready(), shutdown_signal()),
    )
}
