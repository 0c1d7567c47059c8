//! Chaos: a three-node cluster whose daemons are killed with SIGKILL at random while its
//! machine configs are patched, and which must converge once the chaos stops.
//!
//! For a bounded time (`TALOS_CHAOS_SECONDS`, 60 s by default) one thread kill -9s a random
//! daemon (stated, networkd, secretsd or trustd; now and then all of them) of a random node, from the host, while one
//! thread per node patches that node's machine config with `talosctl patch machineconfig`
//! (static addresses on `lo`, static routes on `eth0`, extraHostEntries: added and removed;
//! nameservers and the hostname: changed) and records every attempt, acknowledged (exit 0)
//! or not. Then the cluster must converge within a deadline:
//! - every daemon of every node running and healthy, never seen failed, restarted exactly once
//!   per kill (no crash of its own);
//! - no acknowledged write lost: each node's acknowledged versions increase strictly, and the
//!   node's MachineConfig is the last acknowledged one (or an attempt after it that failed
//!   after stated had stored it: a kill between the write and its reply);
//! - the kernel matches the resources: the addresses and routes of `ip -j` in the node's
//!   network namespace are exactly those of networkd's AddressStatus and RouteStatus, every
//!   AddressSpec and RouteSpec is in the kernel, none is left tearing down, and the addresses,
//!   routes, resolvers, host entries and hostname of the node's config are applied (and the
//!   removed ones gone), in the kernel, in `/etc/resolv.conf` and `/etc/hosts`, and in the
//!   node's UTS namespace; the DHCP address is still there.
//!
//! Then `talosctl cluster destroy` must leave none of the cluster's processes, namespaces or
//! mounts behind.
//!
//! Reproducible: the seed is printed first; `TALOS_CHAOS_SEED=<seed>` repeats a run's random
//! choices (what is killed and patched, in which order and with which pauses; the
//! interleaving with the nodes' own timing is the kernel's). Needs root; the cluster is
//! destroyed by its guard, also when an assertion fails.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cosi::Phase;
use machinery::config::Config;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG};
use machinery::resources::network::{
    route_id, AddressSpecSpec, AddressStatusSpec, Family, HostnameStatusSpec, ResolverStatusSpec,
    RouteSpecSpec, RouteStatusSpec, RoutingTable, HOSTNAME_ID, NAMESPACE as NETWORK, RESOLVER_ID,
};
use machinery::resources::runtime::{
    MachineStatusSpec, ServiceStatusSpec, MACHINE_STATUS_ID, NAMESPACE as RUNTIME,
};
use machinery::resources::secrets::{
    ApiCertsSpec, OsRootSpec, API_ID, NAMESPACE as SECRETS, OS_ROOT_ID,
};
use machinery::secrets::x509::Certificate;
use node_tests::{
    alive, pid_namespace_members, processes_mentioning, require_root, text, Cluster, HostSnapshot,
    NodeInfo,
};

/// The daemons the chaos kills.
const DAEMONS: [&str; 6] = ["stated", "networkd", "blockd", "secretsd", "trustd", "apid"];
/// How long the chaos lasts unless `TALOS_CHAOS_SECONDS` says otherwise.
const DEFAULT_CHAOS: Duration = Duration::from_secs(60);
/// How long the cluster has to converge once the chaos stopped.
const CONVERGE: Duration = Duration::from_secs(60);
/// A talosctl call that takes longer hangs.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Nameservers a config may list (documentation addresses: nothing answers).
const NAMESERVERS: [&str; 3] = ["192.0.2.53", "198.51.100.53", "203.0.113.53"];
/// Static addresses on `lo` per node, static routes per node, host entries per node.
const POOL: u8 = 4;

/// splitmix64: small, and the same sequence for the same seed everywhere.
struct Rng(u64);

impl Rng {
    /// The generator of one thread (`stream`) of a run.
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// The run's seed: `TALOS_CHAOS_SEED`, else one from the clock.
fn seed() -> u64 {
    if let Ok(s) = std::env::var("TALOS_CHAOS_SEED") {
        return s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("TALOS_CHAOS_SEED={s:?} is not a number"));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Rng::new(now.as_nanos() as u64, u64::from(std::process::id())).next()
}

/// The chaos's duration: `TALOS_CHAOS_SECONDS`, else [`DEFAULT_CHAOS`].
fn chaos_duration() -> Duration {
    match std::env::var("TALOS_CHAOS_SECONDS") {
        Ok(s) => Duration::from_secs(
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("TALOS_CHAOS_SECONDS={s:?} is not a number")),
        ),
        Err(_) => DEFAULT_CHAOS,
    }
}

/// The part of a node's machine config the chaos changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NetModel {
    /// Static addresses on `lo` (`10.201.<node>.<k>/32`).
    addresses: BTreeSet<String>,
    /// Destinations of static routes on `eth0` via the cluster's gateway (`10.<210+node>.<k>.0/24`).
    routes: BTreeSet<String>,
    /// `machine.network.nameservers`, in order.
    nameservers: Vec<String>,
    /// `machine.network.extraHostEntries`: address → its one alias.
    hosts: BTreeMap<String, String>,
    /// `machine.network.hostname`: the node's name, with `-chaos` when this is set.
    renamed: bool,
}

