//! The etcd side: Debian's etcd started as a single member on 127.0.0.1 with its data directory
//! in the tmpfs directory (default durability: etcd fsyncs its WAL, here on tmpfs), driven
//! through its own gRPC API (KV.Put, KV.Range, Watch.Watch) with the same tonic stack as stated.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::procs::{free_port, ChildGuard};
use crate::workload::{make_spec, RunCtx, WatchStats};

/// etcd's API, generated from the subset in `proto/`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    /// `mvccpb`: keys, values, events.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// `etcdserverpb`: the KV and Watch services.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
}

use pb::etcdserverpb::kv_client::KvClient;
use pb::etcdserverpb::watch_client::WatchClient;
use pb::etcdserverpb::watch_request::RequestUnion;
use pb::etcdserverpb::{PutRequest, RangeRequest, WatchCreateRequest, WatchRequest};

/// Key prefix of the items updated in the throughput runs.
pub const ITEMS: &str = "/bench/items/";
/// Key prefix of the items listed and held for the memory figure.
pub const LIST: &str = "/bench/list/";

/// Largest response the client accepts (a Range of 100k keys is one message).
const MAX_MESSAGE: usize = 1 << 30;

/// Where etcd's client API listens.
#[derive(Clone, Debug)]
pub struct Addr {
    /// `http://127.0.0.1:PORT` or `unix://localhost:PORT`.
    pub url: String,
    /// The socket, for a Unix socket listener.
    pub unix: Option<PathBuf>,
}

/// A running etcd.
pub struct Etcd {
    /// The process.
    pub guard: ChildGuard,
    /// Its client API.
    pub endpoint: Addr,
    /// Its data directory.
    pub data_dir: PathBuf,
}

/// The key of item `i` under `prefix`.
pub fn key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}{i:07}").into_bytes()
}

/// The end of the range of all keys starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// Starts `bin` as a single-member cluster with its data in `dir` and waits until it answers.
/// Clients connect over TCP on 127.0.0.1, or with `unix` over a Unix socket in `dir`.
pub async fn start(bin: &Path, dir: &Path, unix: bool) -> Result<Etcd> {
    let data_dir = dir.join("etcd");
    let client_port = free_port()?;
    let mut peer_port = free_port()?;
    while peer_port == client_port {
        peer_port = free_port()?;
    }
    // etcd names a Unix socket listener after the URL's host:port, relative to its directory.
    let (client_url, socket) = if unix {
        (
            format!("unix://localhost:{client_port}"),
            Some(dir.join(format!("localhost:{client_port}"))),
        )
    } else {
        (format!("http://127.0.0.1:{client_port}"), None)
    };
    let addr = Addr {
        url: client_url.clone(),
        unix: socket,
    };
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .current_dir(dir)
        .arg("--name=bench")
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=bench={peer_url}"))
        .arg("--initial-cluster-state=new")
        .arg("--logger=zap")
        .arg("--log-outputs=stderr")
        .arg("--log-level=warn");
    let mut guard = ChildGuard::spawn("etcd", cmd, dir.join("etcd.log"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        guard.check_alive()?;
        let ok = match channel(&addr).await {
            Ok(ch) => KvClient::new(ch)
                .range(RangeRequest {
                    key: key(ITEMS, 0),
                    ..Default::default()
                })
                .await
                .is_ok(),
            Err(_) => false,
        };
        if ok {
            break;
        }
        if Instant::now() > deadline {
            bail!("etcd did not answer on {client_url} within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Etcd {
        guard,
        endpoint: addr,
        data_dir,
    })
}

/// A new connection to etcd.
pub async fn channel(addr: &Addr) -> Result<Channel> {
    let err = || format!("connect to etcd at {}", addr.url);
    if let Some(path) = &addr.unix {
        let path = path.clone();
        return Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(2))
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }))
            .await
            .with_context(err);
    }
    Endpoint::from_shared(addr.url.clone())
        .context("endpoint")?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .with_context(err)
}

