//! `services`, `service`, `logs`, `dmesg`, `reboot` and `shutdown` through the Talos API
//! (`machine.MachineService`): one call per node with the `node` metadata, which the endpoint's
//! apid passes through to that node's apid (as upstream's talosctl does since 1.14), and a NODE
//! column or prefix naming where each answer comes from. A node that fails does not hide the
//! others: the error lists every failed node.

use std::io::Write;

use proto::machine::machine_service_client::MachineServiceClient;
use proto::machine::{
    DmesgRequest, LogsRequest, RebootRequest, ServiceInfo, ServiceRestartRequest,
    ServiceStartRequest, ServiceStopRequest, ShutdownRequest,
};

use crate::api::{self, Api};
use crate::logs::LogsArgs;
use crate::services::{table, Action, ServiceArgs};

fn client(api: &Api) -> anyhow::Result<MachineServiceClient<tonic::transport::Channel>> {
    Ok(MachineServiceClient::new(api.channel()?)
        .max_decoding_message_size(cosi::client::MAX_MESSAGE))
}

/// A node's failure, named.
fn failed(api: &Api, node: &str, status: &tonic::Status) -> String {
    let why = api::explain(api, status).to_string();
    let prefix = format!("{}: ", api.endpoint.label);
    format!("{node}: {}", why.strip_prefix(&prefix).unwrap_or(&why))
}

fn finish(errors: Vec<String>) -> anyhow::Result<()> {
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("\n"))
    }
}

fn health(s: &ServiceInfo) -> &'static str {
    match &s.health {
        Some(h) if h.unknown => "?",
        Some(h) if h.healthy => "OK",
        Some(_) => "Fail",
        None => "?",
    }
}

fn last_event(s: &ServiceInfo) -> String {
    s.events
        .as_ref()
        .and_then(|e| e.events.last())
        .map(|e| e.msg.clone())
        .or_else(|| s.health.as_ref().map(|h| h.last_message.clone()))
        .unwrap_or_default()
}

