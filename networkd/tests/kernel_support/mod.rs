//! What the kernel tests share: a network namespace of their own, stated in process, the real
//! networkd binary started inside the namespace (and its own UTS namespace, so the hostname it
//! sets is not the host's), observation with the kernel's own view (`ip -n NS -j ...`), a
//! recorder of kernel events (`ip -n NS monitor`) and a dnsmasq in a second namespace.
//!
//! Everything is removed on drop, also when a test panics; networkd's log is printed on failure.
//! `ip` is used only to set up and observe: networkd itself never runs it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cosi::{Resource, ResourceSpec};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG_NS};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// How long a convergence may take before a test fails.
pub const CONVERGE: Duration = Duration::from_secs(30);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Whether the tests can run here: root (namespaces, netlink writes) and `ip`.
pub fn can_run() -> bool {
    let root = nix::unistd::geteuid().is_root();
    let ip = Command::new("ip").arg("-V").output().is_ok();
    if !(root && ip) {
        eprintln!("skipped: kernel tests need root and iproute2");
    }
    root && ip
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace with a unique name, deleted on drop.
pub struct Netns {
    /// Its name (`ip netns` name).
    pub name: String,
}

impl Netns {
    /// Creates `trs-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("trs-{tag}-{}-{n}", std::process::id());
        run("ip", &["netns", "add", &name]);
        Self { name }
    }

    /// `ip -n NAME args...`.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `ip -n NAME -j args...`, parsed.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        let text = self.ip(&all);
        if text.trim().is_empty() {
            return Value::Array(vec![]);
        }
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("ip -j output: {e}: {text}"))
    }

    /// The addresses (`a.b.c.d/len`) of `dev`, empty if the link does not exist.
    pub fn addresses(&self, dev: &str) -> Vec<String> {
        let all = self.ip_json(&["addr", "show"]);
        let mut out = Vec::new();
        for link in all.as_array().into_iter().flatten() {
            if link["ifname"] != dev {
                continue;
            }
            for a in link["addr_info"].as_array().into_iter().flatten() {
                out.push(format!(
                    "{}/{}",
                    a["local"].as_str().unwrap_or_default(),
                    a["prefixlen"]
                ));
            }
        }
        out
    }

    /// The link `dev` as `ip -j link show` reports it, if it exists.
    pub fn link(&self, dev: &str) -> Option<Value> {
        let all = self.ip_json(&["-d", "link", "show"]);
        all.as_array()?.iter().find(|l| l["ifname"] == dev).cloned()
    }

    /// The IPv4 routes of the main table.
    pub fn routes(&self) -> Vec<Value> {
        self.ip_json(&["-4", "route", "show", "table", "main"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The IPv4 route to `dst` (`default` or `a.b.c.d/len`) in the main table, if any.
    pub fn route(&self, dst: &str) -> Option<Value> {
        self.routes().into_iter().find(|r| r["dst"] == dst)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Polls `f` every 100 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process stopped (SIGTERM, then SIGKILL) on drop.
pub struct Proc {
    child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Proc {
    /// Sends SIGTERM and waits up to 10 s, then kills.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A node: its namespace, stated in process, networkd in the namespace.
pub struct Node {
    /// The node's network namespace.
    pub netns: Netns,
    /// stated.
    pub stated: stated::testing::Harness,
    /// networkd, while started.
    pub networkd: Option<Proc>,
    /// Temporary files (logs, the etc root).
    pub dir: tempfile::TempDir,
    starts: usize,
}

impl Node {
    /// A node with its namespace and stated; networkd not started yet.
    pub async fn new(tag: &str) -> Self {
        let netns = Netns::new(tag);
        let stated = stated::testing::Harness::start().await;
        let dir = tempfile::Builder::new()
            .prefix("networkd-test")
            .tempdir()
            .expect("temporary directory");
        std::fs::create_dir_all(dir.path().join("root/etc")).expect("etc root");
        Self {
            netns,
            stated,
            networkd: None,
            dir,
            starts: 0,
        }
    }

    /// Starts networkd inside the namespace (and a UTS namespace of its own).
    pub fn start_networkd(&mut self) {
        assert!(self.networkd.is_none(), "networkd already runs");
        self.starts += 1;
        let log = self
            .dir
            .path()
            .join(format!("networkd-{}.log", self.starts));
        let file = std::fs::File::create(&log).expect("log file");
        let root = self.dir.path().join("root");
        let socket = self.stated.socket.display().to_string();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns.name, "unshare", "--uts"])
            .arg(env!("CARGO_BIN_EXE_networkd"))
            .args(["--socket", &socket, "--root"])
            .arg(&root)
            .args(["--log-level", "info,networkd=debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start networkd");
        self.networkd = Some(Proc { child, log });
    }

    /// Stops networkd (SIGTERM) and checks it exited.
    pub fn stop_networkd(&mut self) {
        if let Some(mut p) = self.networkd.take() {
            p.stop();
            eprintln!("---- networkd log (run {}) ----\n{}", self.starts, p.log());
        }
    }

    /// Writes the machine configuration (creates or replaces it).
    pub async fn apply_config(&self, yaml: &str) {
        let client = &self.stated.client;
        let r = Resource::new(CONFIG_NS, ACTIVE_ID, MachineConfigSpec(yaml.to_string()));
        let mut raw = r.to_raw().expect("encode");
        match client
            .get(CONFIG_NS, MachineConfigSpec::TYPE, ACTIVE_ID)
            .await
        {
            Ok(current) => {
                raw.metadata.version = current.metadata.version;
                raw.metadata.owner = current.metadata.owner.clone();
                client
                    .update(&raw, &current.metadata.owner, None)
                    .await
                    .expect("update machine config");
            }
            Err(e) if e.is_not_found() => {
                client
                    .create(&raw, "")
                    .await
                    .expect("create machine config");
            }
            Err(e) => panic!("get machine config: {e}"),
        }
    }

    /// A resource's spec as JSON, if it exists.
    pub async fn get(&self, namespace: &str, r#type: &str, id: &str) -> Option<Value> {
        match self.stated.client.get(namespace, r#type, id).await {
            Ok(r) => Some(r.spec_value().expect("spec decodes")),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("get {namespace}/{type}/{id}: {e}"),
        }
    }

    /// The IDs of a kind.
    pub async fn ids(&self, namespace: &str, r#type: &str) -> Vec<String> {
        self.stated
            .client
            .list(namespace, r#type, &cosi::Query::default())
            .await
            .expect("list")
            .into_iter()
            .map(|r| r.metadata.id)
            .collect()
    }

    /// Polls an async check until it returns `Some`.
    pub async fn eventually<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = f().await {
                return v;
            }
            if start.elapsed() > timeout {
                self.dump();
                panic!("timed out waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Prints the networkd log and the kernel's view.
    pub fn dump(&self) {
        if let Some(p) = &self.networkd {
            eprintln!("---- networkd log ----\n{}", p.log());
        }
        if let Ok(out) = Command::new("ip")
            .args(["-n", &self.netns.name, "addr"])
            .output()
        {
            eprintln!(
                "---- ip addr ----\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        if let Ok(out) = Command::new("ip")
            .args(["-n", &self.netns.name, "route", "show", "table", "all"])
            .output()
        {
            eprintln!(
                "---- ip route ----\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }

    /// The etc root networkd renders into.
    pub fn etc_root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
        if let Some(mut p) = self.networkd.take() {
            p.stop();
        }
    }
}

/// Records the kernel's events in a namespace (`ip -n NS -ts monitor link address route`).
pub struct Monitor {
    proc: Proc,
    skip: usize,
}

impl Monitor {
    /// Starts recording.
    pub fn start(netns: &Netns, dir: &Path) -> Self {
        let log = dir.join(format!(
            "monitor-{}.log",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let file = std::fs::File::create(&log).expect("monitor log");
        let child = Command::new("ip")
            .args(["-n", &netns.name, "monitor", "link", "address", "route"])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .expect("start ip monitor");
        // Let it subscribe before anything happens.
        std::thread::sleep(Duration::from_millis(300));
        Self {
            proc: Proc { child, log },
            skip: 0,
        }
    }

    /// Waits until the kernel has been quiet for `quiet` (no event recorded), e.g. for IPv6
    /// duplicate address detection of links that just came up, then forgets what was recorded.
    pub fn settle(&mut self, quiet: Duration) {
        let start = Instant::now();
        let mut last = (self.proc.log().len(), Instant::now());
        while last.1.elapsed() < quiet {
            assert!(start.elapsed() < CONVERGE, "the kernel never got quiet");
            std::thread::sleep(Duration::from_millis(100));
            let len = self.proc.log().len();
            if len != last.0 {
                last = (len, Instant::now());
            }
        }
        self.skip = self.proc.log().len();
    }

    /// Stops recording and returns the events since the last [`settle`](Self::settle), one per
    /// line.
    pub fn finish(mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(300));
        self.proc.stop();
        let log = self.proc.log();
        log.get(self.skip..)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// A dnsmasq DHCP server in its own namespace, on a veth whose peer is in the node's namespace.
pub struct Dnsmasq {
    proc: Proc,
    /// The server's namespace.
    pub netns: Netns,
    /// Its lease file.
    pub leases: PathBuf,
}

/// The server's address on the test link.
pub const DHCP_SERVER: &str = "10.213.0.1";

impl Dnsmasq {
    /// Creates the server namespace, a veth pair (`node_link` in the node's namespace, down,
    /// `srv0` in the server's, up with [`DHCP_SERVER`]/24) and starts dnsmasq on `srv0` leasing
    /// 10.213.0.50–99 for 2 minutes with T1 = 10 s, T2 = 20 s, DNS, NTP, domain and search
    /// options, and a classless default route.
    pub fn start(node: &Node, node_link: &str) -> Self {
        let netns = Netns::new("dhcp");
        netns.ip(&[
            "link",
            "add",
            "srv0",
            "type",
            "veth",
            "peer",
            "name",
            node_link,
            "netns",
            &node.netns.name,
        ]);
        netns.ip(&["addr", "add", &format!("{DHCP_SERVER}/24"), "dev", "srv0"]);
        netns.ip(&["link", "set", "srv0", "up"]);
        netns.ip(&["link", "set", "lo", "up"]);
        let dir = node.dir.path();
        let leases = dir.join("dnsmasq.leases");
        let log = dir.join("dnsmasq.log");
        let file = std::fs::File::create(&log).expect("dnsmasq log");
        let child = Command::new("ip")
            .args(["netns", "exec", &netns.name, "dnsmasq"])
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--port=0",
                "--interface=srv0",
                "--bind-interfaces",
                "--user=root",
                "--group=root",
                "--log-dhcp",
                "--log-facility=-",
                "--dhcp-authoritative",
                "--dhcp-range=10.213.0.50,10.213.0.99,255.255.255.0,2m",
                "--dhcp-option=option:T1,10",
                "--dhcp-option=option:T2,20",
                "--dhcp-option=option:dns-server,10.213.0.53",
                "--dhcp-option=option:ntp-server,10.213.0.123",
                "--dhcp-option=option:domain-name,example.org",
                "--dhcp-option=option:domain-search,corp.example",
                "--dhcp-option=option:mtu,1480",
            ])
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start dnsmasq (apt-get install dnsmasq-base)");
        let mut proc = Proc { child, log };
        std::thread::sleep(Duration::from_millis(300));
        assert!(proc.running(), "dnsmasq exited: {}", proc.log());
        Self {
            proc,
            netns,
            leases,
        }
    }

    /// The lease file's lines.
    pub fn leases(&self) -> Vec<String> {
        std::fs::read_to_string(&self.leases)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// dnsmasq's log so far.
    pub fn log(&self) -> String {
        self.proc.log()
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- dnsmasq log ----\n{}", self.proc.log());
        }
        self.proc.stop();
    }
}
