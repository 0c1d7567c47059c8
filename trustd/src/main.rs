//! trustd: the trust daemon of a talos-rs node (the logic is in the library).

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon};

/// trustd: signs joining nodes' apid certificates with the OS CA (securityapi Certificate on
/// TCP 50001, TLS 1.3, the trustd token); listens only on a control plane. On a worker it
/// asks a control plane's trustd to sign apid's CSR.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// stated's Unix socket.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// Address and port to listen on.
    #[arg(long, default_value = "0.0.0.0:50001")]
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
    let d = match Daemon::start("trustd", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = trustd::run::Config {
        socket: args.socket,
        listen: args.listen,
        limits: machinery::tls::Limits {
            max_connections: args.max_connections,
            ..machinery::tls::Limits::default()
        },
        join_timeout: trustd::join::ATTEMPT_TIMEOUT,
    };
    d.run(
        Some(2),
        trustd::run::run(config, move || notify.ready(), shutdown_signal()),
    )
}
