//! broker-bench: stated against etcd, side by side in one run on the same machine.
//!
//! Both brokers run as separate processes with their data on tmpfs, are driven by this process
//! over their own APIs with the same tonic gRPC stack, and get the same workload:
//!
//! 1. Memory and List: on fresh servers, create `--list-size` resources of `--spec-size`-byte
//!    specs, read the servers' RSS (`/proc/PID/status`), then time a List of all of them.
//! 2. Updates: on fresh servers, `--writers` tasks (each its own connection) update `--keys`
//!    existing resources one at a time (stated: Update with version CAS; etcd: Put) for
//!    `--duration` seconds after `--warmup`, while W kind watchers (each its own connection and
//!    watch stream) receive the events. Reported: acknowledged updates/s, and per event the
//!    latency from the writer seeing the update acknowledged to a watcher receiving it (and from
//!    sending it). Then the same with one writer paced at `--latency-rate`, for latency below
//!    saturation.
//!
//! The machine is shared: each run first waits for the rest of it to be quiet, and reports the
//! CPU used by the server, by this process, by softirq (loopback TCP) and by everything else.
#![forbid(unsafe_code)]

mod etcd;
mod hist;
mod procs;
mod stated;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use serde_json::json;
use tokio::task::JoinSet;

use crate::hist::Hist;
use crate::procs::{dir_usage, loadavg, Mem};
use crate::workload::{RunCtx, WatchStats};

/// Benchmark of the stated resource broker against etcd, run side by side.
#[derive(Parser, Debug, Clone)]
#[command(version, about, long_about = None)]
struct Args {
    /// The stated binary (a release build).
    #[arg(long, default_value = "target/release/stated")]
    stated: PathBuf,
    /// The etcd binary (Debian: etcd-server).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// A directory on tmpfs for sockets and both brokers' data.
    #[arg(long, default_value = "/dev/shm")]
    tmpfs: PathBuf,
    /// Writer tasks (each its own connection, one update in flight).
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Numbers of kind watchers to run the update benchmark with.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    watchers: Vec<usize>,
    /// Resources updated round-robin by the writers.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Bytes of each spec (etcd: value).
    #[arg(long, default_value_t = 200)]
    spec_size: usize,
    /// Seconds measured per update run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of updates before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Repetitions of every update run (alternating which broker goes first); the summary takes
    /// the median throughput and the latency over all repetitions.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Resources created for the List and memory figures (0 skips them).
    #[arg(long, default_value_t = 100_000)]
    list_size: usize,
    /// Times each List is repeated (the median is reported).
    #[arg(long, default_value_t = 3)]
    list_repeat: usize,
    /// Concurrent clients creating the List resources.
    #[arg(long, default_value_t = 16)]
    load_concurrency: usize,
    /// Total rates (updates/s) of the latency runs: the `--writers` writers paced (open loop)
    /// to share each rate, with the same watcher counts, so both brokers are compared at the
    /// same load below saturation (empty or 0 skips them).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    latency_rate: Vec<u32>,
    /// Let etcd serve clients on a Unix socket instead of 127.0.0.1 (a diagnostic: same
    /// transport as stated; etcd's usual clients use TCP).
    #[arg(long)]
    etcd_unix: bool,
    /// stated's watchers ask for the old resource with every update, as COSI sends it by
    /// default. Without this flag they set `omit_old`, as the node's controller runtime does,
    /// which matches etcd's watchers here (no `prev_kv`: no previous value).
    #[arg(long)]
    stated_with_old: bool,
    /// Before each run, wait up to this many seconds for the rest of the machine to be quiet
    /// (under 0.25 cores busy over one second); the busy CPU of others is reported per run.
    #[arg(long, default_value_t = 60.0)]
    quiet_wait: f64,
    /// Seconds a watcher waits for missing events after the writers stopped.
    #[arg(long, default_value_t = 5.0)]
    drain: f64,
    /// Also write the machine-readable summary to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Stated,
    Etcd,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Stated => "stated",
            System::Etcd => "etcd",
        }
    }
}

