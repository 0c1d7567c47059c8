//! secretsd: the secrets daemon of a talos-rs node (the logic is in the library).

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon};

/// secretsd: the node's root secrets (OS, etcd, Kubernetes CAs, tokens) from the machine
/// config, and the certificates of apid, trustd and etcd, renewed at half their lifetime.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// stated's Unix socket.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// Lifetime of apid's and trustd's certificates (`90s`, `30m`, `24h`); they are renewed at
    /// half of it. Shorter than the default only to watch renewals.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    leaf_validity: Duration,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` wins when set.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Readiness: write `READY=1\n` to this fd and close it once the resource definitions are
    /// in stated, before the controllers start.
    #[arg(long, value_name = "FD")]
    notify_fd: Option<RawFd>,
}

/// `<N>s`, `<N>m` or `<N>h`, at least 10 s.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration such as 90s, 30m or 24h");
    let (n, unit) = s.split_at(s.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    }
    .ok_or_else(bad)?;
    if secs < 10 {
        return Err(format!("{s:?} is too short: at least 10s"));
    }
    Ok(Duration::from_secs(secs))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let d = match Daemon::start("secretsd", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = secretsd::run::Config {
        socket: args.socket,
        options: secretsd::controllers::Options {
            leaf_validity: args.leaf_validity,
        },
    };
    d.run(
        Some(2),
        secretsd::run::run(config, move || notify.ready(), shutdown_signal()),
    )
}
