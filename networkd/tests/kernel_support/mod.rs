//! What the kernel tests share: a network namespace of their own, stated in process, the real
//! networkd binary started inside the namespace (and its own UTS namespace, so the hostname it
//! sets is not the host's), observation with the kernel's own view (`ip -n NS -j ...`), a
//! recorder of kernel events (`ip -n NS monitor`) and a dnsmasq in a second namespace.
//!
//! Everything is removed on drop, also when a test panics; networkd's log is printed on failure.
//! `ip` is used only to set up and observe: networkd itself never runs it.
#![allow(dead_code)]

pub mod ns;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cosi::{Resource, ResourceSpec};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE as CONFIG_NS};
use serde_json::Value;

// Not every test uses every helper.
#[allow(unused_imports)]
pub use ns::{run, wait_for, Dnsmasq, Netns, Proc, COUNTER, DHCP6_SERVER, DHCP_SERVER};

/// How long a convergence may take before a test fails.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// Reports that `test` cannot run its subject here: prints `SKIPPED: <test>: <reason>` and,
/// under `CI=true`, fails (a test that cannot run must not pass silently in CI).
pub fn skip(test: &str, reason: &str) {
    testkit::skip_named(test, reason);
}

/// Whether `test` can run here: root, `ip`, and whatever `needs` lists (program, reason) is
/// installed; otherwise [`skip`]s it.
pub fn require(test: &str, needs: &[(&str, &str)]) -> bool {
    if !nix::unistd::geteuid().is_root() {
        skip(
            test,
            "kernel tests need root (network namespaces, netlink writes)",
        );
        return false;
    }
    for (program, reason) in [("ip", "iproute2 is not installed")].iter().chain(needs) {
        let found = Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            skip(test, reason);
            return false;
        }
    }
    true
}

/// Whether the running test can run here: root (namespaces, netlink writes) and `ip`;
/// otherwise it is [`skip`]ped under its own name (the test thread's).
pub fn can_run() -> bool {
    let current = std::thread::current();
    require(current.name().unwrap_or("kernel test"), &[])
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
        self.networkd = Some(Proc::new(child, log));
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
            proc: Proc::new(child, log),
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

impl Dnsmasq {
    /// [`Dnsmasq::start_in`] the node's namespace, with its files in the node's directory.
    pub fn start(node: &Node, node_link: &str) -> Self {
        Self::start_in(&node.netns, node.dir.path(), node_link)
    }
}