fn pool_address(node: usize, k: u8) -> String {
    format!("10.201.{node}.{k}/32")
}

fn pool_route(node: usize, k: u8) -> String {
    format!("10.{}.{k}.0/24", 210 + node)
}

fn pool_host(node: usize, k: u8) -> (String, String) {
    (
        format!("10.201.{node}.{}", 100 + k),
        format!("chaos-{node}-{k}"),
    )
}

fn toggle(set: &mut BTreeSet<String>, item: String) {
    if !set.remove(&item) {
        set.insert(item);
    }
}

impl NetModel {
    /// One random change: an address, a route or a host entry added or removed, other
    /// nameservers, or the other hostname.
    fn mutate(&mut self, rng: &mut Rng, node: usize) -> &'static str {
        let k = 1 + rng.below(u64::from(POOL)) as u8;
        match rng.below(5) {
            0 => {
                toggle(&mut self.addresses, pool_address(node, k));
                "address"
            }
            1 => {
                toggle(&mut self.routes, pool_route(node, k));
                "route"
            }
            2 => {
                let old = self.nameservers.clone();
                while self.nameservers == old {
                    let mut pool: Vec<&str> = NAMESERVERS.to_vec();
                    let n = rng.below(pool.len() as u64 + 1) as usize;
                    self.nameservers = (0..n)
                        .map(|_| {
                            pool.remove(rng.below(pool.len() as u64) as usize)
                                .to_string()
                        })
                        .collect();
                }
                "nameservers"
            }
            3 => {
                self.renamed = !self.renamed;
                "hostname"
            }
            _ => {
                let (ip, alias) = pool_host(node, k);
                if self.hosts.remove(&ip).is_none() {
                    self.hosts.insert(ip, alias);
                }
                "host entry"
            }
        }
    }

    /// A JSON patch (RFC 6902) that sets the whole of this part of the config, whatever the
    /// node has: the outcome of a failed attempt does not change what the next one writes.
    fn patch(&self, name: &str, gateway: &str) -> String {
        let mut eth0 = serde_json::json!({"interface": "eth0", "dhcp": true});
        if !self.routes.is_empty() {
            eth0["routes"] = self
                .routes
                .iter()
                .map(|r| serde_json::json!({"network": r, "gateway": gateway}))
                .collect();
        }
        let mut interfaces = vec![eth0];
        if !self.addresses.is_empty() {
            interfaces.push(serde_json::json!({"interface": "lo", "addresses": self.addresses}));
        }
        let hosts: Vec<_> = self
            .hosts
            .iter()
            .map(|(ip, alias)| serde_json::json!({"ip": ip, "aliases": [alias]}))
            .collect();
        serde_json::json!([
            {"op": "add", "path": "/machine/network/interfaces", "value": interfaces},
            {"op": "add", "path": "/machine/network/nameservers", "value": self.nameservers},
            {"op": "add", "path": "/machine/network/extraHostEntries", "value": hosts},
            {"op": "add", "path": "/machine/network/hostname", "value": self.hostname(name)},
        ])
        .to_string()
    }

    /// The hostname of the node called `name`.
    fn hostname(&self, name: &str) -> String {
        if self.renamed {
            format!("{name}-chaos")
        } else {
            name.to_string()
        }
    }

    /// This part of the machine config of the node called `name`.
    fn of(text: &str, name: &str, gateway: &str) -> Result<NetModel, String> {
        let config = Config::from_yaml(text).map_err(|e| format!("the config decodes: {e}"))?;
        let mut model = NetModel::default();
        let Some(net) = config.machine().and_then(|m| m.network.as_ref()) else {
            return Ok(model);
        };
        for dev in &net.interfaces {
            match dev.interface.as_deref() {
                Some("lo") => model.addresses.extend(dev.addresses.iter().cloned()),
                Some("eth0") => {
                    for r in &dev.routes {
                        if r.gateway.as_deref() != Some(gateway) {
                            return Err(format!("route {r:?} is not via {gateway}"));
                        }
                        model.routes.extend(r.network.clone());
                    }
                }
                _ => {}
            }
        }
        model.nameservers = net.nameservers.clone();
        model.renamed = match net.hostname.as_deref() {
            Some(h) if h == name => false,
            Some(h) if h == format!("{name}-chaos") => true,
            h => return Err(format!("hostname {h:?} is neither {name} nor {name}-chaos")),
        };
        for h in &net.extra_host_entries {
            let ip = h.ip.clone().unwrap_or_default();
            model
                .hosts
                .insert(ip, h.aliases.first().cloned().unwrap_or_default());
        }
        Ok(model)
    }
}

/// How one patch ended.
#[derive(Clone, Debug)]
enum Outcome {
    /// Exit 0: written as this MachineConfig version (`None`: talosctl found nothing to change).
    Acked(Option<u64>),
    /// A non-zero exit, with talosctl's output.
    Failed(String),
    /// talosctl did not return within [`CALL_TIMEOUT`] (killed).
    Hung(String),
}

