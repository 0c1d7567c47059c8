//! `talosctl services` and `talosctl service <id> [status|start|stop|restart]`: the daemons and
//! requested services of the node, through init's control socket (`--init-socket`, root only).

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use proto::init::init_client::InitClient;
use proto::init::{ListRequest, Service, ServiceRequest};
use tonic::transport::Channel;

/// Where init's control socket is on a node.
pub const DEFAULT_INIT_SOCKET: &str = "/run/init/init.sock";

/// A client of init's control socket at `path` (connects on first use).
pub fn connect(path: &Path) -> anyhow::Result<InitClient<Channel>> {
    let channel = cosi::unix_channel(path);
    Ok(InitClient::new(channel))
}

/// A gRPC failure of init, with the socket named.
pub fn call_error(path: &Path, what: &str, status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(
        "{what} (init at {}): {}",
        path.display(),
        if status.message().is_empty() {
            format!("{:?}", status.code())
        } else {
            status.message().to_string()
        }
    )
}

/// Prints rows as columns aligned with a padding of 3, as the rest of talosctl.
pub fn table(out: &mut dyn Write, rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(x) => *x = (*x).max(w),
                None => widths.push(w),
            }
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

fn row(s: &Service) -> Vec<String> {
    vec![
        s.id.clone(),
        s.kind.clone(),
        s.state.clone(),
        if s.healthy { "OK" } else { "?" }.to_string(),
        if s.pid == 0 {
            "-".to_string()
        } else {
            s.pid.to_string()
        },
        s.restarts.to_string(),
        if s.last_exit.is_empty() {
            "-".to_string()
        } else {
            s.last_exit.clone()
        },
        s.message.clone(),
    ]
}

const HEADER: [&str; 8] = [
    "SERVICE",
    "KIND",
    "STATE",
    "HEALTH",
    "PID",
    "RESTARTS",
    "LAST EXIT",
    "MESSAGE",
];

/// `talosctl services`: every daemon and service.
pub async fn list(path: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut client = connect(path)?;
    let list = client
        .list(ListRequest {})
        .await
        .map_err(|s| call_error(path, "cannot list services", s))?
        .into_inner();
    let mut rows = vec![HEADER.iter().map(|h| h.to_string()).collect()];
    rows.extend(list.services.iter().map(row));
    table(out, &rows)?;
    Ok(())
}

/// What to do with one service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Show its state.
    #[default]
    Status,
    /// Start it (a stopped or failed one; resets its crash-loop count).
    Start,
    /// Stop it: SIGTERM, then SIGKILL after its grace period.
    Stop,
    /// Stop and start exactly this one, in place.
    Restart,
}

/// Arguments of `service`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// A daemon name (`networkd`) or requested service ID.
    pub id: String,
    /// What to do.
    #[arg(value_enum, default_value_t = Action::Status)]
    pub action: Action,
}

/// `talosctl service <id> [action]`.
pub async fn service(path: &Path, args: &ServiceArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut client = connect(path)?;
    let req = ServiceRequest {
        id: args.id.clone(),
    };
    let s = match args.action {
        Action::Status => client
            .list(ListRequest {})
            .await
            .map_err(|s| call_error(path, "cannot list services", s))?
            .into_inner()
            .services
            .into_iter()
            .find(|s| s.id == args.id)
            .with_context(|| format!("no daemon or service {:?}", args.id))?,
        action => {
            let reply = match action {
                Action::Start => client.start(req).await,
                Action::Stop => client.stop(req).await,
                _ => client.restart(req).await,
            };
            let verb = format!("{action:?}").to_lowercase();
            reply
                .map_err(|s| call_error(path, &format!("cannot {verb} {}", args.id), s))?
                .into_inner()
                .service
                .unwrap_or_default()
        }
    };
    let fields = [
        ("ID", s.id.clone()),
        ("KIND", s.kind.clone()),
        ("REQUESTED BY", s.requested_by.clone()),
        ("STATE", s.state.clone()),
        ("READY", s.ready.to_string()),
        ("HEALTH", if s.healthy { "OK" } else { "?" }.to_string()),
        ("PID", s.pid.to_string()),
        ("RESTARTS", s.restarts.to_string()),
        ("LAST EXIT", s.last_exit.clone()),
        ("MESSAGE", s.message.clone()),
    ];
    let rows: Vec<Vec<String>> = fields
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| vec![k.to_string(), v.clone()])
        .collect();
    table(out, &rows)?;
    Ok(())
}
