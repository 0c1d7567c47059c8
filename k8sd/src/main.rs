//! k8sd: the Kubernetes daemon of a talos-rs node (the logic is in the library).

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon};

/// k8sd: etcd on control planes — its configuration and spec from the machine configuration
/// (`talosctl get etcdspecs`), its certificates on disk, the etcd service init runs for it,
/// `talosctl bootstrap`, and its quorum (`talosctl get etcdstatuses`).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// stated's Unix socket.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// etcd on the node: k8sd asks init to run it (a requested service).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// etcd's data directory (k8sd's, shared with etcd's group).
    #[arg(long, default_value = "/var/lib/etcd")]
    etcd_data_dir: PathBuf,
    /// Where k8sd writes etcd's certificates.
    #[arg(long, default_value = "/system/secrets/etcd")]
    etcd_pki_dir: PathBuf,
    /// The uid (and gid) etcd runs as: within k8sd's envelope in the daemon manifest.
    #[arg(long, default_value_t = 1_990_001_600)]
    etcd_uid: u32,
    /// This program, as the one-shot service that removes etcd's data after a leave runs it
    /// (`--wipe-contents`, under etcd's uid).
    #[arg(long, default_value = "/usr/bin/k8sd")]
    wipe_binary: PathBuf,
    /// Not the daemon: remove every entry of DIR and exit (what the `etcd-wipe` service runs).
    #[arg(long, value_name = "DIR")]
    wipe_contents: Option<PathBuf>,
    /// Not the daemon: move DIR/member up into DIR's parent, remove DIR and exit (what the
    /// `etcd-restore-adopt` service runs after a snapshot restore).
    #[arg(long, value_name = "DIR", conflicts_with = "wipe_contents")]
    adopt_restored: Option<PathBuf>,
    /// etcdctl on the node: the `etcd-restore` service runs its `snapshot restore`.
    #[arg(long, default_value = "/usr/bin/etcdctl")]
    etcdctl: PathBuf,
    /// Where an uploaded snapshot (`talosctl bootstrap --recover-from`) is kept.
    #[arg(long, default_value = "/var/lib/etcd-recover")]
    etcd_recover_dir: PathBuf,
    /// Where the kubelet's bootstrap kubeconfig and CA are written (`/etc/kubernetes` links
    /// here in the image).
    #[arg(long, default_value = "/system/kubernetes")]
    kubernetes_dir: PathBuf,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` wins when set.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Readiness: write `READY=1\n` to this fd and close it once the resource definitions are
    /// in stated, before the controllers start.
    #[arg(long, value_name = "FD")]
    notify_fd: Option<RawFd>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(dir) = args.adopt_restored {
        return match k8sd::wipe::adopt_restored(&dir) {
            Ok(()) => {
                eprintln!("k8sd: the member restored in {} is in place", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "k8sd: cannot adopt the member restored in {}: {e}",
                    dir.display()
                );
                ExitCode::FAILURE
            }
        };
    }
    if let Some(dir) = args.wipe_contents {
        return match k8sd::wipe::contents(&dir) {
            Ok(n) => {
                eprintln!("k8sd: removed {n} entries of {}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("k8sd: cannot remove the contents of {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    let d = match Daemon::start("k8sd", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = k8sd::run::Config {
        socket: args.socket,
        options: k8sd::controllers::Options {
            etcd: k8sd::etcd::service::EtcdOptions {
                binary: args.etcd,
                data_dir: args.etcd_data_dir,
                pki_dir: args.etcd_pki_dir,
                uid: args.etcd_uid,
                wipe_binary: args.wipe_binary,
                etcdctl: args.etcdctl,
                recover_dir: args.etcd_recover_dir,
                ..Default::default()
            },
            vip: k8sd::etcd::vip::Holdings::default(),
            kubernetes_dir: args.kubernetes_dir,
        },
    };
    d.run(
        Some(2),
        k8sd::run::run(config, move || notify.ready(), shutdown_signal()),
    )
}
