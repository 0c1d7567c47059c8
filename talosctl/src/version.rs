//! `talosctl version`: this client's version, then each node's (`machine.MachineService/
//! Version` through apid, [`crate::api`]), laid out as upstream's.

use std::io::Write;

use proto::machine::machine_service_client::MachineServiceClient;

use crate::api::{self, Api};

/// `talosctl version`.
#[derive(Debug, Clone, clap::Args)]
pub struct VersionArgs {
    /// Print only the client's version (no node is called).
    #[arg(long)]
    pub client: bool,
    /// Print only the tags.
    #[arg(long)]
    pub short: bool,
}

/// The OS/Arch of this build, Go's spelling (`linux/amd64`).
fn os_arch() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{}/{arch}", std::env::consts::OS)
}

/// The client part.
pub fn client(args: &VersionArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let tag = format!("v{}", env!("CARGO_PKG_VERSION"));
    writeln!(out, "Client:")?;
    if args.short {
        writeln!(out, "\ttalos-rs {tag}")?;
    } else {
        writeln!(out, "\tTag:         {tag}")?;
        writeln!(out, "\tSHA:         undefined")?;
        writeln!(out, "\tBuilt:       ")?;
        writeln!(out, "\tGo version:  n/a (Rust)")?;
        writeln!(out, "\tOS/Arch:     {}", os_arch())?;
    }
    Ok(())
}

/// The server part: one call to the endpoint, for every node of `api` (the endpoint's apid
/// forwards it); each node's reply in the order they come, a node that failed reported and
/// the others still shown; the error lists the failed ones.
pub async fn servers(api: &Api, args: &VersionArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "Server:")?;
    let reply = MachineServiceClient::new(api.channel()?)
        .version(api.for_nodes(())?)
        .await
        .map_err(|s| api::explain(api, &s))?
        .into_inner();
    let mut errors = Vec::new();
    for m in reply.messages {
        let meta = m.metadata.clone().unwrap_or_default();
        let name = if meta.hostname.is_empty() {
            api.default_label().to_string()
        } else {
            meta.hostname.clone()
        };
        if !meta.error.is_empty() {
            errors.push(api::node_error(&name, meta.status.as_ref(), &meta.error));
            continue;
        }
        let v = m.version.unwrap_or_default();
        writeln!(out, "\tNODE:        {name}")?;
        writeln!(out, "\tTag:         {}", v.tag)?;
        if args.short {
            continue;
        }
        writeln!(out, "\tSHA:         {}", v.sha)?;
        writeln!(out, "\tBuilt:       {}", v.built)?;
        writeln!(out, "\tGo version:  {}", v.go_version)?;
        writeln!(out, "\tOS/Arch:     {}/{}", v.os, v.arch)?;
        if m.features.is_some_and(|f| f.rbac) {
            writeln!(out, "\tEnabled:     RBAC")?;
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("\n"))
    }
}
