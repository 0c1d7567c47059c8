//! A real node for tests: init, stated, networkd and test daemons from the build's target
//! directory, copied into a temporary node tree and run as in container mode (init is PID 1 of
//! new PID, mount, network and UTS namespaces), or in development mode (not PID 1, own network
//! namespace; own UTS namespace with [`NodeBuilder::own_uts`]). Needs root.
//!
//! Cleanup does not depend on the test ending well: init runs under `setpriv --pdeathsig
//! SIGKILL unshare --kill-child`, so if the test thread dies, unshare dies, init dies, and with
//! PID 1 of its namespace the kernel kills every daemon and service. In development mode,
//! [`Node`]'s drop kills whatever runs from the node's binary directory.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use proto::init::init_client::InitClient;
use proto::init::{ListRequest, Service};
use tonic::transport::Channel;

/// True when the tests may switch uids, create namespaces and sandboxes.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The directory of the build's binaries (`target/debug`), from the running test or example
/// executable.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let deps = exe.parent().unwrap_or(Path::new("."));
    if deps.ends_with("deps") || deps.ends_with("examples") {
        deps.parent().unwrap_or(deps).to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// A client of init's control socket at `path`.
pub fn control_client(path: &Path) -> InitClient<Channel> {
    let channel = cosi::unix_channel(path);
    InitClient::new(channel)
}

/// How init runs in a test node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeMode {
    /// PID 1 of new PID, mount, network and UTS namespaces (`--mode container`).
    Container,
    /// Not PID 1, in its own network namespace (`--mode dev`).
    Dev,
}

/// A test daemon (`init-testd`) to add to the shipped manifest.
#[derive(Clone, Debug)]
pub struct TestDaemon {
    /// Its name.
    pub name: String,
    /// Its uid and gid.
    pub uid: u32,
    /// The namespace it writes.
    pub namespace: String,
    /// Extra arguments of init-testd (`--exit 1`, `--service-spec JSON`).
    pub args: Vec<String>,
    /// Extra YAML lines of its manifest entry, indented by 4 (`restart: {...}`, `envelope:`).
    pub extra: String,
}

impl TestDaemon {
    /// A test daemon writing `namespace` as `uid`.
    pub fn new(name: &str, uid: u32, namespace: &str) -> TestDaemon {
        TestDaemon {
            name: name.to_string(),
            uid,
            namespace: namespace.to_string(),
            args: vec![],
            extra: String::new(),
        }
    }

    /// Adds init-testd arguments.
    #[must_use]
    pub fn args(mut self, args: &[&str]) -> TestDaemon {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Adds manifest lines (indented by 4 spaces).
    #[must_use]
    pub fn extra(mut self, yaml: &str) -> TestDaemon {
        self.extra.push_str(yaml);
        self
    }

    fn yaml(&self) -> String {
        let args: Vec<String> = [
            "--socket",
            "{root}/run/stated/state.sock",
            "--namespace",
            &self.namespace,
            "--notify-fd",
            "3",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(self.args.iter().cloned())
        .map(|a| serde_json::Value::String(a).to_string())
        .collect();
        format!(
            r#"
  - name: {name}
    binary: "{{bin}}/init-testd"
    args: [{args}]
    uid: {uid}
    gid: {uid}
    landlock:
      paths:
        - {{path: "{{bin}}/init-testd", access: exec}}
        - {{path: /usr/lib, access: exec, optional: true}}
        - {{path: /lib64, access: exec, optional: true}}
        - {{path: /etc/ld.so.cache, access: read-only, optional: true}}
    seccomp: testd
    writes: [{ns}]
    readiness: notify
    stopTimeoutMs: 5000
{extra}
"#,
            name = self.name,
            args = args.join(", "),
            uid = self.uid,
            ns = self.namespace,
            extra = self.extra,
        )
    }
}

/// Builds a [`Node`].
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    mode: NodeMode,
    daemons: Vec<TestDaemon>,
    config: Option<String>,
    networkd: bool,
    secretsd: bool,
    edits: Vec<(String, String)>,
    own_uts: bool,
}

/// A TCP connection being opened (the shape of `machinery::tls::Dial`).
pub use sandbox::netns::Dial;

/// The binaries a node needs, in the target directory.
pub const BINARIES: &[&str] = &[
    "init",
    "stated",
    "networkd",
    "blockd",
    "secretsd",
    "trustd",
    "apid",
    "k8sd",
    "init-testd",
];

impl NodeBuilder {
    /// Runs init in `mode`.
    #[must_use]
    pub fn mode(mut self, mode: NodeMode) -> Self {
        self.mode = mode;
        self
    }