/// The services of every node (ServiceList).
async fn list(api: &Api) -> anyhow::Result<(Vec<(String, ServiceInfo)>, Vec<String>)> {
    let mut c = client(api)?;
    let mut services = Vec::new();
    let mut errors = Vec::new();
    for (label, node) in api.targets() {
        match c.service_list(api.for_node((), node.as_deref())?).await {
            Ok(reply) => {
                for m in reply.into_inner().messages {
                    services.extend(m.services.into_iter().map(|s| (label.clone(), s)));
                }
            }
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    Ok((services, errors))
}

/// `talosctl services`: NODE, SERVICE, STATE, HEALTH, LAST EVENT (upstream's columns but LAST
/// CHANGE, which init does not keep).
pub async fn services(api: &Api, out: &mut dyn Write) -> anyhow::Result<()> {
    let (services, errors) = list(api).await?;
    let mut rows = vec![["NODE", "SERVICE", "STATE", "HEALTH", "LAST EVENT"]
        .map(String::from)
        .to_vec()];
    rows.extend(services.iter().map(|(node, s)| {
        vec![
            node.clone(),
            s.id.clone(),
            s.state.clone(),
            health(s).to_string(),
            last_event(s),
        ]
    }));
    table(out, &rows)?;
    finish(errors)
}

/// `talosctl service <id> [status|start|stop|restart]`.
pub async fn service(api: &Api, args: &ServiceArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.action == Action::Status {
        let (services, mut errors) = list(api).await?;
        let mut rows = Vec::new();
        for (label, _) in api.targets() {
            let Some((_, s)) = services
                .iter()
                .find(|(n, s)| *n == label && s.id == args.id)
            else {
                if !errors.iter().any(|e| e.starts_with(&format!("{label}: "))) {
                    errors.push(format!("{label}: no daemon or service {:?}", args.id));
                }
                continue;
            };
            rows.extend([
                vec!["NODE".to_string(), label.clone()],
                vec!["ID".to_string(), s.id.clone()],
                vec!["STATE".to_string(), s.state.clone()],
                vec!["HEALTH".to_string(), health(s).to_string()],
                vec!["LAST EVENT".to_string(), last_event(s)],
            ]);
        }
        table(out, &rows)?;
        return finish(errors);
    }
    let mut c = client(api)?;
    let mut rows = vec![vec!["NODE".to_string(), "RESPONSE".to_string()]];
    let mut errors = Vec::new();
    for (label, node) in api.targets() {
        let node = node.as_deref();
        let id = args.id.clone();
        let reply = match args.action {
            Action::Start => c
                .service_start(api.for_node(ServiceStartRequest { id }, node)?)
                .await
                .map(|r| {
                    r.into_inner()
                        .messages
                        .into_iter()
                        .map(|m| m.resp)
                        .collect()
                }),
            Action::Stop => c
                .service_stop(api.for_node(ServiceStopRequest { id }, node)?)
                .await
                .map(|r| {
                    r.into_inner()
                        .messages
                        .into_iter()
                        .map(|m| m.resp)
                        .collect()
                }),
            _ => c
                .service_restart(api.for_node(ServiceRestartRequest { id }, node)?)
                .await
                .map(|r| {
                    r.into_inner()
                        .messages
                        .into_iter()
                        .map(|m| m.resp)
                        .collect()
                }),
        };
        match reply {
            Ok(resps) => {
                let resps: Vec<String> = resps;
                rows.extend(resps.into_iter().map(|r| vec![label.clone(), r]));
            }
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    table(out, &rows)?;
    finish(errors)
}

/// `talosctl logs <id> [-f] [--tail N]`: each node's lines; with several nodes each line is
/// prefixed with its node, and followed streams are interleaved as lines come.
pub async fn logs(api: &Api, args: &LogsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let c = client(api)?;
    streams(api, args.follow, "log", out, |node| {
        let mut c = c.clone();
        let req = api.for_node(
            LogsRequest {
                namespace: String::new(),
                id: args.id.clone(),
                driver: 0,
                follow: args.follow,
                tail_lines: args.tail,
            },
            node,
        );
        async move { Ok(c.logs(req?).await) }
    })
    .await
}

/// `talosctl dmesg`.
#[derive(Debug, Clone, clap::Args)]
pub struct DmesgArgs {
    /// Keep printing records as the kernel logs them.
    #[arg(short, long)]
    pub follow: bool,
    /// Only what the kernel logs from now on (with `-f`).
    #[arg(long)]
    pub tail: bool,
}

/// `talosctl dmesg`: each node's kernel log (Dmesg), prefixed by node when there are several.
pub async fn dmesg(api: &Api, args: &DmesgArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let c = client(api)?;
    streams(api, args.follow, "kernel log", out, |node| {
        let mut c = c.clone();
        let req = api.for_node(
            DmesgRequest {
                follow: args.follow,
                tail: args.tail,
            },
            node,
        );
        async move { Ok(c.dmesg(req?).await) }
    })
    .await
}

type DataStream = tonic::Streaming<proto::common::Data>;

/// One stream of `Data` per target, opened by `open` (its `node` metadata): one node after
/// the other, or all at once while following; lines prefixed by node when there are several.
/// A `Data` carrying `metadata.error` (a record the node could not read) is said on stderr
/// and the stream goes on.
async fn streams<F, Fut>(
    api: &Api,
    follow: bool,
    what: &'static str,
    out: &mut dyn Write,
    open: F,
) -> anyhow::Result<()>
where
    F: Fn(Option<&str>) -> Fut,
    Fut: std::future::Future<
        Output = anyhow::Result<Result<tonic::Response<DataStream>, tonic::Status>>,
    >,
{
    let targets = api.targets();
    let prefix = targets.len() > 1;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Result<Vec<u8>, String>)>(64);
    let mut errors = Vec::new();
    let shown = |out: &mut dyn Write, label: &str, d: proto::common::Data| match d
        .metadata
        .filter(|m| !m.error.is_empty())
    {
        Some(m) => {
            eprintln!("{label}: {}", m.error);
            Ok(())
        }
        None => write_lines(out, prefix.then_some(label), &d.bytes),
    };
    for (label, node) in targets {
        let mut stream = match open(node.as_deref()).await? {
            Ok(s) => s.into_inner(),
            Err(s) => {
                errors.push(failed(api, &label, &s));
                continue;
            }
        };
        if !follow {
            // One node after the other: each node's lines stay together.
            loop {
                match stream.message().await {
                    Ok(Some(d)) => shown(out, &label, d)?,
                    Ok(None) => break,
                    Err(s) => {
                        errors.push(format!("{label}: {what} stream broken: {}", s.message()));
                        break;
                    }
                }
            }
            continue;
        }
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let item = match stream.message().await {
                    Ok(Some(d)) => match d.metadata.filter(|m| !m.error.is_empty()) {
                        Some(m) => {
                            eprintln!("{label}: {}", m.error);
                            continue;
                        }
                        None => Ok(d.bytes),
                    },
                    Ok(None) => return,
                    Err(s) => Err(s.message().to_string()),
                };
                let end = item.is_err();
                if tx.send((label.clone(), item)).await.is_err() || end {
                    return;
                }
            }
        });
    }
    drop(tx);
    while let Some((label, item)) = rx.recv().await {
        match item {
            Ok(bytes) => {
                write_lines(out, prefix.then_some(label.as_str()), &bytes)?;
                out.flush()?;
            }
            Err(e) => errors.push(format!("{label}: {what} stream broken: {e}")),
        }
    }
    finish(errors)
}

