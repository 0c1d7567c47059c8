//! The part of the kernel test support that needs neither stated nor the networkd binary:
//! uniquely named network namespaces, child processes stopped on drop, polling, and a dnsmasq
//! in a namespace of its own. Shared with the networkd benchmark (`bench/src/networkd/`), which
//! includes this file by path.
//!
//! Everything is removed on drop, also on a panic.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// Makes names (namespaces, logs) unique within the process.
pub static COUNTER: AtomicUsize = AtomicUsize::new(0);

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

    /// Sets a sysctl inside the namespace (`ip netns exec NAME sysctl -w key=value`).
    pub fn sysctl(&self, key: &str, value: &str) {
        run(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "sysctl",
                "-q",
                "-w",
                &format!("{key}={value}"),
            ],
        );
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
    /// Wraps a started child whose stderr (or stdout) goes to `log`.
    pub fn new(child: Child, log: PathBuf) -> Self {
        Self { child, log }
    }

    /// Its process id (`ip netns exec` and `unshare` exec the command, so this is the
    /// command's own pid).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

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
/// The server's IPv6 address on the test link (dual-stack servers).
pub const DHCP6_SERVER: &str = "fd00:213::1";

impl Dnsmasq {
    /// Creates the server namespace, a veth pair (`node_link` in the node's namespace, down,
    /// `srv0` in the server's, up with [`DHCP_SERVER`]/24) and starts dnsmasq on `srv0` leasing
    /// 10.213.0.50–99 for 2 minutes with T1 = 10 s, T2 = 20 s, DNS, NTP, domain and search
    /// options, and a classless default route. Its files (lease file, log, pid file) go in
    /// `dir`.
    pub fn start_in(node_netns: &Netns, dir: &Path, node_link: &str) -> Self {
        Self::start_with(node_netns, dir, node_link, &[])
    }

    /// [`Dnsmasq::start_in`] with `extra` arguments for dnsmasq (e.g. `--no-ping`).
    pub fn start_with(node_netns: &Netns, dir: &Path, node_link: &str, extra: &[&str]) -> Self {
        Self::start_full(node_netns, dir, node_link, false, extra)
    }

    /// [`Dnsmasq::start_in`], serving DHCPv6 as well: `srv0` also has [`DHCP6_SERVER`]/64
    /// (no duplicate address detection on the server side, which is not under test), and
    /// dnsmasq leases `fd00:213::100`–`1ff` (IA_NA, stateful, no router advertisements) for
    /// 2 minutes (T1 60 s, T2 105 s) with DNS `fd00:213::53`, search domain `corp6.example`
    /// and NTP `fd00:213::123`.
    pub fn start_dual_stack(node_netns: &Netns, dir: &Path, node_link: &str) -> Self {
        Self::start_full(node_netns, dir, node_link, true, &[])
    }

    fn start_full(
        node_netns: &Netns,
        dir: &Path,
        node_link: &str,
        ipv6: bool,
        extra: &[&str],
    ) -> Self {
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
            &node_netns.name,
        ]);
        netns.ip(&["addr", "add", &format!("{DHCP_SERVER}/24"), "dev", "srv0"]);
        if ipv6 {
            netns.sysctl("net.ipv6.conf.srv0.disable_ipv6", "0");
            netns.sysctl("net.ipv6.conf.srv0.accept_dad", "0");
            netns.ip(&[
                "addr",
                "add",
                &format!("{DHCP6_SERVER}/64"),
                "dev",
                "srv0",
                "nodad",
            ]);
        }
        netns.ip(&["link", "set", "srv0", "up"]);
        netns.ip(&["link", "set", "lo", "up"]);
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
            .args(if ipv6 {
                &[
                    "--dhcp-range=fd00:213::100,fd00:213::1ff,64,2m",
                    "--dhcp-option=option6:dns-server,[fd00:213::53]",
                    "--dhcp-option=option6:domain-search,corp6.example",
                    "--dhcp-option=option6:ntp-server,[fd00:213::123]",
                ][..]
            } else {
                &[][..]
            })
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .args(extra)
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