fn kv(ch: Channel) -> KvClient<Channel> {
    KvClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// Puts keys `0..n` under `prefix` with `concurrency` connections.
pub async fn load(
    endpoint: &Addr,
    prefix: &'static str,
    n: usize,
    concurrency: usize,
    spec_size: usize,
) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..concurrency {
        let mut client = kv(channel(endpoint).await?);
        tasks.spawn(async move {
            for i in (t..n).step_by(concurrency) {
                client
                    .put(PutRequest {
                        key: key(prefix, i),
                        value: make_spec(i as u64, 0, spec_size),
                        ..Default::default()
                    })
                    .await
                    .with_context(|| format!("etcd: put {prefix}{i}"))?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("load task")??;
    }
    Ok(())
}

/// Puts `keys` under [`ITEMS`] round-robin, one at a time, until the run stops.
pub async fn writer(endpoint: Addr, keys: Vec<usize>, ctx: Arc<RunCtx>) -> Result<()> {
    let mut client = kv(channel(&endpoint).await?);
    let mut k = 0;
    let mut pacer = ctx.pacer();
    loop {
        pacer.wait().await;
        let Some(u) = ctx.begin() else { break };
        client
            .put(PutRequest {
                key: key(ITEMS, keys[k]),
                value: make_spec(u, ctx.now(), ctx.spec_size),
                ..Default::default()
            })
            .await
            .context("etcd: put")?;
        ctx.ack(u);
        k = (k + 1) % keys.len();
    }
    Ok(())
}

/// A watch on the [`ITEMS`] prefix on its own connection and stream; says `ready` once created,
/// then records every event until it has seen all updates, or none came for `drain` after the
/// writers stopped.
pub async fn watcher(
    endpoint: Addr,
    ctx: Arc<RunCtx>,
    ready: oneshot::Sender<()>,
    drain: Duration,
) -> Result<WatchStats> {
    let mut client = WatchClient::new(channel(&endpoint).await?)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    // The request side stays open for the life of the watch: closing it ends the stream.
    let (tx, rx) = mpsc::channel(1);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: ITEMS.as_bytes().to_vec(),
            range_end: prefix_end(ITEMS),
            ..Default::default()
        })),
    })
    .await
    .context("etcd watch: queue create request")?;
    let mut stream = client
        .watch(ReceiverStream::new(rx))
        .await
        .context("etcd: watch")?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(30), stream.message()).await {
        Ok(Ok(Some(r))) if r.created => {}
        Ok(Ok(Some(r))) => bail!("etcd watch: expected created, got {r:?}"),
        Ok(Ok(None)) => bail!("etcd watch ended"),
        Ok(Err(s)) => return Err(s).context("etcd watch"),
        Err(_) => bail!("etcd watch not created within 30 s"),
    }
    let _ = ready.send(());
    let mut stats = WatchStats::default();
    let mut last = Instant::now();
    while !stats.done(&ctx) {
        match tokio::time::timeout(Duration::from_millis(100), stream.message()).await {
            Ok(Ok(Some(r))) => {
                let recv = ctx.now();
                if r.canceled {
                    bail!("etcd watch canceled: {}", r.cancel_reason);
                }
                for e in &r.events {
                    if let Some(kv) = &e.kv {
                        stats.record(&ctx, &kv.value, recv);
                    }
                }
                last = Instant::now();
            }
            Ok(Ok(None)) => bail!("etcd watch ended"),
            Ok(Err(s)) => return Err(s).context("etcd watch"),
            Err(_) => {
                if ctx.expected.load(std::sync::atomic::Ordering::Relaxed) != u64::MAX
                    && last.elapsed() > drain
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    Ok(stats)
}

/// Ranges over the [`LIST`] prefix (one linearizable Range, as `etcdctl get --prefix`): time and
/// number of keys.
pub async fn list(endpoint: &Addr) -> Result<(Duration, usize)> {
    let mut client = kv(channel(endpoint).await?);
    client
        .range(RangeRequest {
            key: key(ITEMS, 0),
            ..Default::default()
        })
        .await
        .context("etcd: connect")?;
    let t = Instant::now();
    let resp = client
        .range(RangeRequest {
            key: LIST.as_bytes().to_vec(),
            range_end: prefix_end(LIST),
            ..Default::default()
        })
        .await
        .context("etcd: range")?
        .into_inner();
    Ok((t.elapsed(), resp.kvs.len()))
}