fn write_lines(out: &mut dyn Write, prefix: Option<&str>, bytes: &[u8]) -> std::io::Result<()> {
    match prefix {
        None => out.write_all(bytes),
        Some(p) => {
            for line in bytes.split_inclusive(|b| *b == b'\n') {
                write!(out, "{p}: ")?;
                out.write_all(line)?;
            }
            Ok(())
        }
    }
}

/// `talosctl reboot` (`reboot`) or `talosctl shutdown`.
pub async fn power(api: &Api, reboot: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut c = client(api)?;
    let what = if reboot { "reboot" } else { "shutdown" };
    let mut errors = Vec::new();
    for (label, node) in api.targets() {
        let node = node.as_deref();
        let reply = if reboot {
            c.reboot(api.for_node(RebootRequest { mode: 0 }, node)?)
                .await
                .map(drop)
        } else {
            c.shutdown(api.for_node(ShutdownRequest { force: false }, node)?)
                .await
                .map(drop)
        };
        match reply {
            Ok(()) => writeln!(out, "{label}: {what} requested")?,
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    finish(errors)
}

/// The rows of `talosctl mounts` for one node's mounts (upstream's columns and figures: GB
/// are 10^9 bytes, two decimals; USED is size minus available).
pub fn mount_rows(node: &str, stats: &[proto::machine::MountStat]) -> Vec<Vec<String>> {
    stats
        .iter()
        .map(|m| {
            #[allow(clippy::cast_precision_loss)] // figures for people
            let (size, avail) = (m.size as f64 * 1e-9, m.available as f64 * 1e-9);
            let used = if size > 0.0 {
                100.0 - avail / size * 100.0
            } else {
                0.0
            };
            vec![
                node.to_string(),
                m.filesystem.clone(),
                format!("{size:.2}"),
                format!("{:.2}", size - avail),
                format!("{avail:.2}"),
                format!("{used:.2}%"),
                m.mounted_on.clone(),
            ]
        })
        .collect()
}

/// The header of `talosctl mounts`.
pub const MOUNTS_HEADER: [&str; 7] = [
    "NODE",
    "FILESYSTEM",
    "SIZE(GB)",
    "USED(GB)",
    "AVAILABLE(GB)",
    "PERCENT USED",
    "MOUNTED ON",
];

/// `talosctl mounts`: every node's mounted filesystems (Mounts).
pub async fn mounts(api: &Api, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut c = client(api)?;
    let mut rows = vec![MOUNTS_HEADER.map(String::from).to_vec()];
    let mut errors = Vec::new();
    for (label, node) in api.targets() {
        match c.mounts(api.for_node((), node.as_deref())?).await {
            Ok(reply) => {
                for m in reply.into_inner().messages {
                    rows.extend(mount_rows(&label, &m.stats));
                }
            }
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    table(out, &rows)?;
    finish(errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_rows_read_as_upstreams() {
        let rows = mount_rows(
            "n1",
            &[
                proto::machine::MountStat {
                    filesystem: "/dev/vda5".into(),
                    size: 2_000_000_000,
                    available: 500_000_000,
                    mounted_on: "/var".into(),
                },
                proto::machine::MountStat {
                    filesystem: "proc".into(),
                    size: 0,
                    available: 0,
                    mounted_on: "/proc".into(),
                },
            ],
        );
        assert_eq!(
            rows[0],
            ["n1", "/dev/vda5", "2.00", "1.50", "0.50", "75.00%", "/var"]
        );
        assert_eq!(rows[1][5], "0.00%");
    }

    #[test]
    fn disk_rows_read_as_upstreams() {
        let row = disk_row(
            "n1",
            &proto::storage::Disk {
                size: 2 * 1024 * 1024 * 1024,
                device_name: "/dev/vda".into(),
                r#type: proto::storage::disk::DiskType::Hdd as i32,
                subsystem: "/sys/class/block".into(),
                ..Default::default()
            },
        );
        assert_eq!(
            row,
            [
                "n1",
                "/dev/vda",
                "-",
                "-",
                "HDD",
                "-",
                "-",
                "-",
                "-",
                "2.1 GB",
                "-",
                "/sys/class/block",
                ""
            ]
        );
    }
}

/// `talosctl bootstrap`.
#[derive(Debug, Clone, clap::Args)]
pub struct BootstrapArgs {
    /// Recover etcd from this snapshot (`talosctl etcd snapshot`, or a copied `member/snap/db`
    /// with --recover-skip-hash-check) instead of starting an empty cluster: it is uploaded
    /// (EtcdRecover), restored on the node as a one-member cluster, and the other control
    /// planes join it.
    #[arg(long, value_name = "FILE")]
    pub recover_from: Option<std::path::PathBuf>,
    /// With --recover-from: skip the snapshot's hash check (a copied `member/snap/db`).
    #[arg(long, requires = "recover_from")]
    pub recover_skip_hash_check: bool,
}

/// `talosctl bootstrap`: one control plane node starts a new etcd cluster of itself; the
/// others join it. Refused on a node that holds etcd data already (AlreadyExists).
pub async fn bootstrap(api: &Api, args: &BootstrapArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let targets = api.targets();
    if targets.len() != 1 {
        anyhow::bail!(
            "bootstrap one control plane node only (-n IP): {} nodes are selected",
            targets.len()
        );
    }
    let mut c = client(api)?;
    let mut errors = Vec::new();
    for (label, node) in targets {
        if let Some(file) = &args.recover_from {
            // The snapshot first (EtcdRecover, a client stream of 1 MiB pieces), as upstream.
            let f = std::fs::File::open(file)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", file.display()))?;
            let pieces = futures::stream::unfold(Some(f), |f| async move {
                use std::io::Read as _;
                let mut f = f?;
                let mut buf = vec![0u8; 1024 * 1024];
                match f.read(&mut buf) {
                    Ok(0) | Err(_) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((
                            proto::common::Data {
                                metadata: None,
                                bytes: buf,
                            },
                            Some(f),
                        ))
                    }
                }
            });
            if let Err(s) = c.etcd_recover(api.for_node(pieces, node.as_deref())?).await {
                errors.push(failed(api, &label, &s));
                continue;
            }
            writeln!(out, "{label}: snapshot {} uploaded", file.display())?;
        }
        let req = proto::machine::BootstrapRequest {
            recover_etcd: args.recover_from.is_some(),
            recover_skip_hash_check: args.recover_skip_hash_check,
        };
        match c.bootstrap(api.for_node(req, node.as_deref())?).await {
            Ok(_) if args.recover_from.is_some() => writeln!(
                out,
                "{label}: bootstrap accepted: etcd restores the snapshot and starts a new cluster of this member"
            )?,
            Ok(_) => writeln!(
                out,
                "{label}: bootstrap accepted: etcd starts a new cluster"
            )?,
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    finish(errors)
}

/// `talosctl etcd …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EtcdCommand {
    /// List etcd's members as the node's member sees them (ID, hostname, peer and client URLs,
    /// learner): refreshed by k8sd every 5 s.
    #[command(visible_alias = "member")]
    Members,
    /// The node's etcd member: database size, leader, raft index and term, learner, errors.
    Status,
    /// Remove a member (its ID in hex, from `etcd members`) that has no node any more. The
    /// member's data is not touched; for a running node, use `etcd leave` on it instead.
    RemoveMember {
        /// The member ID, 16 hex digits.
        #[arg(value_parser = parse_member_id)]
        member_id: u64,
    },
    /// The node leaves the etcd cluster: its member is removed, etcd stops and its data is
    /// removed; etcd stays stopped until the node restarts.
    Leave,
    /// Move the leadership to another voting member when the node's member leads.
    ForfeitLeadership,
    /// Defragment the node's etcd database (resource-heavy: one node at a time).
    Defrag,
    /// Save a snapshot of the node's etcd database to FILE (written to FILE.part, then
    /// renamed): what `bootstrap --recover-from` takes.
    Snapshot {
        /// Where to save it.
        file: std::path::PathBuf,
    },
    /// etcd's alarms (NOSPACE, CORRUPT).
    #[command(subcommand)]
    Alarm(EtcdAlarmCommand),
}

/// `talosctl etcd alarm …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EtcdAlarmCommand {
    /// The raised alarms, by member.
    List,
    /// Disarm every raised alarm (after freeing space: defrag, compaction).
    Disarm,
}

/// A member ID as `etcd members` prints it (hex).
fn parse_member_id(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| {
        format!("{s:?} is not a member ID (16 hex digits, as `etcd members` shows): {e}")
    })
}

/// `talosctl etcd snapshot FILE`: one node; FILE.part while it streams, renamed at the end
/// (a broken stream leaves no FILE).
async fn etcd_snapshot(
    api: &Api,
    file: &std::path::Path,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let targets = api.targets();
    if targets.len() != 1 {
        anyhow::bail!(
            "a snapshot comes from one node (-n IP): {} nodes are selected",
            targets.len()
        );
    }
    let (label, node) = &targets[0];
    let mut part = file.as_os_str().to_owned();
    part.push(".part");
    let part = std::path::PathBuf::from(part);
    let mut c = client(api)?;
    let fail = |s: tonic::Status| anyhow::anyhow!("{}", failed(api, label, &s));
    let mut stream = c
        .etcd_snapshot(api.for_node(proto::machine::EtcdSnapshotRequest {}, node.as_deref())?)
        .await
        .map_err(fail)?
        .into_inner();
    let mut f = std::fs::File::create(&part)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", part.display()))?;
    let mut total = 0u64;
    let result: anyhow::Result<()> = async {
        while let Some(d) = stream.message().await.map_err(fail)? {
            f.write_all(&d.bytes)?;
            total += d.bytes.len() as u64;
        }
        f.sync_all()?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, file).map_err(|e| {
        anyhow::anyhow!(
            "cannot rename {} to {}: {e}",
            part.display(),
            file.display()
        )
    })?;
    writeln!(
        out,
        "etcd snapshot saved to {:?} ({total} bytes)",
        file.display().to_string()
    )?;
    Ok(())
}

/// The etcd operations that change something: one node after another, a line each.
async fn etcd_operation(api: &Api, cmd: &EtcdCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut c = client(api)?;
    let mut errors = Vec::new();
    let mut alarms = vec![["NODE", "MEMBER", "ALARM"].map(String::from).to_vec()];
    let alarm_name = |a: i32| {
        proto::machine::etcd_member_alarm::AlarmType::try_from(a)
            .map_or_else(|_| a.to_string(), |t| t.as_str_name().to_string())
    };
    for (label, node) in api.targets() {
        let node = node.as_deref();
        let result = match cmd {
            EtcdCommand::RemoveMember { member_id } => {
                let req = proto::machine::EtcdRemoveMemberByIdRequest {
                    member_id: *member_id,
                };
                c.etcd_remove_member_by_id(api.for_node(req, node)?)
                    .await
                    .map(|_| format!("{label}: member {member_id:016x} removed"))
            }
            EtcdCommand::Leave => c
                .etcd_leave_cluster(api.for_node(proto::machine::EtcdLeaveClusterRequest {}, node)?)
                .await
                .map(|_| {
                    format!("{label}: left the etcd cluster; etcd is stopped and its data removed")
                }),
            EtcdCommand::ForfeitLeadership => c
                .etcd_forfeit_leadership(
                    api.for_node(proto::machine::EtcdForfeitLeadershipRequest {}, node)?,
                )
                .await
                .map(
                    |r| match r.into_inner().messages.first().map(|m| m.member.clone()) {
                        Some(m) if !m.is_empty() => format!("{label}: leadership moved to {m}"),
                        _ => format!("{label}: not the leader: nothing to forfeit"),
                    },
                ),
            EtcdCommand::Defrag => c
                .etcd_defragment(api.for_node((), node)?)
                .await
                .map(|_| format!("{label}: defragmented")),
            EtcdCommand::Alarm(a) => {
                let reply = match a {
                    EtcdAlarmCommand::List => {
                        c.etcd_alarm_list(api.for_node((), node)?).await.map(|r| {
                            r.into_inner()
                                .messages
                                .into_iter()
                                .flat_map(|m| m.member_alarms)
                                .collect::<Vec<_>>()
                        })
                    }
                    EtcdAlarmCommand::Disarm => {
                        c.etcd_alarm_disarm(api.for_node((), node)?).await.map(|r| {
                            r.into_inner()
                                .messages
                                .into_iter()
                                .flat_map(|m| m.member_alarms)
                                .collect::<Vec<_>>()
                        })
                    }
                };
                reply.map(|list| {
                    for m in list {
                        alarms.push(vec![
                            label.clone(),
                            format!("{:016x}", m.member_id),
                            alarm_name(m.alarm),
                        ]);
                    }
                    String::new()
                })
            }
            EtcdCommand::Members | EtcdCommand::Status | EtcdCommand::Snapshot { .. } => {
                unreachable!("not an operation")
            }
        };
        match result {
            Ok(line) if line.is_empty() => {}
            Ok(line) => writeln!(out, "{line}")?,
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    if matches!(cmd, EtcdCommand::Alarm(EtcdAlarmCommand::List)) || alarms.len() > 1 {
        table(out, &alarms)?;
    }
    finish(errors)
}

/// `talosctl etcd …`, one node after another.
pub async fn etcd(api: &Api, cmd: &EtcdCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    if let EtcdCommand::Snapshot { file } = cmd {
        return etcd_snapshot(api, file, out).await;
    }
    if !matches!(cmd, EtcdCommand::Members | EtcdCommand::Status) {
        return etcd_operation(api, cmd, out).await;
    }
    let mut c = client(api)?;
    let mut errors = Vec::new();
    let mut rows = match cmd {
        EtcdCommand::Members => vec![[
            "NODE",
            "ID",
            "HOSTNAME",
            "PEER URLS",
            "CLIENT URLS",
            "LEARNER",
        ]
        .map(String::from)
        .to_vec()],
        _ => vec![[
            "NODE",
            "MEMBER",
            "DB SIZE",
            "IN USE",
            "LEADER",
            "RAFT INDEX",
            "RAFT TERM",
            "RAFT APPLIED INDEX",
            "LEARNER",
            "ERRORS",
        ]
        .map(String::from)
        .to_vec()],
    };
    for (label, node) in api.targets() {
        let node = node.as_deref();
        match cmd {
            EtcdCommand::Members => {
                let req = proto::machine::EtcdMemberListRequest { query_local: false };
                match c.etcd_member_list(api.for_node(req, node)?).await {
                    Ok(reply) => {
                        for m in reply.into_inner().messages.iter().flat_map(|m| &m.members) {
                            rows.push(vec![
                                label.clone(),
                                format!("{:016x}", m.id),
                                m.hostname.clone(),
                                m.peer_urls.join(","),
                                m.client_urls.join(","),
                                m.is_learner.to_string(),
                            ]);
                        }
                    }
                    Err(s) => errors.push(failed(api, &label, &s)),
                }
            }
            _ => match c.etcd_status(api.for_node((), node)?).await {
                Ok(reply) => {
                    for m in reply
                        .into_inner()
                        .messages
                        .iter()
                        .filter_map(|m| m.member_status.as_ref())
                    {
                        let size = |b: i64| {
                            machinery::resources::block::pretty_size(u64::try_from(b).unwrap_or(0))
                        };
                        #[allow(clippy::cast_precision_loss)] // a percentage for people
                        let share = if m.db_size > 0 {
                            m.db_size_in_use as f64 / m.db_size as f64 * 100.0
                        } else {
                            0.0
                        };
                        rows.push(vec![
                            label.clone(),
                            format!("{:016x}", m.member_id),
                            size(m.db_size),
                            format!("{} ({share:.2}%)", size(m.db_size_in_use)),
                            format!("{:016x}", m.leader),
                            m.raft_index.to_string(),
                            m.raft_term.to_string(),
                            m.raft_applied_index.to_string(),
                            m.is_learner.to_string(),
                            m.errors.join(","),
                        ]);
                    }
                }
                Err(s) => errors.push(failed(api, &label, &s)),
            },
        }
    }
    if rows.len() > 1 {
        table(out, &rows)?;
    }
    finish(errors)
}

/// `talosctl disks`.
#[derive(Debug, Clone, clap::Args)]
pub struct DisksArgs {
    /// Through the maintenance API of a node that has no configuration yet (`-n IP`), without
    /// a client certificate (as `get --insecure`).
    #[arg(short = 'i', long)]
    pub insecure: bool,
}

/// The header of `talosctl disks` (upstream's columns).
pub const DISKS_HEADER: [&str; 13] = [
    "NODE",
    "DEV",
    "MODEL",
    "SERIAL",
    "TYPE",
    "UUID",
    "WWID",
    "MODALIAS",
    "NAME",
    "SIZE",
    "BUS_PATH",
    "SUBSYSTEM",
    "SYSTEM_DISK",
];

/// One row of `talosctl disks`: `-` for what is empty, the size as upstream's humanize.
pub fn disk_row(node: &str, d: &proto::storage::Disk) -> Vec<String> {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let kind = proto::storage::disk::DiskType::try_from(d.r#type)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| "UNKNOWN".into());
    vec![
        node.to_string(),
        dash(&d.device_name),
        dash(&d.model),
        dash(&d.serial),
        kind,
        dash(&d.uuid),
        dash(&d.wwid),
        dash(&d.modalias),
        dash(&d.name),
        machinery::resources::block::pretty_size(d.size),
        dash(&d.bus_path),
        dash(&d.subsystem),
        if d.system_disk { "*" } else { "" }.to_string(),
    ]
}

/// `talosctl disks`: every node's disks (storage.StorageService/Disks).
pub async fn disks(api: &Api, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut c = proto::storage::storage_service_client::StorageServiceClient::new(api.channel()?)
        .max_decoding_message_size(cosi::client::MAX_MESSAGE);
    let mut rows = vec![DISKS_HEADER.map(String::from).to_vec()];
    let mut errors = Vec::new();
    for (label, node) in api.targets() {
        match c.disks(api.for_node((), node.as_deref())?).await {
            Ok(reply) => {
                for m in reply.into_inner().messages {
                    rows.extend(m.disks.iter().map(|d| disk_row(&label, d)));
                }
            }
            Err(s) => errors.push(failed(api, &label, &s)),
        }
    }
    table(out, &rows)?;
    finish(errors)
}
