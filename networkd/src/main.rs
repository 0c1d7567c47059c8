//! networkd: the network daemon of a talos-rs node (the logic is in the library).

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon};
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
    let d = match Daemon::start("networkd", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = networkd::run::Config {
        socket: args.socket,
        etc_root: args.root,
    };
    d.run(
        Some(2),
        networkd::run::run(config, move || notify.ready(), shutdown_signal()),
    )
}