/// Both brokers, fresh, with their files in one temporary tmpfs directory. Fields drop in order:
/// the processes are stopped before the directory is removed.
struct Servers {
    stated: stated::Stated,
    etcd: etcd::Etcd,
    _dir: tempfile::TempDir,
}

impl Servers {
    async fn start(args: &Args) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("broker-bench")
            .tempdir_in(&args.tmpfs)
            .with_context(|| format!("temporary directory in {}", args.tmpfs.display()))?;
        let stated = stated::start(&args.stated, dir.path()).await?;
        let etcd = etcd::start(&args.etcd, dir.path(), args.etcd_unix).await?;
        Ok(Self {
            stated,
            etcd,
            _dir: dir,
        })
    }

    fn pid(&self, sys: System) -> u32 {
        match sys {
            System::Stated => self.stated.guard.pid(),
            System::Etcd => self.etcd.guard.pid(),
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        self.stated.guard.check_alive()?;
        self.etcd.guard.check_alive()
    }

    fn stop(mut self) {
        self.stated.guard.stop();
        self.etcd.guard.stop();
    }
}

/// CPU seconds used so far by the whole machine (all CPUs): busy (everything but idle and
/// iowait) and, of that, softirq (where the kernel's loopback TCP processing is accounted).
fn machine_cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (f64::NAN, f64::NAN);
    };
    // user nice system idle iowait irq softirq steal
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let busy: u64 = f
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, v)| v)
        .sum();
    let softirq = f.get(6).copied().unwrap_or(0);
    (busy as f64 / 100.0, softirq as f64 / 100.0)
}

/// Waits until the machine is quiet (under 0.25 cores busy over a second) or `max` has passed;
/// returns the last busy figure. Both brokers are idle between runs, so this is everyone else.
async fn wait_quiet(max: f64) -> f64 {
    let start = Instant::now();
    loop {
        let (b0, _) = machine_cpu_seconds();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy = machine_cpu_seconds().0 - b0;
        if busy < 0.25 || start.elapsed().as_secs_f64() >= max {
            if busy >= 0.25 {
                eprintln!("    (machine still busy: {busy:.2} cores used by others)");
            }
            return busy;
        }
    }
}

/// CPU seconds (user + system) used so far by `pid` (USER_HZ = 100 on Linux).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

// ---------------------------------------------------------------------------------------------
// Phase 1: memory and List.

struct ListResult {
    load_secs: f64,
    mem_idle: Mem,
    mem_loaded: Mem,
    mem_after_list: Mem,
    list_secs: Vec<f64>,
    listed: usize,
    data_bytes: u64,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

async fn load(
    args: &Args,
    s: &Servers,
    sys: System,
    n: usize,
    stated_ty: &'static str,
    etcd_prefix: &'static str,
    conc: usize,
) -> Result<f64> {
    let t = Instant::now();
    match sys {
        System::Stated => {
            stated::load(&s.stated.socket, stated_ty, n, conc, args.spec_size).await?
        }
        System::Etcd => etcd::load(&s.etcd.endpoint, etcd_prefix, n, conc, args.spec_size).await?,
    }
    Ok(t.elapsed().as_secs_f64())
}

async fn phase_list(args: &Args) -> Result<[ListResult; 2]> {
    let mut s = Servers::start(args).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut out = Vec::new();
    for sys in [System::Stated, System::Etcd] {
        let mem_idle = Mem::of(s.pid(sys))?;
        eprintln!(
            "[list] {}: creating {} resources",
            sys.name(),
            args.list_size
        );
        let load_secs = load(
            args,
            &s,
            sys,
            args.list_size,
            stated::LIST,
            etcd::LIST,
            args.load_concurrency,
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mem_loaded = Mem::of(s.pid(sys))?;
        out.push(ListResult {
            load_secs,
            mem_idle,
            mem_loaded,
            mem_after_list: Mem::default(),
            list_secs: Vec::new(),
            listed: 0,
            data_bytes: 0,
        });
    }
    for _ in 0..args.list_repeat.max(1) {
        for (i, sys) in [System::Stated, System::Etcd].into_iter().enumerate() {
            let (d, n) = match sys {
                System::Stated => stated::list(&s.stated.socket).await?,
                System::Etcd => etcd::list(&s.etcd.endpoint).await?,
            };
            if n != args.list_size {
                bail!(
                    "{}: listed {n} resources, expected {}",
                    sys.name(),
                    args.list_size
                );
            }
            out[i].list_secs.push(d.as_secs_f64());
            out[i].listed = n;
        }
    }
    for (i, sys) in [System::Stated, System::Etcd].into_iter().enumerate() {
        out[i].mem_after_list = Mem::of(s.pid(sys))?;
    }
    out[0].data_bytes = dir_usage(&s.stated.dir);
    out[1].data_bytes = dir_usage(&s.etcd.data_dir);
    s.check_alive()?;
    s.stop();
    let mut it = out.into_iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => bail!("missing list results"),
    }
}

// ---------------------------------------------------------------------------------------------
// Phase 2: updates with watchers.

/// How the writers go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `--writers` writers, each as fast as its updates are acknowledged.
    Throughput,
    /// `--writers` writers paced to this many updates/s in total.
    Paced(u32),
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Throughput => "throughput".into(),
            Mode::Paced(rate) => format!("paced {rate}/s"),
        }
    }
}

