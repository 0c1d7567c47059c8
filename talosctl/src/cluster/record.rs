//! The record of a local cluster, `<state>/<name>/cluster.json`: what the cluster is (nodes,
//! addresses, namespaces) and every object `cluster create` made, in the order it made them.
//!
//! An object is recorded *before* it is created (a name that may not exist yet is harmless to
//! destroy), and a process right after it started, with its start time so that a recycled PID
//! is never signalled. `cluster destroy` walks the journal backwards, removing each object
//! from the record as it goes, so it can be run again after a failure half-way — of create or
//! of destroy.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// The record's file name in the cluster directory.
pub const RECORD: &str = "cluster.json";

/// A node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A control plane node.
    Controlplane,
    /// A worker.
    Worker,
}

impl Role {
    /// `controlplane` or `worker`, as in machine configs and node names.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Controlplane => "controlplane",
            Role::Worker => "worker",
        }
    }
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Its name and hostname (`<cluster>-controlplane-1`).
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The IPv4 address dnsmasq leases to it (a static lease by MAC).
    pub ip: String,
    /// The prefix length of the cluster network.
    pub prefix: u8,
    /// The MAC address of its `eth0`.
    pub mac: String,
    /// Its named network namespace (`ip netns`); a VM's is the cluster's.
    pub netns: String,
    /// The host side of its link, in the cluster's network namespace: a veth, or a VM's tap.
    pub veth: String,
    /// Its directory: config, overlay upper/work/root, console log.
    pub dir: PathBuf,
    /// The supervisor process on the host (waits for init; PID 1's parent).
    #[serde(default)]
    pub supervisor: Option<Proc>,
    /// init, PID 1 of the node, as the host sees it; a VM's qemu process.
    #[serde(default)]
    pub init: Option<Proc>,
    /// The port of the host's 127.0.0.1 where its apid is published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_port: Option<u16>,
    /// A VM node's disk image (`--provisioner qemu`); none for a node in namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<PathBuf>,
}

impl Node {
    /// The node's overlay root, as mounted in its own mount namespace.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// init's console output (a VM's serial console).
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// Whether the node is a VM (its [`Node::init`] is then its qemu process).
    pub fn is_vm(&self) -> bool {
        self.disk.is_some()
    }

    /// A path of the node's filesystem as reachable from the host, through init's root
    /// (`/proc/<pid>/root/...`), while init runs. None for a VM: its files are in its own
    /// kernel, reached through apid only (qemu's root is the host's).
    pub fn path_in_node(&self, path: &str) -> Option<PathBuf> {
        if self.is_vm() {
            return None;
        }
        let init = self.current_init()?;
        Some(PathBuf::from(format!("/proc/{}/root", init.pid)).join(path.trim_start_matches('/')))
    }
}

impl Node {
    /// init as it runs now: the one `create` recorded, or, after the node rebooted, the one
    /// its supervisor started since (`init.pid`, taken only if it is the grandchild of this
    /// very supervisor: supervisor → boot → init).
    pub fn current_init(&self) -> Option<Proc> {
        if let Some(p) = self.init.as_ref().filter(|p| p.alive()) {
            return Some(p.clone());
        }
        if self.is_vm() {
            // A VM's qemu is not started again by its supervisor (the guest's reboot resets it).
            return None;
        }
        let sup = self.supervisor.as_ref().filter(|p| p.alive())?;
        let text = std::fs::read_to_string(self.dir.join(super::launch::INIT_PID_FILE)).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        let init = Proc::of(pid, &format!("init of {}", self.name))?;
        (parent(parent(pid)?)? == sup.pid && init.alive()).then_some(init)
    }
}

/// The parent of `pid` (`/proc/<pid>/stat` field 4).
fn parent(pid: i32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A process the cluster started: PID and start time (`/proc/<pid>/stat` field 22), so that a
/// reused PID is not taken for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proc {
    /// PID in the host's PID namespace.
    pub pid: i32,
    /// Start time in clock ticks after boot.
    pub start_time: u64,
    /// What it is (`dnsmasq`, `init of demo-worker-1`).
    pub what: String,
}

/// The state of a process, from `/proc/<pid>/stat`: (state letter, start time).
fn stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields follow the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 22 overall; the state is field 3.
    let start = fields.get(22 - 3)?.parse().ok()?;
    Some((state, start))
}

impl Proc {
    /// The process `pid` as it runs now, if it does.
    pub fn of(pid: i32, what: &str) -> Option<Proc> {
        let (_, start_time) = stat(pid)?;
        Some(Proc {
            pid,
            start_time,
            what: what.to_string(),
        })
    }

    /// Whether this very process still runs (a zombie does not).
    pub fn alive(&self) -> bool {
        matches!(stat(self.pid), Some((state, start)) if start == self.start_time && state != 'Z' && state != 'X')
    }

