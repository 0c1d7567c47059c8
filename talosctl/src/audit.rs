//! `talosctl audit`: per daemon, what the kernel says about its sandbox at the time of the call
//! (init reads `/proc/<pid>/task/*/status` of every thread when asked, over its control socket;
//! the `DaemonSecurity` resources it publishes are refreshed every 10 s), beside what the
//! manifest declares, with the exposure score on the
//! `systemd-analyze security` model. `--threshold N` exits non-zero when a daemon's exposure
//! (0–100, shown as N/10) is above N, as `systemd-analyze security --threshold` does, for CI.

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use machinery::resources::runtime::DaemonSecuritySpec;

use crate::services::table;

/// Output format of `audit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One row per daemon.
    #[default]
    Table,
    /// A JSON array: every field of every daemon's `DaemonSecurity`, checks included.
    Json,
}

/// Arguments of `audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Fail (exit 1) when a daemon's exposure, 0–100, is above this.
    #[arg(long, default_value_t = 100)]
    pub threshold: u64,
}

/// One daemon's audit: the node (through apid), the daemon, what was observed.
type Row = (Option<String>, String, DaemonSecuritySpec);

/// Decodes init's (or apid's) audit entries; a daemon that could not be read is said on
/// standard error.
fn decode(
    node: Option<&str>,
    daemons: impl IntoIterator<Item = (String, String, String)>,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let on = node.map(|n| format!(" on {n}")).unwrap_or_default();
    for (name, json, error) in daemons {
        if !error.is_empty() {
            eprintln!("{name}{on}: not audited: {error}");
            continue;
        }
        let spec: DaemonSecuritySpec = serde_json::from_str(&json)
            .with_context(|| format!("the audit of {name}{on} does not decode"))?;
        rows.push((node.map(str::to_string), name, spec));
    }
    Ok(())
}

/// Runs `audit` against the init whose control socket is `socket`.
pub async fn run(socket: &Path, args: &AuditArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut client = crate::services::connect(socket)?;
    let reply = client
        .audit(proto::init::AuditRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))
        .with_context(|| {
            format!(
                "cannot audit through init's control socket {}",
                socket.display()
            )
        })?
        .into_inner();
    let mut rows = Vec::new();
    decode(
        None,
        reply
            .daemons
            .into_iter()
            .map(|d| (d.name, d.security_json, d.error)),
        &mut rows,
    )?;
    anyhow::ensure!(!rows.is_empty(), "init reports no running daemon to audit");
    report(&rows, args, out)
}

/// Runs `audit` through the Talos API (`talosrs.audit.AuditService`, ours), one call per node.
pub async fn run_api(
    api: &crate::api::Api,
    args: &AuditArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use proto::talosrs::audit::audit_service_client::AuditServiceClient;
    let mut client = AuditServiceClient::new(api.channel()?);
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for (label, node) in api.targets() {
        let req = api.for_node(proto::talosrs::audit::AuditRequest {}, node.as_deref())?;
        match client.audit(req).await {
            Ok(reply) => {
                for m in reply.into_inner().messages {
                    decode(
                        Some(&label),
                        m.daemons
                            .into_iter()
                            .map(|d| (d.name, d.security_json, d.error)),
                        &mut rows,
                    )?;
                }
            }
            Err(s) => errors.push(format!("{label}: {}", crate::api::explain(api, &s))),
        }
    }
    let reported = if rows.is_empty() {
        Ok(())
    } else {
        report(&rows, args, out)
    };
    anyhow::ensure!(errors.is_empty(), "{}", errors.join("\n"));
    anyhow::ensure!(
        !rows.is_empty(),
        "no node reports a running daemon to audit"
    );
    reported
}

/// Prints the rows and applies the threshold.
fn report(rows: &[Row], args: &AuditArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let named = rows.iter().any(|(n, _, _)| n.is_some());
    match args.output {
        Format::Json => {
            let v: Vec<serde_json::Value> = rows
                .iter()
                .map(|(node, id, s)| {
                    let mut v = serde_json::to_value(s).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("daemon".into(), id.clone().into());
                        if let Some(n) = node {
                            o.insert("node".into(), n.clone().into());
                        }
                    }
                    v
                })
                .collect();
            serde_json::to_writer_pretty(&mut *out, &v)?;
            writeln!(out)?;
        }
        Format::Table => {
            let mut header: Vec<String> = Vec::new();
            if named {
                header.push("NODE".into());
            }
            header.extend(
                [
                    "DAEMON",
                    "PID",
                    "THREADS",
                    "UID",
                    "CAPABILITIES",
                    "NNP",
                    "SECCOMP",
                    "LANDLOCK",
                    "WRITES",
                    "READS",
                    "EXPOSURE",
                    "MATCHES MANIFEST",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            let mut table_rows = vec![header];
            for (node, id, s) in rows {
                let o = &s.observed;
                let mut row = Vec::new();
                if named {
                    row.push(node.clone().unwrap_or_default());
                }
                row.extend([
                    id.clone(),
                    s.pid.to_string(),
                    s.threads.to_string(),
                    join(o.uids.iter().map(u32::to_string)),
                    match o.effective.join(",") {
                        e if e.is_empty() => "none".to_string(),
                        e => e.replace("CAP_", ""),
                    },
                    if o.no_new_privs { "1" } else { "0" }.to_string(),
                    format!("{} ({})", o.seccomp, o.seccomp_filters),
                    format!("{} (abi {})", o.landlock, o.landlock_abi),
                    join(s.declared.writes.iter().cloned()),
                    join(s.declared.reads.iter().cloned()),
                    format!("{}.{} {}", s.exposure / 10, s.exposure % 10, s.level),
                    if s.mismatches.is_empty() {
                        "yes".to_string()
                    } else {
                        format!("no: {}", s.mismatches.join("; "))
                    },
                ]);
                table_rows.push(row);
            }
            table(out, &table_rows)?;
        }
    }
    let above: Vec<String> = rows
        .iter()
        .filter(|(_, _, s)| s.exposure > args.threshold)
        .map(|(node, id, s)| match node {
            Some(n) => format!("{id} on {n} ({})", s.exposure),
            None => format!("{id} ({})", s.exposure),
        })
        .collect();
    out.flush()?;
    anyhow::ensure!(
        above.is_empty(),
        "exposure above the threshold {}: {}",
        args.threshold,
        above.join(", ")
    );
    Ok(())
}

fn join(it: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = it.collect();
    if v.is_empty() {
        "-".to_string()
    } else {
        v.join(",")
    }
}