    /// Adds a test daemon.
    #[must_use]
    pub fn daemon(mut self, d: TestDaemon) -> Self {
        self.daemons.push(d);
        self
    }

    /// Seeds the config namespace with this machine configuration (`--config`).
    #[must_use]
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(yaml.to_string());
        self
    }

    /// Replaces `from` with `to` in the shipped manifest (e.g. to change a restart policy).
    #[must_use]
    pub fn edit(mut self, from: &str, to: &str) -> Self {
        self.edits.push((from.to_string(), to.to_string()));
        self
    }

    /// Development mode: runs init in a UTS namespace of its own, with `--own-uts` (container
    /// mode always has its own UTS namespace).
    #[must_use]
    pub fn own_uts(mut self) -> Self {
        self.own_uts = true;
        self
    }

    /// Leaves networkd out of the manifest.
    #[must_use]
    pub fn without_networkd(mut self) -> Self {
        self.networkd = false;
        self
    }

    /// Leaves secretsd out of the manifest.
    #[must_use]
    pub fn without_secretsd(mut self) -> Self {
        self.secretsd = false;
        self
    }

    /// The manifest this node runs.
    pub fn manifest(&self) -> String {
        let mut text = crate::DEFAULT_MANIFEST.to_string();
        for (from, to) in &self.edits {
            text = text.replace(from, to);
        }
        if !self.networkd {
            text = without_daemon(&text, "networkd");
        }
        if !self.secretsd {
            text = without_daemon(&text, "secretsd");
        }
        let namespaces: String = self
            .daemons
            .iter()
            .map(|d| {
                format!(
                    "  - {{name: {}, description: \"test daemon {}\"}}\n",
                    d.namespace, d.name
                )
            })
            .collect();
        text = text.replacen("namespaces:\n", &format!("namespaces:\n{namespaces}"), 1);
        for d in &self.daemons {
            text.push_str(&d.yaml());
        }
        text
    }

    /// Copies the binaries, writes the manifest and starts init. Panics with a message naming
    /// what is missing when a binary has not been built.
    pub fn start(self) -> Node {
        let target = target_dir();
        let dir = tempfile::Builder::new()
            .prefix("init-node-")
            .tempdir()
            .expect("temporary directory");
        let base = dir.path().to_path_buf();
        let bin = base.join("bin");
        let root = base.join("root");
        std::fs::create_dir_all(&bin).expect("bin dir");
        std::fs::create_dir_all(&root).expect("root dir");
        use std::os::unix::fs::PermissionsExt;
        for d in [&base, &bin, &root] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        for b in BINARIES {
            let from = target.join(b);
            assert!(
                from.exists(),
                "{} is not built: run `cargo build -p init -p stated -p networkd -p secretsd -p trustd -p apid` first",
                from.display()
            );
            std::fs::copy(&from, bin.join(b)).expect("copy binary");
        }
        let manifest = base.join("daemons.yaml");
        std::fs::write(&manifest, self.manifest()).expect("manifest");
        let log = base.join("init.log");
        let config = self.config.as_ref().map(|config| {
            let path = base.join("config.yaml");
            std::fs::write(&path, config).expect("config");
            path
        });
        let boot = Boot {
            mode: self.mode,
            own_uts: self.own_uts,
            manifest,
            config,
        };
        let started = Instant::now();
        let child = boot.spawn(&bin, &root, &log);
        Node {
            dir,
            root: root.clone(),
            bin,
            state_socket: root.join("run/stated/state.sock"),
            init_socket: root.join("run/init/init.sock"),
            log,
            mode: self.mode,
            child: Some(child),
            started,
            boot,
        }
    }
}

