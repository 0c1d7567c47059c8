//! blockd: the block daemon of a talos-rs node (the logic is in the library).

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sandbox::daemon::{shutdown_signal, Daemon};

/// blockd: the node's disks (`Disks.block.talos.dev`) from sysfs and what is on them
/// (`DiscoveredVolumes.block.talos.dev`: partition tables and filesystems, probed read-only).
/// Only a VM's disks: a node in namespaces shares the host's, which are not its own.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// stated's Unix socket.
    #[arg(long, default_value = "/run/stated/state.sock")]
    socket: PathBuf,
    /// Where the kernel lists block devices.
    #[arg(long, default_value = "/sys/block")]
    sys_block: PathBuf,
    /// Where the device nodes are.
    #[arg(long, default_value = "/dev")]
    dev: PathBuf,
    /// mkfs.xfs on the node: blockd asks init to run it (a requested service) to format a
    /// blank system partition.
    #[arg(long, default_value = "/usr/bin/mkfs.xfs")]
    mkfs_xfs: PathBuf,
    /// The uid (and gid) mkfs runs as: within blockd's envelope in the daemon manifest.
    #[arg(long, default_value_t = 1_990_001_500)]
    mkfs_uid: u32,
    /// blkid on the node: asked (a requested service) what a disk holds before it is written.
    #[arg(long, default_value = "/usr/bin/blkid")]
    blkid: PathBuf,
    /// The uid (and gid) blkid runs as: within blockd's envelope in the daemon manifest.
    #[arg(long, default_value_t = 1_990_001_501)]
    blkid_uid: u32,
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
    let d = match Daemon::start("blockd", &args.log_level) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = blockd::run::Config {
        socket: args.socket,
        options: blockd::controllers::Options {
            sys_block: args.sys_block,
            dev: args.dev,
            any_mode: false,
            format: blockd::volumes::FormatOptions {
                mkfs_xfs: args.mkfs_xfs,
                uid: args.mkfs_uid,
                blkid: blockd::blkid::BlkidOptions {
                    binary: args.blkid,
                    uid: args.blkid_uid,
                },
            },
        },
    };
    d.run(
        Some(2),
        blockd::run::run(config, move || notify.ready(), shutdown_signal()),
    )
}
