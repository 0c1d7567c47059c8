//! Node start and restart figures for BENCHMARKS.md ("Node start and restart (init)").
//!
//! ```text
//! cargo build --release -p init -p stated -p networkd -p secretsd -p trustd -p apid --bins --examples
//! target/release/examples/node_bench [RUNS]
//! ```
//!
//! Needs root. Each run boots a node with the shipped manifest (every daemon of it) from
//! `target/release` with `init::testing` and measures, from the spawn of init (through
//! `setpriv` and `unshare`, a few milliseconds) to every daemon healthy as init's control
//! socket reports it (polled every 2 ms):
//! - node start, container mode (init is PID 1 of new PID, mount and network namespaces) and
//!   development mode (not PID 1, own network namespace);
//! - kill -9 of a daemon → the daemon ready again (restart backoff set to 1 ms for this, so
//!   the figure is the restart itself; the shipped policy waits 100 ms before the first
//!   restart);
//! - idle RSS of every daemon (VmRSS after 5 s idle), and their sum.
use std::time::{Duration, Instant};

use init::testing::{Node, NodeMode};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn healthy(node: &Node, ids: &[&str], timeout: Duration) -> Vec<proto::init::Service> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(list) = node.list().await {
            if ids
                .iter()
                .all(|id| list.iter().any(|s| s.id == *id && s.healthy && s.pid != 0))
            {
                return list;
            }
        }
        assert!(
            Instant::now() < deadline,
            "node not healthy:\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn builder() -> init::testing::NodeBuilder {
    Node::builder().edit(
        "    stopTimeoutMs: 10000\n",
        "    stopTimeoutMs: 10000\n    restart: {backoffMs: 1, maxBackoffMs: 1}\n",
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !init::testing::is_root() {
        eprintln!("node_bench needs root");
        std::process::exit(1);
    }
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let daemons = [
        "stated", "networkd", "blockd", "secretsd", "trustd", "apid", "k8sd",
    ];
    let t = Duration::from_secs(60);
    println!("binaries: {}", init::testing::target_dir().display());

    for mode in [NodeMode::Container, NodeMode::Dev] {
        let mut starts = Vec::new();
        for _ in 0..runs {
            let node = builder().mode(mode).start();
            healthy(&node, &daemons, t).await;
            starts.push(node.started.elapsed().as_secs_f64() * 1000.0);
        }
        println!(
            "start {mode:?}: median {:.1} ms, p90 {:.1} ms ({runs} runs)",
            percentile(&mut starts.clone(), 0.5),
            percentile(&mut starts, 0.9)
        );
    }

    let node = builder().start();
    healthy(&node, &daemons, t).await;
    for d in daemons {
        let mut times = Vec::new();
        for _ in 0..runs {
            let old = node.service(d).await.expect("listed");
            let host = node.host_pid(old.pid).expect("host pid");
            let t0 = Instant::now();
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(host),
                nix::sys::signal::Signal::SIGKILL,
            );
            loop {
                if let Some(s) = node.service(d).await {
                    if s.healthy && s.pid != old.pid && s.pid != 0 {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            times.push(t0.elapsed().as_secs_f64() * 1000.0);
            // Let the other daemons reconnect before the next kill.
            healthy(&node, &daemons, t).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "kill -9 {d} -> ready: median {:.1} ms, p90 {:.1} ms ({runs} runs)",
            percentile(&mut times.clone(), 0.5),
            percentile(&mut times, 0.9)
        );
    }
    drop(node);

    let node = builder().start();
    let list = healthy(&node, &daemons, t).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut sum = 0;
    for d in daemons {
        let pid = list.iter().find(|s| s.id == d).expect("listed").pid;
        let kib = rss_kib(node.host_pid(pid).expect("host pid"));
        sum += kib;
        println!("idle RSS {d}: {:.1} MiB", kib as f64 / 1024.0);
    }
    println!("idle RSS daemons total: {:.1} MiB", sum as f64 / 1024.0);
    let init = rss_kib(node.init_host_pid().expect("init"));
    println!(
        "idle RSS init (not a daemon): {:.1} MiB; with init: {:.1} MiB",
        init as f64 / 1024.0,
        (sum + init) as f64 / 1024.0
    );
}