/// How init is started, again at each [`Node::reboot`].
struct Boot {
    mode: NodeMode,
    own_uts: bool,
    manifest: PathBuf,
    config: Option<PathBuf>,
}

impl Boot {
    /// Starts init in new namespaces over `root`, its output appended to `log`.
    fn spawn(&self, bin: &Path, root: &Path, log: &Path) -> Child {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "SIGKILL", "--", "unshare", "--net"]);
        // init sets the hostname in container mode (and with --own-uts): never the host's.
        if self.mode == NodeMode::Container || self.own_uts {
            cmd.arg("--uts");
        }
        if self.mode == NodeMode::Container {
            cmd.args(["--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc"]);
        }
        cmd.arg("--").arg(bin.join("init"));
        cmd.args([
            "--mode",
            match self.mode {
                NodeMode::Container => "container",
                NodeMode::Dev => "dev",
            },
        ]);
        cmd.arg("--root").arg(root);
        cmd.arg("--bin-dir").arg(bin);
        cmd.arg("--manifest").arg(&self.manifest);
        if self.own_uts && self.mode == NodeMode::Dev {
            cmd.arg("--own-uts");
        }
        if let Some(path) = &self.config {
            cmd.arg("--config").arg(path);
        }
        cmd.env("RUST_LOG", "info,init::output=debug");
        cmd.stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file);
        cmd.spawn().expect("spawn setpriv/unshare/init")
    }
}

/// The manifest `text` without the entry of daemon `name` (from its `  - name:` line to the
/// next entry or the end).
fn without_daemon(text: &str, name: &str) -> String {
    let marker = format!("  - name: {name}\n");
    let Some(start) = text.find(&marker) else {
        return text.to_string();
    };
    let rest = &text[start + marker.len()..];
    let end = rest
        .find("\n  - name: ")
        .map_or(text.len(), |i| start + marker.len() + i + 1);
    format!("{}{}", &text[..start], &text[end..])
}

/// A running test node.
pub struct Node {
    dir: tempfile::TempDir,
    /// The node's root directory.
    pub root: PathBuf,
    /// Its binaries.
    pub bin: PathBuf,
    /// stated's socket.
    pub state_socket: PathBuf,
    /// init's control socket.
    pub init_socket: PathBuf,
    /// init's output (its log and, at debug level, every daemon's output).
    pub log: PathBuf,
    /// How init runs.
    pub mode: NodeMode,
    child: Option<Child>,
    /// When init was spawned.
    pub started: Instant,
    boot: Boot,
}

impl Node {
    /// A node with the shipped manifest (stated, networkd), in container mode.
    pub fn builder() -> NodeBuilder {
        NodeBuilder {
            mode: NodeMode::Container,
            daemons: vec![],
            config: None,
            networkd: true,
            secretsd: true,
            edits: vec![],
            own_uts: false,
        }
    }

    /// The temporary directory of the node.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// init's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client of init's control socket.
    pub fn control(&self) -> InitClient<Channel> {
        control_client(&self.init_socket)
    }

    /// A client of the node's stated (as admin: the tests run as root).
    pub fn state(&self) -> cosi::Client {
        cosi::Client::new(&self.state_socket).expect("stated client")
    }

    /// Every daemon and service, as init lists them.
    pub async fn list(&self) -> Result<Vec<Service>, tonic::Status> {
        Ok(self
            .control()
            .list(ListRequest {})
            .await?
            .into_inner()
            .services)
    }

    /// One daemon or service.
    pub async fn service(&self, id: &str) -> Option<Service> {
        self.list().await.ok()?.into_iter().find(|s| s.id == id)
    }