/// One `talosctl patch machineconfig` of the chaos.
#[derive(Clone, Debug)]
struct Attempt {
    at: Duration,
    what: &'static str,
    model: NetModel,
    outcome: Outcome,
}

/// One kill -9 (or a daemon that did not run when its turn came and did not come back in time).
#[derive(Clone, Debug)]
struct Kill {
    at: Duration,
    node: usize,
    daemon: &'static str,
    host_pid: Option<i32>,
}

/// Runs a command; kills it after `timeout`. `Err` carries the output of a hung one.
fn run(mut cmd: Command, timeout: Duration) -> Result<Output, Output> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => Ok(out.unwrap()),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            Err(rx.recv().unwrap().unwrap())
        }
    }
}

/// The host PID of the running `daemon` of the node whose init is `init` (a live child of
/// init with that command name).
fn daemon_pid(init: i32, daemon: &str) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().unwrap_or("X");
        let ppid = rest.next().and_then(|p| p.parse::<i32>().ok());
        if comm == daemon && ppid == Some(init) && state != "Z" && state != "X" {
            return Some(pid);
        }
    }
    None
}

/// A row of `talosctl services`.
#[derive(Clone, Debug)]
struct ServiceRow {
    state: String,
    healthy: bool,
    pid: i32,
    restarts: u64,
    line: String,
}

/// init's control socket in a node (reached through /proc with `-n`).
const INIT_SOCKET: &str = "/run/init/init.sock";

/// `talosctl -n <node> services`, by service name.
fn services(cluster: &Cluster, node: &NodeInfo) -> Result<BTreeMap<String, ServiceRow>, String> {
    // Over init's socket (through /proc), not apid: apid is one of the daemons killed, and
    // this table has the PID and RESTARTS columns.
    let mut cmd = cluster.command();
    cmd.args(["--init-socket", INIT_SOCKET, "-n", &node.name, "services"]);
    let out =
        run(cmd, CALL_TIMEOUT).map_err(|o| format!("talosctl services hung: {}", text(&o)))?;
    if !out.status.success() {
        return Err(format!("talosctl services: {}", text(&out)));
    }
    let mut rows = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        rows.insert(
            f[0].to_string(),
            ServiceRow {
                state: f[2].to_string(),
                healthy: f[3] == "OK",
                pid: f[4].parse().unwrap_or(0),
                restarts: f[5].parse().unwrap_or(u64::MAX),
                line: line.to_string(),
            },
        );
    }
    Ok(rows)
}

/// The version in talosctl's "Applied configuration ... (MachineConfig version N)."; `None`
/// when it skipped an unchanged config.
fn acked_version(stdout: &str) -> Option<u64> {
    let rest = stdout.split("MachineConfig version ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The kernel's addresses of a node (`ip -j addr`), as AddressStatus IDs.
fn kernel_addresses(node: &NodeInfo) -> Result<BTreeSet<String>, String> {
    let v = ip_json(node, &["addr", "show"])?;
    let mut out = BTreeSet::new();
    for link in v.as_array().into_iter().flatten() {
        let name = link["ifname"].as_str().unwrap_or_default();
        for a in link["addr_info"].as_array().into_iter().flatten() {
            let addr = a["address"].as_str().or(a["local"].as_str());
            let (Some(addr), Some(len)) = (addr, a["prefixlen"].as_u64()) else {
                continue;
            };
            let addr: IpAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
            out.insert(format!("{name}/{addr}/{len}"));
        }
    }
    Ok(out)
}

/// The kernel's routes of a node (`ip -j -4/-6 route show table all`), as RouteStatus IDs.
fn kernel_routes(node: &NodeInfo) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    for (flag, family, host_len) in [("-4", Family::Inet4, 32), ("-6", Family::Inet6, 128)] {
        let v = ip_json(node, &[flag, "route", "show", "table", "all"])?;
        for r in v.as_array().into_iter().flatten() {
            let table = match r["table"].as_str() {
                None | Some("main") => RoutingTable::MAIN,
                Some("local") => RoutingTable(255),
                Some("default") => RoutingTable(253),
                Some(n) => RoutingTable(n.parse().map_err(|_| format!("table {n} in {r}"))?),
            };
            let dst = match r["dst"].as_str() {
                None | Some("default") => None,
                Some(d) if d.contains('/') => Some(d.to_string()),
                Some(d) => Some(format!("{d}/{host_len}")),
            };
            let dst = match dst {
                Some(d) => Some(d.parse().map_err(|_| format!("destination {d} in {r}"))?),
                None => None,
            };
            let gateway: Option<IpAddr> = r["gateway"].as_str().and_then(|g| g.parse().ok());
            let priority = r["metric"].as_u64().unwrap_or(0) as u32;
            let dev = r["dev"].as_str().unwrap_or_default();
            out.insert(route_id(
                table,
                family,
                dst.as_ref(),
                gateway.as_ref(),
                priority,
                dev,
            ));
        }
    }
    Ok(out)
}

fn ip_json(node: &NodeInfo, args: &[&str]) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new("ip");
    cmd.args(["-n", &node.netns, "-j"]).args(args);
    let out = run(cmd, CALL_TIMEOUT).map_err(|o| format!("ip {args:?} hung: {}", text(&o)))?;
    if !out.status.success() {
        return Err(format!("ip {args:?}: {}", text(&out)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("ip {args:?}: {e}"))
}

/// What the chaos did to one node, for the final checks.
struct NodeRecord<'a> {
    index: usize,
    node: &'a NodeInfo,
    attempts: &'a [Attempt],
    kills: BTreeMap<&'static str, u64>,
}

impl NodeRecord<'_> {
    /// The last acknowledged attempt's model and version, and the models of the attempts
    /// after it that failed (each may have been stored before its reply was lost).
    fn expected(&self) -> (NetModel, Option<u64>, Vec<NetModel>) {
        let last = self
            .attempts
            .iter()
            .rposition(|a| matches!(a.outcome, Outcome::Acked(_)));
        let (model, version) = match last {
            Some(i) => (
                self.attempts[i].model.clone(),
                self.attempts[..=i]
                    .iter()
                    .rev()
                    .find_map(|a| match a.outcome {
                        Outcome::Acked(v) => v,
                        _ => None,
                    }),
            ),
            None => (NetModel::default(), None),
        };
        let after = last.map_or(0, |i| i + 1);
        let maybe = self.attempts[after..]
            .iter()
            .map(|a| a.model.clone())
            .collect();
        (model, version, maybe)
    }
}

