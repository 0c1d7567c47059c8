//! The stated side: the release binary started standalone on a socket in the tmpfs directory,
//! driven through `cosi::Client` (the client library every talos-rs daemon uses).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use cosi::{Client, EventKind, Metadata, Query, RawResource, WatchSpec};
use tokio::sync::oneshot;

use crate::procs::ChildGuard;
use crate::workload::{make_spec, RunCtx, WatchStats};

/// Namespace of the bench resources.
pub const NS: &str = "bench";
/// Type of the resources updated in the throughput runs.
pub const ITEMS: &str = "BenchItems.bench.talos.dev";
/// Type of the resources listed and held for the memory figure.
pub const LIST: &str = "BenchListItems.bench.talos.dev";
/// Owner of the bench resources.
pub const OWNER: &str = "broker-bench";

/// A running stated.
pub struct Stated {
    /// The process.
    pub guard: ChildGuard,
    /// Its socket.
    pub socket: PathBuf,
    /// Its state and run directories' parent.
    pub dir: PathBuf,
}

/// The ID of resource `i`.
pub fn id(i: usize) -> String {
    format!("item-{i:07}")
}

/// Starts `bin` standalone with everything under `dir` and waits until it answers.
pub async fn start(bin: &Path, dir: &Path) -> Result<Stated> {
    let dir = dir.join("stated");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let socket = dir.join("state.sock");
    let mut cmd = Command::new(bin);
    cmd.arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .env("RUST_LOG", "warn");
    let mut guard = ChildGuard::spawn("stated", cmd, dir.join("stated.log"))?;
    let client = Client::new(&socket)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        guard.check_alive()?;
        if socket.exists() && client.list(NS, ITEMS, &Query::default()).await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("stated did not answer on {} within 15 s", socket.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Stated { guard, socket, dir })
}

fn resource(ty: &str, id: String, version: u64, spec: Vec<u8>) -> RawResource {
    let mut metadata = Metadata::new(NS, ty, id);
    metadata.version = version;
    RawResource {
        metadata,
        spec,
        yaml_spec: String::new(),
    }
}

/// Creates resources `0..n` of `ty` with `concurrency` clients.
pub async fn load(
    socket: &Path,
    ty: &'static str,
    n: usize,
    concurrency: usize,
    spec_size: usize,
) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..concurrency {
        let client = Client::new(socket)?;
        tasks.spawn(async move {
            for i in (t..n).step_by(concurrency) {
                let r = resource(ty, id(i), 0, make_spec(i as u64, 0, spec_size));
                client
                    .create(&r, OWNER)
                    .await
                    .with_context(|| format!("stated: create {ty}/{}", id(i)))?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("load task")??;
    }
    Ok(())
}

/// Updates `keys` of [`ITEMS`] round-robin, one at a time with version compare-and-set, until
/// the run stops.
pub async fn writer(socket: PathBuf, keys: Vec<usize>, ctx: Arc<RunCtx>) -> Result<()> {
    let client = Client::new(&socket)?;
    let mut versions = Vec::with_capacity(keys.len());
    for &k in &keys {
        let cur = client
            .get(NS, ITEMS, &id(k))
            .await
            .with_context(|| format!("stated: get {}", id(k)))?;
        versions.push(cur.metadata.version);
    }
    let mut k = 0;
    let mut pacer = ctx.pacer();
    loop {
        pacer.wait().await;
        let Some(u) = ctx.begin() else { break };
        let r = resource(
            ITEMS,
            id(keys[k]),
            versions[k],
            make_spec(u, ctx.now(), ctx.spec_size),
        );
        let stored = client
            .update(&r, OWNER, None)
            .await
            .with_context(|| format!("stated: update {}", r.metadata.id))?;
        ctx.ack(u);
        versions[k] = stored.metadata.version;
        k = (k + 1) % keys.len();
    }
    Ok(())
}

/// A kind watch on [`ITEMS`]; says `ready` once established, then records every update event
/// until it has seen all of them, or none came for `drain` after the writers stopped.
pub async fn watcher(
    socket: PathBuf,
    ctx: Arc<RunCtx>,
    ready: oneshot::Sender<()>,
    drain: Duration,
    omit_old: bool,
) -> Result<WatchStats> {
    let client = Client::new(&socket)?;
    let mut watch = client.watch(WatchSpec {
        namespace: NS.into(),
        r#type: ITEMS.into(),
        bootstrap_bookmark: true,
        omit_old,
        ..Default::default()
    });
    match tokio::time::timeout(Duration::from_secs(30), watch.next()).await {
        Ok(Some(Ok(e))) if e.kind == EventKind::Noop => {}
        Ok(Some(Ok(e))) => bail!(
            "stated watch: expected the bookmark first, got {:?}",
            e.kind
        ),
        Ok(Some(Err(e))) => return Err(e).context("stated watch"),
        Ok(None) => bail!("stated watch ended"),
        Err(_) => bail!("stated watch not established within 30 s"),
    }
    let _ = ready.send(());
    let mut stats = WatchStats::default();
    let mut last = Instant::now();
    while !stats.done(&ctx) {
        match tokio::time::timeout(Duration::from_millis(100), watch.next_batch()).await {
            Ok(Some(Ok(batch))) => {
                let recv = ctx.now();
                for e in &batch {
                    if e.kind == EventKind::Updated {
                        stats.record(&ctx, &e.resource.spec, recv);
                    }
                }
                last = Instant::now();
            }
            Ok(Some(Err(e))) => return Err(e).context("stated watch"),
            Ok(None) => bail!("stated watch ended"),
            Err(_) => {
                if ctx.expected.load(std::sync::atomic::Ordering::Relaxed) != u64::MAX
                    && last.elapsed() > drain
                {
                    break;
                }
            }
        }
    }
    Ok(stats)
}

/// Lists [`LIST`]: time and number of resources.
pub async fn list(socket: &Path) -> Result<(Duration, usize)> {
    let client = Client::new(socket)?;
    client
        .list(NS, ITEMS, &Query::default())
        .await
        .context("stated: connect")?;
    let t = Instant::now();
    let items = client
        .list(NS, LIST, &Query::default())
        .await
        .context("stated: list")?;
    Ok((t.elapsed(), items.len()))
}
