//! `talosctl logs <id> [-f] [--tail N]`: the output of a daemon or service, from init's
//! in-memory ring buffer (stdout and stderr together), optionally followed.

use std::io::Write;
use std::path::Path;

use clap::Args;
use proto::init::LogsRequest;

use crate::services::{call_error, connect};

/// Arguments of `logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// A daemon name (`networkd`) or requested service ID.
    pub id: String,
    /// Keep printing new lines until interrupted.
    #[arg(short, long)]
    pub follow: bool,
    /// Lines from the end of the buffer to print first (-1: all that are kept).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub tail: i32,
}

/// Runs `logs`.
pub async fn run(path: &Path, args: &LogsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut client = connect(path)?;
    let mut stream = client
        .logs(LogsRequest {
            id: args.id.clone(),
            tail: args.tail,
            follow: args.follow,
        })
        .await
        .map_err(|s| call_error(path, &format!("cannot read the logs of {}", args.id), s))?
        .into_inner();
    while let Some(line) = stream
        .message()
        .await
        .map_err(|s| call_error(path, "log stream broken", s))?
    {
        out.write_all(&line.line)?;
        out.write_all(b"\n")?;
        if args.follow {
            out.flush()?;
        }
    }
    Ok(())
}

/// `talosctl dmesg --init-socket` (development): the node's kernel log from init's control
/// socket, record by record as upstream prints them.
/// `talosctl mounts` over init's control socket (root): the same table as through apid.
pub async fn mounts(path: &Path, node: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut client = connect(path)?;
    let stats = client
        .mounts(proto::init::MountsRequest {})
        .await
        .map_err(|s| call_error(path, "cannot read the mounts", s))?
        .into_inner()
        .stats
        .into_iter()
        .map(|s| proto::machine::MountStat {
            filesystem: s.filesystem,
            size: s.size,
            available: s.available,
            mounted_on: s.mounted_on,
        })
        .collect::<Vec<_>>();
    let mut rows = vec![crate::remote::MOUNTS_HEADER.map(String::from).to_vec()];
    rows.extend(crate::remote::mount_rows(node, &stats));
    crate::services::table(out, &rows)?;
    Ok(())
}

pub async fn dmesg(
    path: &Path,
    args: &crate::remote::DmesgArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut client = connect(path)?;
    let mut stream = client
        .dmesg(proto::init::DmesgRequest {
            follow: args.follow,
            tail: args.tail,
        })
        .await
        .map_err(|s| call_error(path, "cannot read the kernel log", s))?
        .into_inner();
    while let Some(record) = stream
        .message()
        .await
        .map_err(|s| call_error(path, "kernel log stream broken", s))?
    {
        if record.error.is_empty() {
            out.write_all(&record.line)?;
        } else {
            eprintln!("{}", record.error);
        }
        if args.follow {
            out.flush()?;
        }
    }
    Ok(())
}
