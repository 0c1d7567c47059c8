//! Clusters for tests: real nodes booted with the real provisioner (`talosctl cluster create`)
//! from a node image built from this build's binaries, torn down with `talosctl cluster
//! destroy` whatever happens — when the test ends, panics or fails half-way.
//!
//! ```no_run
//! # fn main() {
//! // One control plane and two workers; destroyed when `cluster` is dropped.
//! let cluster = node_tests::Cluster::create(3);
//! let out = cluster.talosctl(&["-n", &cluster.nodes()[1].name, "get", "addresses"]);
//! assert!(out.status.success());
//! # }
//! ```
//!
//! Needs root (namespaces, mounts) and the binaries `init`, `stated`, `networkd` and
//! `talosctl` of this build (`cargo build --workspace`, which `scripts/test.sh` runs first).
//! Each cluster gets its own state directory and talosconfig in a temporary directory: tests
//! never touch `~/.talos`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use serde::Deserialize;

/// True when the tests can create namespaces and mounts.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips the calling test (returns) with a message unless it runs as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !testkit::require_root("cluster tests make namespaces, mounts and network links") {
            return;
        }
    };
}

/// The directory of this build's binaries (`target/debug`), from the running test binary.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let deps = exe.parent().unwrap_or(Path::new("."));
    if deps.ends_with("deps") || deps.ends_with("examples") {
        deps.parent().unwrap_or(deps).to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// This build's talosctl. Panics with the command to run when it is not built.
pub fn talosctl_bin() -> PathBuf {
    let p = target_dir().join("talosctl");
    assert!(
        p.exists(),
        "{} is not built: run `cargo build -p talosctl -p init -p stated -p networkd` first",
        p.display()
    );
    p
}

/// The node image of this build's binaries, built once per test process into
/// `target/<profile>/node-tests-image/tree` (a tree only: booting in namespaces needs no
/// initramfs). The previous tree is replaced only once the new one is complete.
pub fn image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let bin = target_dir();
        for p in rootfs::PROGRAMS {
            assert!(
                bin.join(p).exists(),
                "{} is not built: run `cargo build -p init -p stated -p networkd` first",
                bin.join(p).display()
            );
        }
        let dir = bin.join("node-tests-image");
        std::fs::create_dir_all(&dir).expect("image directory");
        let tree = dir.join("tree");
        let tmp = dir.join(format!(".tree.{}", std::process::id()));
        let old = dir.join(format!(".old.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let image = rootfs::plan(&rootfs::Inputs::new(&bin, 0)).expect("plan the image");
        image.write_tree(&tmp, 0).expect("write the image tree");
        if tree.exists() {
            std::fs::rename(&tree, &old).expect("move the old image");
        }
        std::fs::rename(&tmp, &tree).expect("install the image");
        let _ = std::fs::remove_dir_all(&old);
        tree
    })
}

/// A node as `talosctl cluster show -o json` lists it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// Name and hostname.
    pub name: String,
    /// `controlplane` or `worker`.
    pub role: String,
    /// Its IPv4 address.
    pub ip: String,
    /// Prefix length of the cluster network.
    pub prefix: u8,
    /// MAC of its eth0.
    pub mac: String,
    /// Where its apid is published on the host (`127.0.0.1:<port>`).
    pub api: Option<String>,
    /// `ready`, `running`, `booting` or `stopped`.
    pub state: String,
    /// init's PID on the host.
    pub init_pid: Option<i32>,
    /// The supervisor's PID on the host.
    pub supervisor_pid: Option<i32>,
    /// Its named network namespace.
    pub netns: String,
    /// Its state directory.
    pub dir: PathBuf,
}

/// A cluster as `talosctl cluster show -o json` describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// Its name.
    pub name: String,
    /// Its state directory.
    pub dir: PathBuf,
    /// Its network.
    pub cidr: String,
    /// The bridge's address.
    pub gateway: String,
    /// The network namespace of the bridge and dnsmasq.
    pub netns: String,
    /// dnsmasq's PID.
    pub dnsmasq_pid: Option<i32>,
    /// The nodes, control planes first.
    pub nodes: Vec<NodeInfo>,
}

/// Builds a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterBuilder {
    controlplanes: u32,
    workers: u32,
    args: Vec<String>,
    env: Vec<(String, String)>,
    image: Option<PathBuf>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A name no other test process uses at the same time.
pub fn unique_name(tag: &str) -> String {
    format!(
        "t{tag}{}{}",
        std::process::id() % 100_000,
        char::from(b'a' + (SEQ.fetch_add(1, Ordering::Relaxed) % 26) as u8)
    )
}

impl ClusterBuilder {
    /// Control plane nodes (default 1).
    #[must_use]
    pub fn controlplanes(mut self, n: u32) -> Self {
        self.controlplanes = n;
        self
    }

    /// Workers (default 0).
    #[must_use]
    pub fn workers(mut self, n: u32) -> Self {
        self.workers = n;
        self
    }