/// Every way the node differs from what it must converge to (empty once it converged), and
/// what was compared.
fn problems(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    rec: &NodeRecord<'_>,
    gateway: &str,
) -> (Vec<String>, String) {
    let mut p = Vec::new();
    let mut summary = String::new();
    let node = rec.node;
    let _rt = rt.enter();

    // Daemons: running, healthy, restarted once per kill and never on their own; and init's
    // ServiceStatus resources saying the same.
    let state = cluster
        .state(node)
        .with_request_timeout(Duration::from_secs(5));
    match services(cluster, node) {
        Ok(rows) => {
            for (id, row) in rows.iter().filter(|(id, _)| DAEMONS.contains(&id.as_str())) {
                match rt.block_on(state.get_typed::<ServiceStatusSpec>(RUNTIME, id)) {
                    Ok(r) => {
                        let s = &r.spec;
                        if (s.state.as_str(), s.healthy, s.pid, u64::from(s.restarts))
                            != (row.state.as_str(), row.healthy, row.pid, row.restarts)
                        {
                            p.push(format!(
                                "ServiceStatus {id} is {s:?}, init says: {}",
                                row.line
                            ));
                        }
                    }
                    Err(e) => p.push(format!("get ServiceStatus {id}: {e}")),
                }
            }
            for d in DAEMONS {
                let kills = rec.kills.get(d).copied().unwrap_or(0);
                match rows.get(d) {
                    Some(r) if r.state == "running" && r.healthy && r.restarts == kills => {
                        let _ = write!(summary, "{d} restarted {kills} times; ");
                    }
                    Some(r) => p.push(format!(
                        "{d} is not running and healthy with {kills} restarts (one per kill): {}",
                        r.line
                    )),
                    None => p.push(format!("{d} is not listed by talosctl services")),
                }
            }
        }
        Err(e) => p.push(e),
    }

    match rt.block_on(state.get_typed::<MachineStatusSpec>(RUNTIME, MACHINE_STATUS_ID)) {
        Ok(m) if m.spec.status.ready && m.spec.status.unmet_conditions.is_empty() => {}
        Ok(m) => p.push(format!("MachineStatus is not ready: {:?}", m.spec)),
        Err(e) => p.push(format!("get MachineStatus: {e}")),
    }

    // The machine config: the last acknowledged write (or an unacknowledged one after it).
    let model = match rt.block_on(state.get_typed::<MachineConfigSpec>(CONFIG, ACTIVE_ID)) {
        Ok(mc) => {
            let (acked, acked_version, maybe) = rec.expected();
            match NetModel::of(&mc.spec.0, &node.name, gateway) {
                Ok(m) if m == acked || maybe.contains(&m) => {
                    let _ = write!(
                        summary,
                        "MachineConfig version {} ({}); ",
                        mc.metadata.version,
                        if m == acked {
                            "the last acknowledged write"
                        } else {
                            "a write after the last acknowledged one, whose reply was lost"
                        }
                    );
                    if acked_version.is_some_and(|v| mc.metadata.version < v) {
                        p.push(format!(
                            "MachineConfig version {} is older than the last acknowledged one ({acked_version:?})",
                            mc.metadata.version
                        ));
                    }
                    if m != acked && acked_version == Some(mc.metadata.version) {
                        p.push(format!(
                            "MachineConfig version {} is the last acknowledged one but does not hold its write: {m:?} != {acked:?}",
                            mc.metadata.version
                        ));
                    }
                    Some(m)
                }
                Ok(m) => {
                    p.push(format!(
                        "MachineConfig (version {}) lost the last acknowledged write (version {acked_version:?}): has {m:?}, acknowledged {acked:?}",
                        mc.metadata.version
                    ));
                    None
                }
                Err(e) => {
                    p.push(e);
                    None
                }
            }
        }
        Err(e) => {
            p.push(format!("get MachineConfig: {e}"));
            None
        }
    };

    // The kernel and networkd's view of it.
    let (addrs, routes) = match (kernel_addresses(node), kernel_routes(node)) {
        (Ok(a), Ok(r)) => (a, r),
        (a, r) => {
            p.extend(a.err());
            p.extend(r.err());
            return (p, summary);
        }
    };
    match rt.block_on(state.list_typed::<AddressStatusSpec>(NETWORK)) {
        Ok(list) => {
            let ids: BTreeSet<String> = list.into_iter().map(|r| r.metadata.id).collect();
            if ids != addrs {
                p.push(format!(
                    "AddressStatus and the kernel differ: only in AddressStatus {:?}, only in the kernel {:?}",
                    ids.difference(&addrs).collect::<Vec<_>>(),
                    addrs.difference(&ids).collect::<Vec<_>>()
                ));
            }
        }
        Err(e) => p.push(format!("list AddressStatus: {e}")),
    }
    match rt.block_on(state.list_typed::<RouteStatusSpec>(NETWORK)) {
        Ok(list) => {
            let ids: BTreeSet<String> = list.into_iter().map(|r| r.metadata.id).collect();
            if ids != routes {
                p.push(format!(
                    "RouteStatus and the kernel differ: only in RouteStatus {:?}, only in the kernel {:?}",
                    ids.difference(&routes).collect::<Vec<_>>(),
                    routes.difference(&ids).collect::<Vec<_>>()
                ));
            }
        }
        Err(e) => p.push(format!("list RouteStatus: {e}")),
    }
    match rt.block_on(state.list_typed::<AddressSpecSpec>(NETWORK)) {
        Ok(list) => {
            for s in list {
                let id = format!("{}/{}", s.spec.link_name, s.spec.address);
                if s.metadata.phase != Phase::Running {
                    p.push(format!(
                        "AddressSpec {} is left tearing down",
                        s.metadata.id
                    ));
                } else if !addrs.contains(&id) {
                    p.push(format!(
                        "AddressSpec {} is not in the kernel",
                        s.metadata.id
                    ));
                }
            }
        }
        Err(e) => p.push(format!("list AddressSpec: {e}")),
    }
    match rt.block_on(state.list_typed::<RouteSpecSpec>(NETWORK)) {
        Ok(list) => {
            for s in list {
                let sp = &s.spec;
                let id = route_id(
                    sp.table,
                    sp.family,
                    sp.destination.as_ref(),
                    sp.gateway.as_ref(),
                    sp.priority,
                    &sp.out_link_name,
                );
                if s.metadata.phase != Phase::Running {
                    p.push(format!("RouteSpec {} is left tearing down", s.metadata.id));
                } else if !routes.contains(&id) {
                    p.push(format!(
                        "RouteSpec {} ({id}) is not in the kernel",
                        s.metadata.id
                    ));
                }
            }
        }
        Err(e) => p.push(format!("list RouteSpec: {e}")),
    }

    // The node's config, applied: in the kernel, the resolvers, /etc/resolv.conf, /etc/hosts.
    let Some(model) = model else {
        return (p, summary);
    };
    let _ = write!(
        summary,
        "{} addresses and {} routes in the kernel and in AddressStatus/RouteStatus; config {model:?}",
        addrs.len(),
        routes.len()
    );
    let i = rec.index;
    // secretsd: on a node that holds the OS CA's key, apid's certificate is signed by it and
    // names the node as it is now (its hostname, its DHCP address).
    match rt.block_on(state.get_typed::<OsRootSpec>(SECRETS, OS_ROOT_ID)) {
        Ok(root) => {
            if let Some(ca) = &root.spec.issuing_ca {
                match rt.block_on(state.get_typed::<ApiCertsSpec>(SECRETS, API_ID)) {
                    Ok(api) => p.extend(api_cert_problems(&api.spec, &ca.crt, node, &model)),
                    Err(e) => p.push(format!("get ApiCertificates: {e}")),
                }
            }
        }
        Err(e) => p.push(format!("get OSRootSecrets: {e}")),
    }
    let dhcp = format!("eth0/{}/{}", node.ip, node.prefix);
    if !addrs.contains(&dhcp) {
        p.push(format!("the DHCP address {dhcp} is not in the kernel"));
    }
    let hostname = model.hostname(&node.name);
    match rt.block_on(state.get_typed::<HostnameStatusSpec>(NETWORK, HOSTNAME_ID)) {
        Ok(h) if h.spec.hostname == hostname => {}
        Ok(h) => p.push(format!(
            "HostnameStatus is {:?}, the config {hostname:?}",
            h.spec.hostname
        )),
        Err(e) => p.push(format!("get HostnameStatus: {e}")),
    }
    let mut cmd = Command::new("nsenter");
    cmd.args([
        "-t",
        &node.init_pid.unwrap_or(0).to_string(),
        "-u",
        "hostname",
    ]);
    match run(cmd, CALL_TIMEOUT) {
        Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == hostname => {}
        Ok(o) => p.push(format!(
            "the kernel's hostname is {:?}, the config {hostname:?}",
            text(&o).trim()
        )),
        Err(o) => p.push(format!("nsenter hostname hung: {}", text(&o))),
    }
    for k in 1..=POOL {
        let a = pool_address(i, k);
        let want = model.addresses.contains(&a);
        if addrs.contains(&format!("lo/{a}")) != want {
            p.push(format!(
                "address {a} on lo is {} the kernel",
                if want { "not in" } else { "still in" }
            ));
        }
        let r = pool_route(i, k);
        let want = model.routes.contains(&r);
        let id = format!("inet4/{gateway}/{r}/1024");
        if routes.contains(&id) != want {
            p.push(format!(
                "route {id} is {} the kernel",
                if want { "not in" } else { "still in" }
            ));
        }
    }
    let dns: Vec<String> =
        match rt.block_on(state.get_typed::<ResolverStatusSpec>(NETWORK, RESOLVER_ID)) {
            Ok(r) => r.spec.dns_servers.iter().map(ToString::to_string).collect(),
            Err(e) => {
                p.push(format!("get ResolverStatus: {e}"));
                vec![]
            }
        };
    let etc = |f: &str| {
        let pid = node.init_pid.unwrap_or(0);
        std::fs::read_to_string(format!("/proc/{pid}/root/system/network/etc/{f}"))
            .unwrap_or_default()
    };
    let resolv = etc("resolv.conf");
    let in_resolv: Vec<String> = resolv
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .map(|s| s.trim().to_string())
        .collect();
    if model.nameservers.is_empty() {
        for ns in NAMESERVERS {
            if dns.iter().any(|d| d == ns) || in_resolv.iter().any(|d| d == ns) {
                p.push(format!(
                    "nameserver {ns} was removed but is in ResolverStatus {dns:?} or resolv.conf:\n{resolv}"
                ));
            }
        }
    } else {
        if dns != model.nameservers {
            p.push(format!(
                "ResolverStatus has {dns:?}, the config {:?}",
                model.nameservers
            ));
        }
        if in_resolv != model.nameservers {
            p.push(format!(
                "resolv.conf has {in_resolv:?}, the config {:?}:\n{resolv}",
                model.nameservers
            ));
        }
    }
    let hosts = etc("hosts");
    for k in 1..=POOL {
        let (ip, alias) = pool_host(i, k);
        let want = model.hosts.contains_key(&ip);
        let there = hosts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&ip.as_str()) && f.contains(&alias.as_str())
        });
        let named = hosts.split_whitespace().any(|w| w == alias);
        if there != want || (!want && named) {
            p.push(format!(
                "host entry {ip} {alias} is {} /etc/hosts:\n{hosts}",
                if want { "not in" } else { "still in" }
            ));
        }
    }
    (p, summary)
}