struct RunResult {
    sys: System,
    mode: Mode,
    watchers: usize,
    round: usize,
    updates_per_sec: f64,
    measured_updates: u64,
    total_updates: u64,
    /// Fewest update events any watcher received, of `total_updates`.
    min_delivered: u64,
    before_ack: u64,
    foreign: u64,
    ack_to_event: Hist,
    send_to_event: Hist,
    server_cpu: f64,
    bench_cpu: f64,
    /// CPU in softirq during the measured window (cores): the kernel's loopback TCP work.
    softirq_cpu: f64,
    /// CPU used by everything else on the machine during the measured window (cores).
    other_cpu: f64,
    load_before: f64,
    load_after: f64,
}

async fn run_updates(
    args: &Args,
    s: &mut Servers,
    sys: System,
    watchers: usize,
    round: usize,
    mode: Mode,
) -> Result<RunResult> {
    let (writers, pace) = match mode {
        Mode::Throughput => (args.writers.clamp(1, args.keys), None),
        Mode::Paced(rate) => {
            let writers = args.writers.clamp(1, args.keys);
            (
                writers,
                Some(Duration::from_secs_f64(
                    writers as f64 / f64::from(rate.max(1)),
                )),
            )
        }
    };
    wait_quiet(args.quiet_wait).await;
    let ctx = Arc::new(RunCtx::new(args.spec_size, pace));
    let drain = Duration::from_secs_f64(args.drain);
    let load_before = loadavg();
    let mut watch_tasks: JoinSet<Result<WatchStats>> = JoinSet::new();
    let mut readies = Vec::new();
    for _ in 0..watchers {
        let (tx, rx) = tokio::sync::oneshot::channel();
        readies.push(rx);
        let ctx = ctx.clone();
        match sys {
            System::Stated => watch_tasks.spawn(stated::watcher(
                s.stated.socket.clone(),
                ctx,
                tx,
                drain,
                !args.stated_with_old,
            )),
            System::Etcd => {
                watch_tasks.spawn(etcd::watcher(s.etcd.endpoint.clone(), ctx, tx, drain))
            }
        };
    }
    for rx in readies {
        tokio::select! {
            r = rx => if r.is_err() {
                // The watcher failed before it was established: its error says why.
                while let Some(r) = watch_tasks.join_next().await {
                    r.context("watcher task")??;
                }
                bail!("a watcher stopped before it was established");
            },
            _ = tokio::time::sleep(Duration::from_secs(60)) => bail!("watchers not established within 60 s"),
        }
    }
    let mut write_tasks: JoinSet<Result<()>> = JoinSet::new();
    for w in 0..writers {
        let keys: Vec<usize> = (w..args.keys).step_by(writers).collect();
        let ctx = ctx.clone();
        match sys {
            System::Stated => write_tasks.spawn(stated::writer(s.stated.socket.clone(), keys, ctx)),
            System::Etcd => write_tasks.spawn(etcd::writer(s.etcd.endpoint.clone(), keys, ctx)),
        };
    }
    let pid = s.pid(sys);
    let me = std::process::id();
    let measured = async {
        tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
        ctx.measure_from
            .store(ctx.next.load(Ordering::Relaxed), Ordering::Relaxed);
        let a0 = ctx.acked.load(Ordering::Relaxed);
        let (c0, b0, m0) = (cpu_seconds(pid), cpu_seconds(me), machine_cpu_seconds());
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
        let a1 = ctx.acked.load(Ordering::Relaxed);
        let secs = t0.elapsed().as_secs_f64();
        let (c1, b1, m1) = (cpu_seconds(pid), cpu_seconds(me), machine_cpu_seconds());
        ctx.stop.store(true, Ordering::Relaxed);
        let (server, bench) = ((c1 - c0) / secs, (b1 - b0) / secs);
        let softirq = (m1.1 - m0.1) / secs;
        let others = ((m1.0 - m0.0) / secs - server - bench - softirq).max(0.0);
        (a1 - a0, secs, server, bench, softirq, others)
    };
    // A writer that fails ends the run at once (the JoinSets abort the other tasks on drop).
    let (measured_updates, secs, server_cpu, bench_cpu, softirq_cpu, other_cpu) = tokio::select! {
        m = measured => m,
        Some(r) = write_tasks.join_next() => {
            r.context("writer task")??;
            bail!("a writer stopped early");
        }
    };
    while let Some(r) = write_tasks.join_next().await {
        r.context("writer task")??;
    }
    let total_updates = ctx.acked.load(Ordering::Relaxed);
    ctx.expected.store(total_updates, Ordering::Relaxed);
    let mut ack_to_event = Hist::default();
    let mut send_to_event = Hist::default();
    let (mut min_delivered, mut before_ack, mut foreign) = (u64::MAX, 0, 0);
    while let Some(r) = watch_tasks.join_next().await {
        let st = r.context("watcher task")??;
        ack_to_event.merge(&st.ack_to_event);
        send_to_event.merge(&st.send_to_event);
        min_delivered = min_delivered.min(st.events);
        before_ack += st.before_ack;
        foreign += st.foreign;
    }
    s.check_alive()?;
    Ok(RunResult {
        sys,
        mode,
        watchers,
        round,
        updates_per_sec: measured_updates as f64 / secs,
        measured_updates,
        total_updates,
        min_delivered: if watchers == 0 {
            total_updates
        } else {
            min_delivered
        },
        before_ack,
        foreign,
        ack_to_event,
        send_to_event,
        server_cpu,
        bench_cpu,
        softirq_cpu,
        other_cpu,
        load_before,
        load_after: loadavg(),
    })
}