    /// Sends `signal` if this very process still runs.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if self.alive() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), signal);
        }
    }

    /// Waits up to `timeout` for the process to end; true if it did.
    pub fn wait_gone(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if !self.alive() {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// An object `cluster create` made, to be removed by `cluster destroy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Object {
    /// The cluster directory (removed last, with everything in it).
    Dir {
        /// Its path.
        path: PathBuf,
    },
    /// A named network namespace (`/run/netns/<name>`).
    Netns {
        /// Its name.
        name: String,
    },
    /// A link inside one of the cluster's network namespaces.
    Link {
        /// The namespace.
        netns: String,
        /// The link.
        name: String,
    },
    /// A process on the host (dnsmasq, a node's supervisor).
    Process {
        /// Which one.
        #[serde(flatten)]
        proc: Proc,
    },
    /// A node (its init and supervisor are in [`Node`]); stopping it comes first.
    Node {
        /// Its name.
        name: String,
    },
    /// A context in a talosconfig file.
    Context {
        /// The talosconfig file.
        talosconfig: PathBuf,
        /// The context.
        name: String,
        /// The talosconfig file did not exist before.
        #[serde(default)]
        created_file: bool,
    },
}

/// How a cluster's nodes run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Provisioner {
    /// init as PID 1 of Linux namespaces on this host (the host's kernel).
    #[default]
    Container,
    /// VMs under qemu, each with its own kernel.
    Qemu,
}

impl Provisioner {
    /// `container` or `qemu`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provisioner::Container => "container",
            Provisioner::Qemu => "qemu",
        }
    }
}

/// The record of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    /// Its name.
    pub name: String,
    /// How its nodes run.
    #[serde(default)]
    pub provisioner: Provisioner,
    /// Its directory.
    pub dir: PathBuf,
    /// The network (`10.5.0.0/24`).
    pub cidr: String,
    /// The bridge's address (the first of the network), the nodes' gateway and DHCP server.
    pub gateway: String,
    /// The network namespace of the bridge and dnsmasq.
    pub netns: String,
    /// The bridge, inside [`Cluster::netns`].
    pub bridge: String,
    /// The nodes, control planes first.
    pub nodes: Vec<Node>,
    /// dnsmasq.
    #[serde(default)]
    pub dnsmasq: Option<Proc>,
    /// The control plane endpoint's name (`--endpoint`), which dnsmasq answers; `None` for an
    /// address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_name: Option<String>,
    /// Everything created, oldest first.
    pub objects: Vec<Object>,
    /// Unix time of the creation.
    pub created: u64,
}

impl Cluster {
    /// The record's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(RECORD)
    }

    /// Writes the record atomically (temporary file, fsync, rename).
    pub fn save(&self) -> anyhow::Result<()> {
        use std::io::Write as _;
        let path = self.path();
        let tmp = self.dir.join(format!(".{RECORD}.tmp"));
        let text = serde_json::to_string_pretty(self)?;
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }

    /// Reads the record of the cluster in `dir`.
    pub fn load(dir: &Path) -> anyhow::Result<Cluster> {
        let path = dir.join(RECORD);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a cluster record", path.display()))
    }

    /// Appends an object to the journal and saves the record.
    pub fn record(&mut self, object: Object) -> anyhow::Result<()> {
        if !self.objects.contains(&object) {
            self.objects.push(object);
        }
        self.save()
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The node a user names on the command line: by name or IP, with or without `:50000`.
    pub fn find(&self, wanted: &str) -> Option<&Node> {
        let host = wanted.strip_suffix(":50000").unwrap_or(wanted);
        self.nodes.iter().find(|n| n.name == host || n.ip == host)
    }

    /// The node called `name`, to change.
    pub fn node_mut(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = Proc::of(std::process::id() as i32, "me").unwrap();
        assert!(me.alive());
        let other = Proc {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!other.alive());
    }

    #[test]
    fn the_record_round_trips_through_json() {
        let dir = std::env::temp_dir().join(format!("talosctl-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Cluster {
            name: "x".into(),
            provisioner: Provisioner::Container,
            dir: dir.clone(),
            cidr: "10.5.0.0/24".into(),
            gateway: "10.5.0.1".into(),
            netns: "x-net".into(),
            bridge: "br0".into(),
            nodes: vec![],
            dnsmasq: None,
            endpoint_name: None,
            objects: vec![],
            created: 1,
        };
        c.record(Object::Netns {
            name: "x-net".into(),
        })
        .unwrap();
        c.record(Object::Process {
            proc: Proc::of(std::process::id() as i32, "me").unwrap(),
        })
        .unwrap();
        assert_eq!(Cluster::load(&dir).unwrap(), c);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