/// What is wrong with apid's certificate: not signed by the OS CA `ca`, or not naming the
/// node's hostname (CN) and DHCP address.
fn api_cert_problems(
    api: &ApiCertsSpec,
    ca: &str,
    node: &NodeInfo,
    model: &NetModel,
) -> Vec<String> {
    let Some(server) = &api.server else {
        return vec!["ApiCertificates has no server certificate".into()];
    };
    let (Ok(cert), Ok(ca)) = (
        Certificate::from_pem(server.crt.as_bytes()),
        Certificate::from_pem(ca.as_bytes()),
    ) else {
        return vec!["ApiCertificates or the OS CA does not parse".into()];
    };
    let mut p = Vec::new();
    if !cert.is_signed_by(&ca) {
        p.push("apid's certificate is not signed by the OS CA".into());
    }
    match cert.info() {
        Ok(info) => {
            let hostname = model.hostname(&node.name);
            let cn = info.common_name.clone().unwrap_or_default();
            if cn != hostname && !cn.starts_with(&format!("{hostname}.")) {
                p.push(format!(
                    "apid's certificate is for {:?}, the node is {hostname:?}",
                    info.common_name
                ));
            }
            if !info.ips.iter().any(|ip| ip.to_string() == node.ip) {
                p.push(format!(
                    "apid's certificate does not name {}: {:?}",
                    node.ip, info.ips
                ));
            }
        }
        Err(e) => p.push(format!("apid's certificate: {e}")),
    }
    p
}