fn all_modes(args: &Args) -> Vec<Mode> {
    let mut modes = vec![Mode::Throughput];
    modes.extend(
        args.latency_rate
            .iter()
            .filter(|r| **r > 0)
            .map(|r| Mode::Paced(*r)),
    );
    modes
}

async fn phase_updates(args: &Args) -> Result<Vec<RunResult>> {
    let mut s = Servers::start(args).await?;
    let conc = args.writers.clamp(1, args.keys.max(1));
    load(
        args,
        &s,
        System::Stated,
        args.keys,
        stated::ITEMS,
        etcd::ITEMS,
        conc,
    )
    .await?;
    load(
        args,
        &s,
        System::Etcd,
        args.keys,
        stated::ITEMS,
        etcd::ITEMS,
        conc,
    )
    .await?;
    let mut results = Vec::new();
    let modes = all_modes(args);
    for round in 0..args.rounds.max(1) {
        for (&mode, &w) in modes
            .iter()
            .flat_map(|m| args.watchers.iter().map(move |w| (m, w)))
        {
            let order = if round % 2 == 0 {
                [System::Stated, System::Etcd]
            } else {
                [System::Etcd, System::Stated]
            };
            for sys in order {
                eprintln!(
                    "[{}] round {} {}: {w} watchers, {} s",
                    mode.name(),
                    round + 1,
                    sys.name(),
                    args.duration
                );
                let r = run_updates(args, &mut s, sys, w, round, mode).await?;
                eprintln!(
                    "    {:.0} updates/s, ack->event p50 {} p99 {}, CPU: server {:.2}, bench {:.2}, softirq {:.2}, others {:.2} cores",
                    r.updates_per_sec,
                    us(r.ack_to_event.quantile(0.5)),
                    us(r.ack_to_event.quantile(0.99)),
                    r.server_cpu,
                    r.bench_cpu,
                    r.softirq_cpu,
                    r.other_cpu
                );
                results.push(r);
            }
        }
    }
    s.stop();
    Ok(results)
}