    /// More `talosctl cluster create` arguments (`--config-patch`, `--cidr`…).
    #[must_use]
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_string());
        self
    }

    /// Another node image than [`image`].
    #[must_use]
    pub fn image(mut self, tree: &Path) -> Self {
        self.image = Some(tree.to_path_buf());
        self
    }

    /// An environment variable for `talosctl cluster create`.
    #[must_use]
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Runs `talosctl cluster create`; returns the cluster (to be destroyed on drop) and the
    /// command's output, whether it succeeded or not.
    pub fn try_create(self) -> (Cluster, Output) {
        let dir = tempfile::Builder::new()
            .prefix("node-tests-")
            .tempdir()
            .expect("temporary directory");
        let cluster = Cluster {
            name: unique_name(""),
            state: dir.path().join("clusters"),
            talosconfig: dir.path().join("talosconfig"),
            dir,
            info: None,
            destroyed: false,
        };
        let mut cmd = cluster.command();
        cmd.args(["cluster", "create", "--name", &cluster.name])
            .arg("--state")
            .arg(&cluster.state)
            .arg("--image")
            .arg(self.image.as_deref().unwrap_or_else(|| image()))
            .args([
                "--controlplanes",
                &self.controlplanes.to_string(),
                "--workers",
                &self.workers.to_string(),
                "--wait-timeout",
                "90",
            ])
            .args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run talosctl cluster create");
        let mut cluster = cluster;
        if out.status.success() {
            cluster.info = Some(cluster.show());
        }
        (cluster, out)
    }

    /// Creates the cluster; panics with talosctl's output if that fails.
    pub fn create(self) -> Cluster {
        let (cluster, out) = self.try_create();
        assert!(
            out.status.success(),
            "talosctl cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }
}

/// A local cluster, destroyed with `talosctl cluster destroy` when dropped.
pub struct Cluster {
    /// Its name.
    pub name: String,
    /// The state root (`--state`).
    pub state: PathBuf,
    /// Its talosconfig.
    pub talosconfig: PathBuf,
    dir: tempfile::TempDir,
    info: Option<ClusterInfo>,
    destroyed: bool,
}

impl Cluster {
    /// A builder: one control plane, no workers.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            controlplanes: 1,
            workers: 0,
            args: vec![],
            env: vec![],
            image: None,
        }
    }

    /// A cluster of `nodes` nodes: one control plane, the rest workers.
    pub fn create(nodes: u32) -> Cluster {
        Self::builder().workers(nodes.saturating_sub(1)).create()
    }

    /// The temporary directory holding the state root and talosconfig.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cluster's state directory.
    pub fn cluster_dir(&self) -> PathBuf {
        self.state.join(&self.name)
    }

    /// talosctl with this cluster's talosconfig and nothing of the environment's talos
    /// settings.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(talosctl_bin());
        cmd.env("TALOSCONFIG", &self.talosconfig)
            .env_remove("TALOS_SOCKET")
            .env_remove("TALOS_INIT_SOCKET")
            .env_remove("TALOS_IMAGE")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs talosctl with `args` (its talosconfig set) and returns its output.
    pub fn talosctl(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run talosctl")
    }

    /// `talosctl cluster show -o json`.
    pub fn show(&self) -> ClusterInfo {
        let out = self.talosctl(&[
            "cluster",
            "show",
            "--name",
            &self.name,
            "--state",
            &self.state.to_string_lossy(),
            "-o",
            "json",
        ]);
        assert!(
            out.status.success(),
            "cluster show: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("cluster show -o json")
    }

    /// The nodes as they were once the cluster was created.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.info
            .as_ref()
            .map(|i| i.nodes.clone())
            .unwrap_or_default()
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> NodeInfo {
        self.nodes()
            .into_iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// A stated client of a node (as admin: through init's root on the host).
    pub fn state(&self, node: &NodeInfo) -> cosi::Client {
        let pid = node.init_pid.expect("the node runs");
        cosi::Client::new(format!("/proc/{pid}/root/run/stated/state.sock")).expect("client")
    }

    /// Runs a command in a node's network namespace (`ip netns exec`), for observation.
    pub fn in_netns(&self, node: &NodeInfo, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &node.netns])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("ip netns exec")
    }

    /// `talosctl cluster destroy`; the drop does nothing more after it succeeded.
    pub fn destroy(&mut self) -> Output {
        let out = self.talosctl(&[
            "cluster",
            "destroy",
            "--name",
            &self.name,
            "--state",
            &self.state.to_string_lossy(),
        ]);
        if out.status.success() || !self.cluster_dir().exists() {
            self.destroyed = true;
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.destroyed || !self.cluster_dir().exists() {
            return;
        }
        let out = self.destroy();
        if !out.status.success() || std::thread::panicking() {
            eprintln!(
                "---- cluster destroy {} ----\n{}{}",
                self.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// What a cluster may leave on the host: named network namespaces, the host's links, mounts
/// naming a path, and processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSnapshot {
    /// `ip netns list` names.
    pub netns: Vec<String>,
    /// The host's own links (`ip -o link`, names only).
    pub links: Vec<String>,
    /// The host's mount points.
    pub mounts: Vec<String>,
}

impl HostSnapshot {
    /// Takes a snapshot.
    pub fn take() -> HostSnapshot {
        let run = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let mut netns: Vec<String> = run(&["netns", "list"])
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        netns.sort();
        let mut links: Vec<String> = run(&["-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|s| s.trim().to_string()))
            .collect();
        links.sort();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .collect();
        mounts.sort();
        HostSnapshot {
            netns,
            links,
            mounts,
        }
    }
}

/// Every process in the PID namespace of `pid` (as host PIDs).
pub fn pid_namespace_members(pid: i32) -> Vec<i32> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/pid")) else {
        return vec![];
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
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
            == Some(&ns)
        {
            out.push(p);
        }
    }
    out
}

/// Whether a process runs (not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace()
                .next()
                .map(|st| st != "Z" && st != "X")
        })
        .unwrap_or(false)
}

/// Processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if cmdline.contains(needle) && alive(p) {
            out.push((p, cmdline));
        }
    }
    out
}

/// stdout and stderr of an output, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
