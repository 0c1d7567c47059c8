//! api-bench: the Talos API (apid, mutual TLS, the node's published port) against the local
//! State socket of the same node, side by side (BENCHMARKS.md, "apid"), and a one-to-many
//! Version (`nodes` metadata) over several nodes. Run by scripts/bench-api.sh on a local
//! cluster, as root: the local socket is the node's stated reached through /proc.
//!
//! Both routes read the same stated: a Get of one resource and a List of 100 (each spec about
//! 200 bytes), one call at a time, after a warm-up; p50 and p99 of each, and the ratio.

#[path = "hist.rs"]
#[allow(dead_code)]
mod hist;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use cosi::{Query, Resource, ResourceDefinition, ResourceSpec};
use hist::Hist;
use serde::{Deserialize, Serialize};

/// The benchmark's arguments.
#[derive(Parser, Debug)]
#[command(about = "apid against the local State socket of the same node; one-to-many Version")]
struct Args {
    /// The talosconfig of the cluster (its context's first endpoint is the node measured).
    #[arg(long)]
    talosconfig: PathBuf,
    /// The same node's stated socket (as root: /proc/<init pid>/root/run/stated/state.sock).
    #[arg(long)]
    socket: PathBuf,
    /// Nodes (IPs) for the one-to-many Version, comma-separated.
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    /// Calls per measurement.
    #[arg(long, default_value_t = 500)]
    rounds: usize,
    /// The node's network namespace (/proc/<init pid>/ns/net): apid is also timed from inside
    /// it (127.0.0.1:50000, no relay), to tell the host relay's share from apid's own.
    #[arg(long)]
    netns: Option<PathBuf>,
}

/// The namespace the benchmark's resources go to (one of the node's, nothing reads this type).
const NS: &str = "apid";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct BenchItem {
    payload: String,
}

impl ResourceSpec for BenchItem {
    const TYPE: &'static str = "BenchItems.bench.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NS;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NS)
    }
}