// ---------------------------------------------------------------------------------------------
// Report.

fn us(ns: u64) -> String {
    format!("{:.0} µs", ns as f64 / 1000.0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Summary {
    runs: usize,
    updates_per_sec: f64,
    ack_to_event: Hist,
    send_to_event: Hist,
    complete: bool,
    server_cpu: f64,
    bench_cpu: f64,
    softirq_cpu: f64,
}

fn summarize(results: &[RunResult], sys: System, mode: Mode, w: usize) -> Summary {
    let runs: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.sys == sys && r.mode == mode && r.watchers == w)
        .collect();
    let mut ack = Hist::default();
    let mut send = Hist::default();
    for r in &runs {
        ack.merge(&r.ack_to_event);
        send.merge(&r.send_to_event);
    }
    let med = |f: fn(&RunResult) -> f64| median(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
    Summary {
        runs: runs.len(),
        updates_per_sec: med(|r| r.updates_per_sec),
        ack_to_event: ack,
        send_to_event: send,
        complete: runs.iter().all(|r| r.min_delivered >= r.total_updates),
        server_cpu: med(|r| r.server_cpu),
        bench_cpu: med(|r| r.bench_cpu),
        softirq_cpu: med(|r| r.softirq_cpu),
    }
}

fn hist_json(h: &Hist) -> serde_json::Value {
    json!({
        "count": h.len(), "p50_us": h.quantile(0.5) as f64 / 1e3, "p99_us": h.quantile(0.99) as f64 / 1e3,
        "p999_us": h.quantile(0.999) as f64 / 1e3, "max_us": h.max() as f64 / 1e3, "mean_us": h.mean() as f64 / 1e3,
    })
}

fn summary_json(x: &Summary) -> serde_json::Value {
    json!({
        "runs": x.runs, "updates_per_sec": x.updates_per_sec, "ack_to_event": hist_json(&x.ack_to_event),
        "send_to_event": hist_json(&x.send_to_event), "all_events_delivered": x.complete,
        "server_cpu_cores": x.server_cpu, "bench_cpu_cores": x.bench_cpu, "softirq_cpu_cores": x.softirq_cpu,
    })
}

fn row(label: &str, a: String, b: String, ratio: String) {
    println!("| {label:<46} | {a:>12} | {b:>12} | {ratio:>16} |");
}

fn header() {
    row(
        "metric",
        "stated".into(),
        "etcd".into(),
        "stated advantage".into(),
    );
    println!("|{:-<48}|{:->14}|{:->14}|{:->18}|", "", ":", ":", ":");
}

/// A latency row: the ratio is etcd ÷ stated (> 1: stated is faster); none below 1 µs, where
/// the event mostly arrived before the writer saw the acknowledgement.
fn latency_row(label: &str, a: u64, b: u64) {
    let ratio = if a < 1000 || b < 1000 {
        "—".to_string()
    } else {
        format!("{:.2}×", b as f64 / a as f64)
    };
    row(label, us(a), us(b), ratio);
}

fn print_runs(results: &[RunResult]) {
    println!("| mode | broker | watchers | round | updates/s | ack→event p50 / p99 / max | send→event p50 / p99 | events before ack | CPU (cores): server / bench / softirq / others | delivered (min/total) | load avg |");
    println!("|---|---|---:|---:|---:|---|---|---:|---|---|---|");
    for r in results {
        println!(
            "| {} | {} | {} | {} | {:.0} | {} / {} / {} | {} / {} | {:.1}% | {:.2} / {:.2} / {:.2} / {:.2} | {}/{} | {:.2}→{:.2} |",
            r.mode.name(),
            r.sys.name(),
            r.watchers,
            r.round + 1,
            r.updates_per_sec,
            us(r.ack_to_event.quantile(0.5)),
            us(r.ack_to_event.quantile(0.99)),
            us(r.ack_to_event.max()),
            us(r.send_to_event.quantile(0.5)),
            us(r.send_to_event.quantile(0.99)),
            100.0 * r.before_ack as f64 / r.ack_to_event.len().max(1) as f64,
            r.server_cpu,
            r.bench_cpu,
            r.softirq_cpu,
            r.other_cpu,
            r.min_delivered,
            r.total_updates,
            r.load_before,
            r.load_after,
        );
        if r.foreign > 0 {
            println!("  ({} events without a bench spec)", r.foreign);
        }
    }
}

fn report(
    args: &Args,
    lists: Option<&[ListResult; 2]>,
    results: &[RunResult],
    started: f64,
) -> serde_json::Value {
    let machine = procs::machine();
    let etcd_version = procs::version_of(&args.etcd);
    println!();
    println!("## broker-bench: stated vs {etcd_version}");
    println!(
        "machine: {} × {}, {} MiB; load average {:.2} at start, {:.2} at end",
        machine["cpus"],
        machine["cpu_model"].as_str().unwrap_or(""),
        machine["mem_mib"],
        started,
        loadavg()
    );
    println!(
        "workload: {} keys, {}-byte specs, {} s measured after {} s warm-up, {} round(s); throughput runs: {} writers; latency runs: the same writers paced to {:?} updates/s in total; etcd clients over {}; stated's update events {} the old resource (etcd's: no prev_kv); data on tmpfs ({})",
        args.keys,
        args.spec_size,
        args.duration,
        args.warmup,
        args.rounds,
        args.writers,
        args.latency_rate,
        if args.etcd_unix { "a Unix socket" } else { "TCP 127.0.0.1" },
        if args.stated_with_old { "carry" } else { "omit" },
        args.tmpfs.display()
    );
    println!();
    println!("Every update run:");
    print_runs(results);
    println!();
    println!("Summary (medians of the rounds for rates; latency percentiles over all events of all rounds; stated advantage > 1 means stated is better):");
    header();
    let mut sections = Vec::new();
    let mut targets = Vec::new();
    for mode in all_modes(args) {
        for &w in &args.watchers {
            let a = summarize(results, System::Stated, mode, w);
            let b = summarize(results, System::Etcd, mode, w);
            if a.runs == 0 || b.runs == 0 {
                continue;
            }
            let tp = a.updates_per_sec / b.updates_per_sec;
            let what = match mode {
                Mode::Throughput => format!("{w} watchers, saturated"),
                Mode::Paced(rate) => format!("{w} watchers, {rate} updates/s"),
            };
            if mode == Mode::Throughput {
                row(
                    &format!("updates/s, {w} watchers"),
                    format!("{:.0}", a.updates_per_sec),
                    format!("{:.0}", b.updates_per_sec),
                    format!("{tp:.2}×"),
                );
                row(
                    "  CPU cores: server / bench",
                    format!("{:.2} / {:.2}", a.server_cpu, a.bench_cpu),
                    format!("{:.2} / {:.2}", b.server_cpu, b.bench_cpu),
                    String::new(),
                );
                row(
                    "  softirq (kernel loopback TCP) cores",
                    format!("{:.2}", a.softirq_cpu),
                    format!("{:.2}", b.softirq_cpu),
                    String::new(),
                );
                // CPU per update: what the broker costs, less dependent on the shared machine.
                let per = |x: &Summary, cores: f64| cores * 1e6 / x.updates_per_sec;
                let (sa, sb) = (per(&a, a.server_cpu), per(&b, b.server_cpu));
                row(
                    "  server CPU per update (µs)",
                    format!("{sa:.1}"),
                    format!("{sb:.1}"),
                    format!("{:.2}×", sb / sa),
                );
                let (ka, kb) = (
                    per(&a, a.server_cpu + a.softirq_cpu),
                    per(&b, b.server_cpu + b.softirq_cpu),
                );
                row(
                    "  server + softirq CPU per update (µs)",
                    format!("{ka:.1}"),
                    format!("{kb:.1}"),
                    format!("{:.2}×", kb / ka),
                );
                row(
                    "  bench (client) CPU per update (µs)",
                    format!("{:.1}", per(&a, a.bench_cpu)),
                    format!("{:.1}", per(&b, b.bench_cpu)),
                    String::new(),
                );
            }
            for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
                latency_row(
                    &format!("ack→event {name}, {what}"),
                    a.ack_to_event.quantile(q),
                    b.ack_to_event.quantile(q),
                );
            }
            latency_row(
                &format!("send→event p99, {what}"),
                a.send_to_event.quantile(0.99),
                b.send_to_event.quantile(0.99),
            );
            if !a.complete || !b.complete {
                println!(
                    "  (not every watcher received every event: stated {}, etcd {})",
                    a.complete, b.complete
                );
            }
            sections.push(json!({
                "mode": mode.name(), "watchers": w,
                "stated": summary_json(&a), "etcd": summary_json(&b), "throughput_ratio": tp,
            }));
            if w == 10 {
                let p99 = a.ack_to_event.quantile(0.99);
                if mode == Mode::Throughput {
                    targets.push(json!({"target": "updates/s at 10 watchers >= 3x etcd", "value": tp, "met": tp >= 3.0}));
                }
                targets.push(json!({
                    "target": format!("p99 ack->event at 10 watchers <= 1 ms ({})", what),
                    "value_us": p99 as f64 / 1e3, "met": p99 <= 1_000_000,
                }));
            }
        }
    }
    let mut list_json = serde_json::Value::Null;
    if let Some([a, b]) = lists {
        let (la, lb) = (median(&a.list_secs), median(&b.list_secs));
        let n = args.list_size;
        let ratio = |x: f64, y: f64| format!("{:.2}×", y / x);
        row(
            &format!("List of {n} (median of {})", a.list_secs.len()),
            format!("{:.0} ms", la * 1e3),
            format!("{:.0} ms", lb * 1e3),
            ratio(la, lb),
        );
        row(
            &format!("create {n} ({} clients)", args.load_concurrency),
            format!("{:.1} s", a.load_secs),
            format!("{:.1} s", b.load_secs),
            ratio(a.load_secs, b.load_secs),
        );
        let mem_row = |label: &str, x: u64, y: u64| {
            row(
                label,
                format!("{:.1}", mib(x)),
                format!("{:.1}", mib(y)),
                ratio(x as f64, y as f64),
            )
        };
        mem_row("RSS idle (MiB)", a.mem_idle.rss, b.mem_idle.rss);
        mem_row(
            &format!("RSS holding {n} (MiB)"),
            a.mem_loaded.rss,
            b.mem_loaded.rss,
        );
        row(
            "  of which anon / file / shmem (MiB)",
            format!(
                "{:.0}/{:.0}/{:.0}",
                mib(a.mem_loaded.anon),
                mib(a.mem_loaded.file),
                mib(a.mem_loaded.shmem)
            ),
            format!(
                "{:.0}/{:.0}/{:.0}",
                mib(b.mem_loaded.anon),
                mib(b.mem_loaded.file),
                mib(b.mem_loaded.shmem)
            ),
            String::new(),
        );
        mem_row(
            "RSS after the Lists (MiB)",
            a.mem_after_list.rss,
            b.mem_after_list.rss,
        );
        mem_row("peak RSS (MiB)", a.mem_after_list.hwm, b.mem_after_list.hwm);
        mem_row(
            "data files on tmpfs (MiB)",
            a.data_bytes / 1024,
            b.data_bytes / 1024,
        );
        if n == 100_000 {
            targets.push(json!({"target": "stated holds 100k resources in <= 100 MiB RSS", "value_mib": mib(a.mem_loaded.rss), "met": a.mem_loaded.rss <= 100 * 1024}));
        }
        let side = |l: &ListResult| {
            json!({ "list_secs": l.list_secs, "list_median_secs": median(&l.list_secs), "listed": l.listed, "create_secs": l.load_secs,
                    "mem_idle": l.mem_idle.json(), "mem_loaded": l.mem_loaded.json(), "mem_after_list": l.mem_after_list.json(),
                    "data_bytes": l.data_bytes })
        };
        list_json = json!({ "resources": n, "stated": side(a), "etcd": side(b) });
    }
    println!();
    for t in &targets {
        println!(
            "target: {} — {}",
            t["target"].as_str().unwrap_or(""),
            if t["met"].as_bool() == Some(true) {
                "MET"
            } else {
                "MISSED"
            }
        );
    }
    let every_run: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            json!({ "mode": r.mode.name(), "broker": r.sys.name(), "watchers": r.watchers, "round": r.round + 1,
                    "updates_per_sec": r.updates_per_sec, "measured_updates": r.measured_updates, "total_updates": r.total_updates,
                    "min_delivered": r.min_delivered, "events_before_ack": r.before_ack, "ack_to_event": hist_json(&r.ack_to_event),
                    "send_to_event": hist_json(&r.send_to_event), "server_cpu_cores": r.server_cpu, "bench_cpu_cores": r.bench_cpu,
                    "softirq_cpu_cores": r.softirq_cpu, "other_cpu_cores": r.other_cpu, "load_before": r.load_before, "load_after": r.load_after })
        })
        .collect();
    json!({
        "machine": machine,
        "load_average": { "start": started, "end": loadavg() },
        "etcd_version": etcd_version,
        "config": { "writers": args.writers, "keys": args.keys, "spec_size": args.spec_size, "duration_secs": args.duration,
                    "warmup_secs": args.warmup, "rounds": args.rounds, "watchers": args.watchers, "latency_rate": args.latency_rate,
                    "etcd_transport": if args.etcd_unix { "unix" } else { "tcp" }, "stated_old": args.stated_with_old, "tmpfs": args.tmpfs },
        "updates": sections,
        "list": list_json,
        "targets": targets,
        "runs": every_run,
    })
}

async fn run(args: Args) -> Result<()> {
    if !args.stated.exists() {
        bail!(
            "no stated binary at {} (cargo build --release -p stated)",
            args.stated.display()
        );
    }
    if !args.etcd.exists() {
        bail!(
            "no etcd binary at {} (apt-get install etcd-server)",
            args.etcd.display()
        );
    }
    if args.keys == 0 || args.writers == 0 {
        bail!("--keys and --writers must be at least 1");
    }
    procs::require_tmpfs(&args.tmpfs)?;
    let started = loadavg();
    let lists = if args.list_size > 0 {
        Some(phase_list(&args).await?)
    } else {
        None
    };
    let results = phase_updates(&args).await?;
    let summary = report(&args, lists.as_ref(), &results, started);
    let text = serde_json::to_string(&summary).context("summary")?;
    println!();
    println!("BENCH_JSON {text}");
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&summary).context("summary")?,
        )
        .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("broker-bench: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // On a signal the benchmark future is dropped, and with it the servers (killed by their guards).
    let result = rt.block_on(async {
        tokio::select! {
            r = run(args) => r,
            s = interrupted() => Err(anyhow::anyhow!("interrupted by {s}")),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broker-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