/// What a failed run prints about a node: its services and its daemons' last log lines.
fn diagnostics(cluster: &Cluster, node: &NodeInfo) -> String {
    let mut s = String::new();
    let mut call = |args: &[&str]| {
        let mut cmd = cluster.command();
        cmd.args(["--init-socket", INIT_SOCKET, "-n", &node.name])
            .args(args);
        let out = match run(cmd, CALL_TIMEOUT) {
            Ok(o) => text(&o),
            Err(o) => format!("(hung) {}", text(&o)),
        };
        let _ = writeln!(
            s,
            "---- {} talosctl {} ----\n{out}",
            node.name,
            args.join(" ")
        );
    };
    call(&["services"]);
    for d in DAEMONS {
        call(&["logs", d, "--tail", "60"]);
    }
    s
}

#[test]
fn kill_9_of_random_daemons_while_configs_are_patched_and_the_cluster_converges() {
    require_root!();
    let seed = seed();
    let chaos = chaos_duration();
    eprintln!(
        "chaos seed: {seed} (TALOS_CHAOS_SEED={seed} repeats it), {} s of chaos (TALOS_CHAOS_SECONDS)",
        chaos.as_secs()
    );
    let cluster = Cluster::create(3);
    let info = cluster.show();
    let gateway = info
        .gateway
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let nodes = info.nodes.clone();
    assert_eq!(nodes.len(), 3);
    let inits: Vec<i32> = nodes.iter().map(|n| n.init_pid.unwrap()).collect();

    let start = Instant::now();
    let end = start + chaos;
    let kills: Mutex<Vec<Kill>> = Mutex::new(Vec::new());
    let failed_seen: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let attempts: Vec<Vec<Attempt>> = std::thread::scope(|s| {
        // The killer: a random daemon of a random node, every 0.3-1.5 s; and a look at the
        // node's services, so that a daemon seen failed (given up on) is reported.
        s.spawn(|| {
            let mut rng = Rng::new(seed, 0);
            let mut killed = BTreeSet::new();
            while Instant::now() < end {
                std::thread::sleep(rng.millis(300, 1500));
                let node = rng.below(nodes.len() as u64) as usize;
                // One daemon, or (one turn in five) all at once.
                let victims = match rng.below(10) {
                    0 | 1 => &DAEMONS[..],
                    n => std::slice::from_ref(&DAEMONS[n as usize % DAEMONS.len()]),
                };
                for &daemon in victims {
                    // A daemon that is down (in its restart backoff) is killed again soon
                    // after it is back: in its start, adoption of its outputs and resync.
                    let early = rng.millis(0, 300);
                    let mut host_pid = daemon_pid(inits[node], daemon);
                    if host_pid.is_none() {
                        let back = Instant::now() + Duration::from_secs(6);
                        while host_pid.is_none() && Instant::now() < back.min(end) {
                            std::thread::sleep(Duration::from_millis(10));
                            host_pid = daemon_pid(inits[node], daemon);
                        }
                        std::thread::sleep(early);
                    }
                    let host_pid = host_pid.filter(|p| alive(*p) && killed.insert(*p));
                    if let Some(pid) = host_pid {
                        nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        )
                        .unwrap();
                    }
                    kills.lock().unwrap().push(Kill {
                        at: start.elapsed(),
                        node,
                        daemon,
                        host_pid,
                    });
                }
                if let Ok(rows) = services(&cluster, &nodes[node]) {
                    for r in rows.values().filter(|r| r.state == "failed") {
                        failed_seen.lock().unwrap().push(format!(
                            "{} at {:?}: {}",
                            nodes[node].name,
                            start.elapsed(),
                            r.line
                        ));
                    }
                }
            }
        });
        // One patcher per node: a random change of its previous patch, written in full (so
        // the sequence of patches is the seed's, whichever failed), every 0.05-0.4 s.
        let patchers: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let gateway = &gateway;
                let cluster = &cluster;
                s.spawn(move || {
                    let mut rng = Rng::new(seed, 1 + i as u64);
                    let mut model = NetModel::default();
                    let mut log = Vec::new();
                    while Instant::now() < end {
                        let what = model.mutate(&mut rng, i);
                        let mut cmd = cluster.command();
                        cmd.args([
                            "-n",
                            &node.name,
                            "patch",
                            "mc",
                            "-p",
                            &model.patch(&node.name, gateway),
                        ]);
                        let outcome = match run(cmd, CALL_TIMEOUT) {
                            Ok(out) if out.status.success() => {
                                Outcome::Acked(acked_version(&String::from_utf8_lossy(&out.stdout)))
                            }
                            Ok(out) => Outcome::Failed(text(&out)),
                            Err(out) => Outcome::Hung(text(&out)),
                        };
                        log.push(Attempt {
                            at: start.elapsed(),
                            what,
                            model: model.clone(),
                            outcome,
                        });
                        std::thread::sleep(rng.millis(50, 400));
                    }
                    log
                })
            })
            .collect();
        patchers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let kills = kills.into_inner().unwrap();
    let chaos_took = start.elapsed();

    // What the chaos did.
    let mut report = String::new();
    let delivered = kills.iter().filter(|k| k.host_pid.is_some()).count();
    let _ = writeln!(
        report,
        "chaos seed {seed}: {:.1} s, {delivered} kills ({} turns found no daemon to kill)",
        chaos_took.as_secs_f64(),
        kills.len() - delivered
    );
    for (i, log) in attempts.iter().enumerate() {
        let acked = log
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::Acked(_)))
            .count();
        let _ = writeln!(
            report,
            "{}: {} patches, {acked} acknowledged, {} failed",
            nodes[i].name,
            log.len(),
            log.len() - acked
        );
        for a in log {
            if let Outcome::Failed(e) | Outcome::Hung(e) = &a.outcome {
                let _ = writeln!(
                    report,
                    "  failed at {:.2} s: {}",
                    a.at.as_secs_f64(),
                    e.trim().replace('\n', " | ")
                );
            }
        }
    }
    eprint!("{report}");
    let mut kill_log = String::new();
    for k in &kills {
        let _ = writeln!(
            kill_log,
            "  {:>6.2}s {} {} {}",
            k.at.as_secs_f64(),
            nodes[k.node].name,
            k.daemon,
            k.host_pid
                .map_or("not running".to_string(), |p| format!("pid {p}"))
        );
    }
    let attempt_log = |i: usize| {
        let mut s = String::new();
        for a in &attempts[i] {
            let outcome = match &a.outcome {
                Outcome::Acked(v) => format!("acknowledged, version {v:?}"),
                Outcome::Failed(e) => format!("failed: {}", e.trim().replace('\n', " | ")),
                Outcome::Hung(e) => format!("hung: {}", e.trim().replace('\n', " | ")),
            };
            let _ = writeln!(s, "  {:>6.2}s {:<11} {outcome}", a.at.as_secs_f64(), a.what);
        }
        s
    };

    // Never a hang, never a daemon given up on, never an acknowledged version reused.
    for (i, log) in attempts.iter().enumerate() {
        let hung: Vec<_> = log
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::Hung(_)))
            .collect();
        assert!(
            hung.is_empty(),
            "{report}{}: talosctl patch hung: {hung:#?}\nkills:\n{kill_log}",
            nodes[i].name
        );
        let versions: Vec<u64> = log
            .iter()
            .filter_map(|a| match a.outcome {
                Outcome::Acked(v) => v,
                _ => None,
            })
            .collect();
        assert!(
            versions.windows(2).all(|w| w[0] < w[1]),
            "{report}{}: acknowledged MachineConfig versions do not increase (a write was lost): {versions:?}\n{}\nkills:\n{kill_log}",
            nodes[i].name,
            attempt_log(i)
        );
        assert!(
            !versions.is_empty(),
            "{report}{}: no patch was acknowledged at all:\n{}",
            nodes[i].name,
            attempt_log(i)
        );
    }
    let failed_seen = failed_seen.into_inner().unwrap();
    assert!(
        failed_seen.is_empty(),
        "{report}daemons seen failed: {failed_seen:#?}\nkills:\n{kill_log}"
    );

    // Convergence.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let records: Vec<NodeRecord<'_>> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let mut per = BTreeMap::new();
            for k in kills.iter().filter(|k| k.node == i && k.host_pid.is_some()) {
                *per.entry(k.daemon).or_insert(0) += 1;
            }
            NodeRecord {
                index: i,
                node,
                attempts: &attempts[i],
                kills: per,
            }
        })
        .collect();
    let stopped = Instant::now();
    let deadline = stopped + CONVERGE;
    loop {
        let checked: Vec<(usize, Vec<String>, String)> = records
            .iter()
            .map(|r| {
                let (p, summary) = problems(&cluster, &rt, r, &gateway);
                (r.index, p, summary)
            })
            .collect();
        if checked.iter().all(|(_, p, _)| p.is_empty()) {
            for (i, _, summary) in &checked {
                eprintln!("{}: {summary}", nodes[*i].name);
            }
            break;
        }
        let all: Vec<_> = checked
            .into_iter()
            .filter(|(_, p, _)| !p.is_empty())
            .collect();
        if Instant::now() > deadline {
            let mut msg = format!(
                "{report}the cluster did not converge within {} s of the end of the chaos:\n",
                CONVERGE.as_secs()
            );
            for (i, p, _) in &all {
                let _ = writeln!(msg, "{}:\n  - {}", nodes[*i].name, p.join("\n  - "));
                let _ = writeln!(msg, "patches:\n{}", attempt_log(*i));
                msg.push_str(&diagnostics(&cluster, &nodes[*i]));
            }
            let _ = writeln!(msg, "kills:\n{kill_log}");
            panic!("{msg}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "converged {:.1} s after the chaos (seed {seed})",
        stopped.elapsed().as_secs_f64()
    );
    destroy_leaves_nothing(cluster);
}

/// Destroys the cluster and asserts that none of its processes (dnsmasq, supervisors, every
/// process of the nodes' PID namespaces, anything naming its directory), network namespaces
/// or mounts is left, killed daemons and their restarts included.
fn destroy_leaves_nothing(mut cluster: Cluster) {
    let info = cluster.show();
    let mut pids: BTreeSet<i32> = info.dnsmasq_pid.into_iter().collect();
    for n in &info.nodes {
        pids.extend(n.supervisor_pid);
        pids.extend(n.init_pid.map(pid_namespace_members).unwrap_or_default());
    }
    let out = cluster.destroy();
    assert!(out.status.success(), "destroy: {}", text(&out));
    let after = HostSnapshot::take();
    let prefix = format!("{}-", cluster.name);
    let netns: Vec<_> = after
        .netns
        .iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(netns.is_empty(), "network namespaces left: {netns:?}");
    let dir = cluster.cluster_dir().to_string_lossy().into_owned();
    let mounts: Vec<_> = after
        .mounts
        .iter()
        .filter(|m| m.contains(&dir) || m.contains(&cluster.name))
        .collect();
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    let left: Vec<i32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes left: {left:?}");
    let mentioning = processes_mentioning(&dir);
    assert!(mentioning.is_empty(), "processes left: {mentioning:?}");
    assert!(!cluster.cluster_dir().exists(), "{dir} is removed");
}
