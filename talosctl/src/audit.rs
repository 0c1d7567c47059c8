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
    let mut daemons = Vec::with_capacity(reply.daemons.len());
    for d in reply.daemons {
        if !d.error.is_empty() {
            eprintln!("{}: not audited: {}", d.name, d.error);
            continue;
        }
        let spec: DaemonSecuritySpec = serde_json::from_str(&d.security_json)
            .with_context(|| format!("the audit of {} does not decode", d.name))?;
        daemons.push((d.name, spec));
    }
    anyhow::ensure!(
        !daemons.is_empty(),
        "init reports no running daemon to audit"
    );
    match args.output {
        Format::Json => {
            let v: Vec<serde_json::Value> = daemons
                .iter()
                .map(|(id, s)| {
                    let mut v = serde_json::to_value(s).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("daemon".into(), id.clone().into());
                    }
                    v
                })
                .collect();
            serde_json::to_writer_pretty(&mut *out, &v)?;
            writeln!(out)?;
        }
        Format::Table => {
            let mut rows = vec![[
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
            .map(|s| s.to_string())
            .collect::<Vec<_>>()];
            for (id, s) in &daemons {
                let o = &s.observed;
                rows.push(vec![
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
            }
            table(out, &rows)?;
        }
    }
    let above: Vec<String> = daemons
        .iter()
        .filter(|(_, s)| s.exposure > args.threshold)
        .map(|(id, s)| format!("{id} ({})", s.exposure))
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