    /// Waits until `check` holds for the listed units, or panics with the log after `timeout`.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[Service]) -> bool,
    ) -> Vec<Service> {
        let deadline = Instant::now() + timeout;
        let mut last = Vec::new();
        loop {
            if let Ok(list) = self.list().await {
                if check(&list) {
                    return list;
                }
                last = list;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; last list: {last:#?}\n--- init log ---\n{}",
                    tail(&self.log_text(), 80)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every unit of `ids` is healthy.
    pub async fn wait_healthy(&self, ids: &[&str], timeout: Duration) -> Vec<Service> {
        self.wait_until(&format!("{ids:?} healthy"), timeout, |l| {
            ids.iter()
                .all(|id| l.iter().any(|s| s.id == *id && s.healthy && s.pid != 0))
        })
        .await
    }

    /// The PID of the process init knows as `pid`, as this process sees it (they differ when
    /// init is PID 1 of its own PID namespace).
    pub fn host_pid(&self, pid: i32) -> Option<i32> {
        if self.mode == NodeMode::Dev {
            return Some(pid);
        }
        let init = self.init_host_pid()?;
        let ns = std::fs::read_link(format!("/proc/{init}/ns/pid")).ok()?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if std::fs::read_link(format!("/proc/{p}/ns/pid"))
                .ok()
                .as_ref()
                != Some(&ns)
            {
                continue;
            }
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last())
                .and_then(|v| v.parse::<i32>().ok());
            if inner == Some(pid) {
                return Some(p);
            }
        }
        None
    }

    /// init's PID as this process sees it.
    pub fn init_host_pid(&self) -> Option<i32> {
        let child = i32::try_from(self.child.as_ref()?.id()).ok()?;
        if self.mode == NodeMode::Dev {
            return Some(child);
        }
        // unshare --fork: init is unshare's only child.
        let children =
            std::fs::read_to_string(format!("/proc/{child}/task/{child}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// Opens TCP connections from inside the node's network namespace (for
    /// [`machinery::tls::channel_via`]): each from a thread of its own that enters the
    /// namespace, so no other thread of the test changes namespace.
    pub fn dial(&self) -> impl Fn(std::net::SocketAddr) -> Dial + Clone + Send + 'static {
        let netns = self
            .init_host_pid()
            .map(|p| PathBuf::from(format!("/proc/{p}/ns/net")))
            .ok_or_else(|| "init is not running".to_string());
        sandbox::netns::dial_in(netns, Duration::from_secs(5))
    }

    /// Runs a command in the node's network namespace and returns its stdout.
    pub fn in_netns(&self, args: &[&str]) -> String {
        let Some(init) = self.init_host_pid() else {
            return String::new();
        };
        let out = Command::new("nsenter")
            .arg(format!("--net=/proc/{init}/ns/net"))
            .arg("--")
            .args(args)
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The hostname of init's UTS namespace (`nsenter --uts=/proc/<init>/ns/uts hostname`).
    pub fn hostname(&self) -> Option<String> {
        let init = self.init_host_pid()?;
        let out = Command::new("nsenter")
            .arg(format!("--uts=/proc/{init}/ns/uts"))
            .arg("--")
            .arg("hostname")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// A reboot of the node: init is stopped (SIGTERM, every daemon in order) and started
    /// again over the same root, its durable state (stated's `config` namespace) kept; in new
    /// network and PID namespaces, as a machine that booted again.
    pub fn reboot(&mut self, timeout: Duration) {
        assert!(
            self.terminate(timeout).is_some(),
            "init did not end within {timeout:?}\n{}",
            tail(&self.log_text(), 40)
        );
        self.started = Instant::now();
        self.child = Some(self.boot.spawn(&self.bin, &self.root, &self.log));
    }

    /// Sends SIGTERM to init and waits for it to end (up to `timeout`); returns its status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let init = self.init_host_pid()?;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(init),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.wait_exit(timeout)
    }

    /// Waits for init (and unshare) to end; `None` on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Processes still running from the node's binary directory (should be none after init
    /// ended).
    pub fn leftovers(&self) -> Vec<i32> {
        let mut found = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return found;
        };
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let exe = std::fs::read_link(format!("/proc/{p}/exe")).unwrap_or_default();
            let mut cmdline = String::new();
            let _ = std::fs::File::open(format!("/proc/{p}/cmdline"))
                .and_then(|mut f| f.read_to_string(&mut cmdline));
            if exe.starts_with(&self.bin) || cmdline.contains(&*self.root.to_string_lossy()) {
                found.push(p);
            }
        }
        found
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() && self.terminate(Duration::from_secs(20)).is_none() {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for p in self.leftovers() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
