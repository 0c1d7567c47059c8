//! `talosctl shutdown` and `talosctl reboot`: ask init to stop every daemon and service in
//! reverse dependency order, then power off or reboot the node (outside a VM, init exits).

use std::io::Write;
use std::path::Path;

use proto::init::PowerRequest;

use crate::services::{call_error, connect};

/// Runs `shutdown` (`reboot == false`) or `reboot`.
pub async fn run(path: &Path, reboot: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut client = connect(path)?;
    let what = if reboot { "reboot" } else { "shutdown" };
    let reply = if reboot {
        client.reboot(PowerRequest {}).await
    } else {
        client.shutdown(PowerRequest {}).await
    };
    reply.map_err(|s| call_error(path, &format!("cannot {what}"), s))?;
    writeln!(out, "{what} requested")?;
    Ok(())
}