async fn measure<F, Fut>(rounds: usize, mut f: F) -> anyhow::Result<Hist>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    for _ in 0..rounds.min(50) {
        f().await?;
    }
    let mut h = Hist::default();
    for _ in 0..rounds {
        let t = Instant::now();
        f().await?;
        h.record(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(h)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn row(what: &str, local: &Hist, api: &Hist) {
    let (l50, l99, a50, a99) = (
        local.quantile(0.5),
        local.quantile(0.99),
        api.quantile(0.5),
        api.quantile(0.99),
    );
    println!(
        "| {what} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.2}× |",
        us(l50),
        us(l99),
        us(a50),
        us(a99),
        a50 as f64 / l50.max(1) as f64
    );
}

async fn run(args: Args) -> anyhow::Result<()> {
    let local = cosi::Client::new(&args.socket)?;
    let api = talosctl::api::resolve(&talosctl::api::Selection {
        endpoints: &[],
        nodes: &[],
        talosconfig: &args.talosconfig,
        context: None,
    })?;
    let remote = cosi::Client::over(api.channel()?, "apid");

    local
        .define_types(&[BenchItem::definition()], "")
        .await
        .context("define the benchmark's type")?;
    let payload = "x".repeat(200);
    for i in 0..100 {
        let r = Resource::new(
            NS,
            format!("item-{i:03}"),
            BenchItem {
                payload: payload.clone(),
            },
        )
        .to_raw()?;
        if local
            .get(NS, BenchItem::TYPE, &r.metadata.id)
            .await
            .is_err()
        {
            local.create(&r, "bench").await?;
        }
    }
    // Both routes see the same 100 resources.
    let n = remote
        .list(NS, BenchItem::TYPE, &Query::default())
        .await?
        .len();
    anyhow::ensure!(n == 100, "apid lists {n} resources, not 100");

    let rounds = args.rounds;
    println!(
        "apid vs the local State socket, same node, {rounds} calls each, one at a time \
         ({} CPUs)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!("| call | local p50 | local p99 | apid p50 | apid p99 | apid/local (p50) |");
    println!("|---|---:|---:|---:|---:|---:|");
    let get_local = measure(rounds, || async {
        local.get(NS, BenchItem::TYPE, "item-000").await?;
        Ok(())
    })
    .await?;
    let get_api = measure(rounds, || async {
        remote.get(NS, BenchItem::TYPE, "item-000").await?;
        Ok(())
    })
    .await?;
    row("Get (1 resource)", &get_local, &get_api);
    let list_local = measure(rounds, || async {
        let n = local
            .list(NS, BenchItem::TYPE, &Query::default())
            .await?
            .len();
        anyhow::ensure!(n == 100);
        Ok(())
    })
    .await?;
    let list_api = measure(rounds, || async {
        let n = remote
            .list(NS, BenchItem::TYPE, &Query::default())
            .await?
            .len();
        anyhow::ensure!(n == 100);
        Ok(())
    })
    .await?;
    row("List (100 resources)", &list_local, &list_api);

    if let Some(netns) = &args.netns {
        // The same apid from inside the node's network namespace: no host relay.
        let inside = cosi::Client::over(
            api.channel_via(
                std::net::SocketAddr::from(([127, 0, 0, 1], 50000)),
                sandbox::netns::dial_in(Ok(netns.clone()), Duration::from_secs(5)),
            )?,
            "apid in the node",
        );
        let get_inside = measure(rounds, || async {
            inside.get(NS, BenchItem::TYPE, "item-000").await?;
            Ok(())
        })
        .await?;
        let list_inside = measure(rounds, || async {
            let n = inside
                .list(NS, BenchItem::TYPE, &Query::default())
                .await?
                .len();
            anyhow::ensure!(n == 100);
            Ok(())
        })
        .await?;
        println!();
        println!(
            "| call (p50) | local socket | apid, in the node | apid, published port | apid's own | the relay's |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for (what, local, inside, published) in [
            ("Get (1 resource)", &get_local, &get_inside, &get_api),
            ("List (100 resources)", &list_local, &list_inside, &list_api),
        ] {
            let (l, i, p) = (
                us(local.quantile(0.5)),
                us(inside.quantile(0.5)),
                us(published.quantile(0.5)),
            );
            println!(
                "| {what} | {l:.0} µs | {i:.0} µs ({:.2}×) | {p:.0} µs ({:.2}×) | +{:.0} µs | +{:.0} µs |",
                i / l,
                p / l,
                i - l,
                p - i
            );
        }
    }

    if !args.nodes.is_empty() {
        use proto::machine::machine_service_client::MachineServiceClient;
        let machine = MachineServiceClient::new(api.channel()?);
        let want = args.nodes.len();
        let nodes = &args.nodes;
        let one = measure(rounds / 5, || {
            let mut m = machine.clone();
            async move {
                m.version(()).await?;
                Ok(())
            }
        })
        .await?;
        let many = measure(rounds / 5, || {
            let mut req = tonic::Request::new(());
            for n in nodes {
                if let Ok(v) = n.parse() {
                    req.metadata_mut().append("nodes", v);
                }
            }
            let mut m = machine.clone();
            async move {
                let reply = m.version(req).await?.into_inner();
                let ok = reply
                    .messages
                    .iter()
                    .filter(|m| m.metadata.as_ref().is_none_or(|md| md.error.is_empty()))
                    .count();
                anyhow::ensure!(ok == want, "{ok} nodes answered");
                Ok(())
            }
        })
        .await?;
        println!();
        println!(
            "| Version | p50 | p99 |\n|---|---:|---:|\n| the endpoint alone | {:.0} µs | {:.0} µs |\n| one-to-many, {} nodes (`nodes`) | {:.0} µs | {:.0} µs |",
            us(one.quantile(0.5)),
            us(one.quantile(0.99)),
            args.nodes.len(),
            us(many.quantile(0.5)),
            us(many.quantile(0.99)),
        );
    }
    for i in 0..100 {
        let _ = local
            .destroy(NS, BenchItem::TYPE, &format!("item-{i:03}"), "bench")
            .await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("api-bench: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("api-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
