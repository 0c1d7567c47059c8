//! The daemon manifest of a node (DESIGN.md §1, §4, §5), declared once: init reads it to run and
//! sandbox each daemon, stated reads it for its access policy. One YAML file says, per daemon,
//! its binary, arguments, uid/gid, capabilities, landlock rules, seccomp profile, the
//! namespaces it writes and reads in stated, the resource type groups it may define, its
//! dependencies, readiness, restart policy, and which services it may ask init to run (its
//! envelope).
//!
//! Strings may hold `{root}` (the node's root directory, empty for `/`) and `{bin}` (the
//! directory of the daemon binaries), replaced before parsing, so one manifest serves the image
//! and a development tree.
//!
//! Every uid a manifest names lies in [`NODE_UIDS`], a range no host user has: on a shared host
//! (container mode) a daemon's uid colliding with a host user's would let that user read the
//! daemon's memory and files and signal it. `talosctl cluster create` checks the host for it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The uids (and gids) of a node's daemons and services: 65536 ids in the range that systemd's
/// allocation map (`UIDS-GIDS.md`) leaves unused (above the container ranges, below 2^31 and
/// below the "foreign" range at 0x7FFE0000), so they collide neither with host users nor with
/// the ranges container managers hand out.
pub const NODE_UIDS: RangeInclusive<u32> = 1_990_000_000..=1_990_065_535;

/// The uid at `offset` in [`NODE_UIDS`] (`node_uid(10)` is stated's in the shipped manifest).
pub const fn node_uid(offset: u32) -> u32 {
    *NODE_UIDS.start() + offset
}

/// The exit code with which a daemon says "do not restart me": its configuration cannot work
/// (`EX_CONFIG` of sysexits.h, as networkd and stated return on a bad configuration).
pub const PERMANENT_FAILURE_EXIT: i32 = 78;

/// The fd number of the readiness pipe in a daemon with `readiness: notify`.
pub const NOTIFY_FD: i32 = 3;

/// The capabilities each daemon may ever hold (DESIGN.md §5). A manifest granting more fails
/// validation, so a capability is added here, in review, and not by editing the manifest alone.
/// A daemon not listed may hold none.
pub const CAPABILITY_ALLOW_LIST: &[(&str, &[&str])] = &[
    ("stated", &[]),
    (
        "networkd",
        &["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE"],
    ),
    ("blockd", &["CAP_SYS_ADMIN"]),
    ("secretsd", &[]),
    ("k8sd", &[]),
    ("apid", &[]),
    ("trustd", &[]),
];

/// The capability names `daemon` may hold (none for a daemon not in the table).
pub fn allowed_capabilities(daemon: &str) -> &'static [&'static str] {
    CAPABILITY_ALLOW_LIST
        .iter()
        .find(|(name, _)| *name == daemon)
        .map_or(&[], |(_, caps)| caps)
}

/// The namespace of resource definitions (only stated writes it).
const META: &str = "meta";

/// The whole manifest.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// The namespaces of the node.
    #[serde(default)]
    pub namespaces: Vec<NamespaceDecl>,
    /// The daemons, in no particular order (dependencies decide the start order).
    pub daemons: Vec<Daemon>,
    /// The text after substitution, as handed to stated.
    #[serde(skip)]
    pub text: String,
}

/// A namespace of the node.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceDecl {
    /// Name (`network`).
    pub name: String,
    /// What it holds.
    #[serde(default)]
    pub description: String,
    /// Survives reboot.
    #[serde(default)]
    pub durable: bool,
    /// Only its writer and the daemons listing it in `reads` may read it (`secrets`, `config`).
    #[serde(default)]
    pub sensitive: bool,
}

/// How a daemon says it is ready.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Readiness {
    /// It writes a line to fd 3 ([`NOTIFY_FD`]) once it serves (s6's notification-fd).
    Notify,
    /// It is ready once exec'd.
    #[default]
    Exec,
}

/// What a landlock path rule allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathAccess {
    /// Read files and list directories.
    ReadOnly,
    /// Read, and execute files.
    Exec,
    /// Read, write, create, remove.
    ReadWrite,
}

/// One daemon.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Daemon {
    /// Name (`networkd`); also its stated identity.
    pub name: String,
    /// This daemon is the broker (stated): started first, every other daemon depends on it.
    #[serde(default)]
    pub broker: bool,
    /// The program, an absolute path.
    pub binary: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its fixed uid, in [`NODE_UIDS`].
    pub uid: u32,
    /// Its fixed gid, in [`NODE_UIDS`].
    pub gid: u32,
    /// Supplementary groups, each a gid of its own envelope's range: k8sd is in etcd's group to
    /// hand it its certificates and to see its data directory; a service is in no daemon's
    /// group, so the sharing goes one way.
    #[serde(default)]
    pub groups: Vec<u32>,
    /// Capabilities it holds (within [`CAPABILITY_ALLOW_LIST`]).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Landlock rules.
    #[serde(default)]
    pub landlock: Landlock,
    /// The seccomp profile compiled into init (`networkd`), or `unconfined` (reported by the
    /// audit).
    pub seccomp: String,
    /// Namespaces it writes in stated (it is their only writer).
    #[serde(default)]
    pub writes: Vec<String>,
    /// What it reads besides the namespaces it writes and `meta`: a whole namespace
    /// (`network`), or only one type of one (`secrets/ApiCertificates.secrets.talos.dev`: apid
    /// may read its certificate, not the CA key beside it). See [`ReadGrant`].
    #[serde(default)]
    pub reads: Vec<String>,
    /// The resource type groups it may define in `meta`: a definition of `AddressSpecs.net.talos.dev`
    /// needs `net.talos.dev` here (and its default namespace among `writes`).
    #[serde(default)]
    pub defines: Vec<String>,
    /// Daemons that must be ready before it starts (the broker is implied).
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// How it reports readiness.
    #[serde(default)]
    pub readiness: Readiness,
    /// Its whole environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Directories init creates for it (owned by its uid/gid) before the first start.
    #[serde(default)]
    pub dirs: Vec<DirDecl>,
    /// A listening Unix socket init binds once and hands to every start of the daemon, so that
    /// it outlives restarts.
    #[serde(default)]
    pub listen: Option<ListenDecl>,
    /// Restart policy.
    #[serde(default)]
    pub restart: RestartPolicy,
    /// Grace period between SIGTERM and SIGKILL, in milliseconds.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_ms: u64,
    /// How long it may take to become ready, in milliseconds, before it is killed and restarted.
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_ms: u64,
    /// What it may ask init to run for it (requested services); none when absent.
    #[serde(default)]
    pub envelope: Option<Envelope>,
    /// It may call init's control socket (apid: services, logs, reboot, shutdown for its
    /// clients). At most one daemon: the socket's group is its gid (mode 0660) and init admits
    /// its uid beside root's. DESIGN.md §1's one exception to "daemons meet only in stated".
    #[serde(default)]
    pub init_control: bool,
}

fn default_stop_timeout() -> u64 {
    10_000
}

fn default_ready_timeout() -> u64 {
    30_000
}

/// Landlock rules of a daemon.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Landlock {
    /// Path rules.
    #[serde(default)]
    pub paths: Vec<PathDecl>,
    /// TCP ports it may bind.
    #[serde(default)]
    pub bind_tcp: Vec<u16>,
    /// TCP ports it may connect to.
    #[serde(default)]
    pub connect_tcp: Vec<u16>,
}

/// One landlock path rule.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathDecl {
    /// An absolute path.
    pub path: PathBuf,
    /// `read-only`, `exec` or `read-write`.
    pub access: PathAccess,
    /// Skip the rule when the path does not exist on this node (e.g. `/usr/lib64` on a host
    /// without it in development); a missing required path fails the start.
    #[serde(default)]
    pub optional: bool,
}

/// A directory init creates for a daemon.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DirDecl {
    /// An absolute path.
    pub path: PathBuf,
    /// Its mode, octal (`"0700"` by default).
    #[serde(default = "private_dir")]
    pub mode: String,
    /// Its group: the daemon's gid by default, else one of its [`Daemon::groups`] (a directory
    /// it shares with a service it asks for).
    #[serde(default)]
    pub group: Option<u32>,
}

fn private_dir() -> String {
    "0700".to_string()
}

/// A listening Unix socket held by init.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenDecl {
    /// The socket path.
    pub path: PathBuf,
    /// The fd number it has in the daemon.
    pub fd: i32,
}

/// How a daemon is restarted. A daemon of the manifest is never given up on: it is restarted
/// with capped exponential backoff for as long as the node runs (as upstream's restart-forever
/// services); only its own [`PERMANENT_FAILURE_EXIT`] stops it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartPolicy {
    /// First delay before a restart, in milliseconds; doubled after each failure.
    #[serde(default = "default_backoff")]
    pub backoff_ms: u64,
    /// Largest delay, in milliseconds.
    #[serde(default = "default_max_backoff")]
    pub max_backoff_ms: u64,
    /// A run at least this long (milliseconds) counts as healthy: the next failure starts the
    /// backoff from `backoffMs` again.
    #[serde(default = "default_reset_after")]
    pub reset_after_ms: u64,
}

fn default_backoff() -> u64 {
    100
}
fn default_max_backoff() -> u64 {
    5_000
}
fn default_reset_after() -> u64 {
    10_000
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            backoff_ms: default_backoff(),
            max_backoff_ms: default_max_backoff(),
            reset_after_ms: default_reset_after(),
        }
    }
}

/// What a daemon may grant the services it asks for.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Envelope {
    /// Programs it may ask to run (absolute paths).
    #[serde(default)]
    pub binaries: Vec<PathBuf>,
    /// Capabilities it may grant.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Paths (and what beneath them) it may grant.
    #[serde(default)]
    pub paths: Vec<EnvelopePath>,
    /// The uids (and gids) its services may run as: `[first, last]`, inclusive, in
    /// [`NODE_UIDS`].
    pub uids: [u32; 2],
    /// TCP ports its services may bind.
    #[serde(default)]
    pub bind_tcp: Vec<u16>,
    /// TCP ports its services may connect to.
    #[serde(default)]
    pub connect_tcp: Vec<u16>,
    /// Seccomp profiles (compiled into init) its services may use.
    #[serde(default)]
    pub profiles: Vec<String>,
}

/// A path an envelope may grant.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvelopePath {
    /// An absolute path: anything beneath it may be granted.
    pub path: PathBuf,
    /// The most it may grant there.
    pub access: PathAccess,
}

/// A manifest that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file cannot be read.
    #[error("cannot read the manifest {path:?}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not parse into a manifest.
    #[error("the manifest does not parse")]
    Parse(#[source] serde_yaml_ng::Error),
    /// It contradicts itself or the allow-lists (every problem listed).
    #[error("invalid manifest:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// Where the templates of a manifest point.
#[derive(Clone, Debug)]
pub struct Paths {
    /// The node's root directory (`/` on a node, a directory in development).
    pub root: PathBuf,
    /// The directory of the daemon binaries.
    pub bin: PathBuf,
}

impl Paths {
    /// `{root}` as substituted: empty for `/`, so `{root}/run` is `/run`.
    fn root_prefix(&self) -> String {
        let r = self.root.to_string_lossy();
        r.trim_end_matches('/').to_string()
    }

    /// A node path (`/run/init`) under the root.
    pub fn node(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("{}{}", self.root_prefix(), path))
    }
}

impl Manifest {
    /// Reads, substitutes, parses and validates a manifest file.
    pub fn load(path: &Path, paths: &Paths) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Manifest::parse(&text, paths)
    }

    /// Reads and validates a manifest whose templates are already substituted (the file init
    /// hands to stated).
    pub fn load_substituted(path: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Manifest::parse_substituted(&text)
    }

    /// Substitutes, parses and validates a manifest.
    pub fn parse(text: &str, paths: &Paths) -> Result<Manifest, ManifestError> {
        Manifest::parse_substituted(&Manifest::substitute(text, paths))
    }

    /// The text with its templates replaced.
    pub fn substitute(text: &str, paths: &Paths) -> String {
        text.replace("{root}", &paths.root_prefix())
            .replace("{bin}", &paths.bin.to_string_lossy())
    }

    /// Parses a manifest without templates, without checking its rules ([`Manifest::problems`]
    /// lists them; a caller with rules of its own adds them to the list).
    pub fn from_text(text: &str) -> Result<Manifest, ManifestError> {
        let mut manifest: Manifest = serde_yaml_ng::from_str(text).map_err(ManifestError::Parse)?;
        manifest.text = text.to_string();
        Ok(manifest)
    }

    /// Parses and validates a manifest without templates.
    pub fn parse_substituted(text: &str) -> Result<Manifest, ManifestError> {
        let manifest = Manifest::from_text(text)?;
        let problems = manifest.problems();
        if problems.is_empty() {
            Ok(manifest)
        } else {
            Err(ManifestError::Invalid(problems))
        }
    }

    /// The daemon called `name`.
    pub fn daemon(&self, name: &str) -> Option<&Daemon> {
        self.daemons.iter().find(|d| d.name == name)
    }

    /// The daemon running as `uid`.
    pub fn daemon_by_uid(&self, uid: u32) -> Option<&Daemon> {
        self.daemons.iter().find(|d| d.uid == uid)
    }

    /// The broker.
    pub fn broker(&self) -> Option<&Daemon> {
        self.daemons.iter().find(|d| d.broker)
    }

    /// The daemon that may call init's control socket (`initControl: true`), if any.
    pub fn init_control(&self) -> Option<&Daemon> {
        self.daemons.iter().find(|d| d.init_control)
    }

    /// The namespace called `name`.
    pub fn namespace(&self, name: &str) -> Option<&NamespaceDecl> {
        self.namespaces.iter().find(|n| n.name == name)
    }

    /// The sensitive namespaces.
    pub fn sensitive(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .filter(|n| n.sensitive)
            .map(|n| n.name.clone())
            .collect()
    }

    /// Every uid (and gid) the manifest has a node use: each daemon's, and each envelope's
    /// range. `talosctl cluster create` checks that no host user has any of them.
    pub fn uids(&self) -> Vec<RangeInclusive<u32>> {
        let mut out = Vec::new();
        for d in &self.daemons {
            out.push(d.uid..=d.uid);
            if d.gid != d.uid {
                out.push(d.gid..=d.gid);
            }
            if let Some(e) = &d.envelope {
                out.push(e.uids[0]..=e.uids[1]);
            }
        }
        out
    }

    /// Every problem of the manifest, each naming the daemon or namespace it concerns.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let declared: BTreeSet<&str> = self.namespaces.iter().map(|n| n.name.as_str()).collect();
        if declared.len() != self.namespaces.len() {
            problems.push("a namespace is declared twice".to_string());
        }
        for n in &self.namespaces {
            if n.name.is_empty()
                || n.name.len() > 256
                || n.name.contains('/')
                || n.name.starts_with('.')
                || n.name.chars().any(char::is_control)
            {
                problems.push(format!("namespace {:?} is not a valid name", n.name));
            }
            if n.name == META {
                problems.push(format!("namespace {META:?} is stated's own"));
            }
        }
        let names: BTreeSet<&str> = self.daemons.iter().map(|d| d.name.as_str()).collect();
        if names.len() != self.daemons.len() {
            problems.push("a daemon is declared twice".to_string());
        }
        match self.daemons.iter().filter(|d| d.broker).count() {
            1 => {}
            n => problems.push(format!("exactly one daemon must be the broker, {n} are")),
        }
        let control: Vec<&str> = self
            .daemons
            .iter()
            .filter(|d| d.init_control)
            .map(|d| d.name.as_str())
            .collect();
        if control.len() > 1 {
            problems.push(format!(
                "at most one daemon may call init's control socket (initControl), {} do: {}",
                control.len(),
                control.join(", ")
            ));
        }
        for d in self.daemons.iter().filter(|d| d.init_control) {
            if d.broker {
                problems.push(format!(
                    "daemon {}: the broker may not call init's control socket",
                    d.name
                ));
            }
            // The socket's group admits whoever has this gid: nobody else may.
            for other in self.daemons.iter().filter(|o| o.name != d.name) {
                let shares = other.gid == d.gid
                    || other.uid == d.gid
                    || other
                        .envelope
                        .as_ref()
                        .is_some_and(|e| (e.uids[0]..=e.uids[1]).contains(&d.gid));
                if shares {
                    problems.push(format!(
                        "daemon {}: its gid {} (the group of init's control socket) is also {}'s",
                        d.name, d.gid, other.name
                    ));
                }
            }
        }
        let mut writer: BTreeMap<&str, &str> = BTreeMap::new();
        let mut uids: BTreeMap<u32, String> = BTreeMap::new();
        let mut groups: BTreeMap<&str, &str> = BTreeMap::new();
        for d in &self.daemons {
            let n = &d.name;
            for ns in &d.writes {
                if !declared.contains(ns.as_str()) {
                    problems.push(format!("daemon {n}: namespace {ns:?} is not declared"));
                }
            }
            for entry in &d.reads {
                match ReadGrant::parse(entry) {
                    Ok(g) if !declared.contains(g.namespace) => problems.push(format!(
                        "daemon {n}: namespace {:?} is not declared",
                        g.namespace
                    )),
                    Ok(_) => {}
                    Err(e) => problems.push(format!("daemon {n}: {e}")),
                }
            }
            for ns in &d.writes {
                if let Some(other) = writer.insert(ns, n) {
                    problems.push(format!("namespace {ns:?} has two writers: {other} and {n}"));
                }
            }
            for g in &d.defines {
                if !valid_group(g) {
                    problems.push(format!(
                        "daemon {n}: {g:?} is not a resource type group (like net.talos.dev)"
                    ));
                }
                if let Some(other) = groups.insert(g, n) {
                    problems.push(format!(
                        "type group {g:?} is defined by two daemons: {other} and {n}"
                    ));
                }
            }
            if !d.defines.is_empty() && d.writes.is_empty() {
                problems.push(format!(
                    "daemon {n}: defines types but writes no namespace for them"
                ));
            }
            for (what, id) in [("uid", d.uid), ("gid", d.gid)] {
                if !NODE_UIDS.contains(&id) {
                    problems.push(format!(
                        "daemon {n}: {what} {id} is outside the node's range {}-{} (a host user could have it)",
                        NODE_UIDS.start(),
                        NODE_UIDS.end()
                    ));
                }
            }
            match uids.get(&d.uid) {
                Some(other) => {
                    problems.push(format!("daemon {n}: uid {} is also {other}'s", d.uid));
                }
                None => {
                    uids.insert(d.uid, n.clone());
                }
            }
            problems.extend(d.problems(&names));
            let range = d.envelope.as_ref().map(|e| e.uids[0]..=e.uids[1]);
            for g in &d.groups {
                if !range.as_ref().is_some_and(|r| r.contains(g)) {
                    problems.push(format!(
                        "daemon {n}: group {g} is not in its envelope's uids (a daemon joins only the groups of services it asks for)"
                    ));
                }
            }
            for dir in &d.dirs {
                if let Some(g) = dir.group {
                    if g != d.gid && !d.groups.contains(&g) {
                        problems.push(format!(
                            "daemon {n}: directory {}: group {g} is neither its gid nor one of its groups",
                            dir.path.display()
                        ));
                    }
                }
            }
        }
        // Envelope ranges must not hold a daemon's uid (a service would be that daemon).
        for d in &self.daemons {
            if let Some(e) = &d.envelope {
                let range = e.uids[0]..=e.uids[1];
                for (uid, owner) in &uids {
                    if range.contains(uid) {
                        problems.push(format!(
                            "daemon {}: envelope uids {:?} include {owner}'s uid {uid}",
                            d.name, e.uids
                        ));
                    }
                }
            }
        }
        if let Err(cycle) = self.start_order() {
            problems.push(cycle);
        }
        problems
    }

    /// Daemon names in an order where every daemon comes after its dependencies (the broker
    /// first); shutdown runs it backwards.
    pub fn start_order(&self) -> Result<Vec<String>, String> {
        let mut order: Vec<String> = Vec::new();
        let mut left: Vec<&Daemon> = self.daemons.iter().collect();
        // Stable: among the daemons whose dependencies are met, keep manifest order, broker first.
        left.sort_by_key(|d| !d.broker);
        while !left.is_empty() {
            let next = left.iter().position(|d| {
                self.dependencies(d)
                    .iter()
                    .all(|dep| order.iter().any(|o| o == dep))
            });
            match next {
                Some(i) => order.push(left.remove(i).name.clone()),
                None => {
                    let stuck: Vec<&str> = left.iter().map(|d| d.name.as_str()).collect();
                    return Err(format!(
                        "dependency cycle (or unknown dependency) among {}",
                        stuck.join(", ")
                    ));
                }
            }
        }
        Ok(order)
    }

    /// The daemons `d` waits for: its `dependsOn`, and the broker (for every other daemon).
    pub fn dependencies(&self, d: &Daemon) -> Vec<String> {
        let mut deps = d.depends_on.clone();
        if !d.broker {
            if let Some(b) = self.broker() {
                if !deps.contains(&b.name) {
                    deps.insert(0, b.name.clone());
                }
            }
        }
        deps
    }
}

/// `net.talos.dev`: dot-separated lowercase labels, at least two.
/// One entry of a daemon's `reads`: a namespace, or one resource type of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadGrant<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// Only this type (`ApiCertificates.secrets.talos.dev`), or the whole namespace.
    pub r#type: Option<&'a str>,
}

impl<'a> ReadGrant<'a> {
    /// Parses `network` or `secrets/ApiCertificates.secrets.talos.dev`.
    pub fn parse(entry: &'a str) -> Result<ReadGrant<'a>, String> {
        match entry.split_once('/') {
            None => Ok(ReadGrant {
                namespace: entry,
                r#type: None,
            }),
            Some((namespace, t)) => {
                let group_ok = t
                    .split_once('.')
                    .is_some_and(|(kind, group)| !kind.is_empty() && valid_group(group));
                if namespace.is_empty() || !group_ok {
                    return Err(format!(
                        "reads entry {entry:?} is neither a namespace nor namespace/Type.group"
                    ));
                }
                Ok(ReadGrant {
                    namespace,
                    r#type: Some(t),
                })
            }
        }
    }
}

impl Daemon {
    /// Its read grants (entries that do not parse are left out: [`Manifest::problems`] names
    /// them, and a manifest with problems is refused).
    pub fn read_grants(&self) -> impl Iterator<Item = ReadGrant<'_>> {
        self.reads.iter().filter_map(|r| ReadGrant::parse(r).ok())
    }

    /// The namespaces it reads some or all of (besides those it writes).
    pub fn read_namespaces(&self) -> BTreeSet<&str> {
        self.read_grants().map(|g| g.namespace).collect()
    }
}

fn valid_group(g: &str) -> bool {
    let parts: Vec<&str> = g.split('.').collect();
    parts.len() >= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.starts_with(|c: char| c.is_ascii_lowercase())
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

/// The group of a resource type: what follows its first dot (`net.talos.dev` for
/// `AddressSpecs.net.talos.dev`).
pub fn type_group(resource_type: &str) -> Option<&str> {
    resource_type.split_once('.').map(|(_, g)| g)
}

impl Daemon {
    fn problems(&self, names: &BTreeSet<&str>) -> Vec<String> {
        let mut p = Vec::new();
        let n = &self.name;
        if !self.binary.is_absolute() {
            p.push(format!(
                "daemon {n}: binary {:?} is not absolute",
                self.binary
            ));
        }
        if self.writes.iter().any(|w| w == META) {
            p.push(format!("daemon {n}: only stated writes {META}"));
        }
        let allowed = allowed_capabilities(n);
        let extra: Vec<String> = self
            .capabilities
            .iter()
            .map(|c| c.to_ascii_uppercase())
            .filter(|c| !allowed.contains(&c.as_str()))
            .collect();
        if !extra.is_empty() {
            p.push(format!(
                "daemon {n}: capabilities {} are outside its allow-list ({})",
                extra.join(", "),
                if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed.join(", ")
                }
            ));
        }
        for dep in &self.depends_on {
            if !names.contains(dep.as_str()) {
                p.push(format!("daemon {n}: depends on unknown daemon {dep:?}"));
            }
        }
        for rule in &self.landlock.paths {
            if !rule.path.is_absolute() {
                p.push(format!(
                    "daemon {n}: landlock path {:?} is not absolute",
                    rule.path
                ));
            }
        }
        if let Some(l) = &self.listen {
            if l.fd < 3 || l.fd == NOTIFY_FD && self.readiness == Readiness::Notify {
                p.push(format!("daemon {n}: listen fd {} collides", l.fd));
            }
        }
        for d in &self.dirs {
            if u32::from_str_radix(&d.mode, 8).map_or(true, |m| m > 0o7777) {
                p.push(format!("daemon {n}: dir mode {:?} is not octal", d.mode));
            }
        }
        let r = &self.restart;
        if r.backoff_ms == 0 || r.max_backoff_ms < r.backoff_ms {
            p.push(format!(
                "daemon {n}: restart backoff must be positive and at most maxBackoffMs"
            ));
        }
        if let Some(e) = &self.envelope {
            if e.uids[0] > e.uids[1]
                || !NODE_UIDS.contains(&e.uids[0])
                || !NODE_UIDS.contains(&e.uids[1])
            {
                p.push(format!(
                    "daemon {n}: envelope uids {:?} must be a range within the node's {}-{}",
                    e.uids,
                    NODE_UIDS.start(),
                    NODE_UIDS.end()
                ));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(daemons: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse_substituted(&format!(
            "namespaces:\n  - {{name: config, durable: true}}\n  - {{name: network}}\n  - {{name: runtime}}\ndaemons:\n{daemons}"
        ))
    }

    const STATED: &str = "  - {name: stated, broker: true, binary: /bin/stated, uid: 1990000010, gid: 1990000010, seccomp: stated}\n";

    #[test]
    fn a_valid_manifest() {
        let man = m(&format!("{STATED}  - {{name: networkd, binary: /bin/n, uid: 1990000011, gid: 1990000011, seccomp: networkd, writes: [network], reads: [config], defines: [net.talos.dev]}}\n")).unwrap();
        assert_eq!(man.start_order().unwrap(), ["stated", "networkd"]);
        assert_eq!(man.daemon_by_uid(1990000011).unwrap().name, "networkd");
        assert_eq!(
            type_group("AddressSpecs.net.talos.dev"),
            Some("net.talos.dev")
        );
        assert_eq!(node_uid(10), 1_990_000_010);
    }

    #[test]
    fn every_problem_is_listed() {
        let e = m(&format!(
            "{STATED}  - {{name: x, binary: x, uid: 1000, gid: 1000, seccomp: s, writes: [network, nope, meta], defines: [Net]}}\n  - {{name: y, binary: /y, uid: 1990000010, gid: 1990000012, seccomp: s, writes: [network], capabilities: [CAP_SYS_ADMIN], envelope: {{uids: [1990000000, 1990000020]}}}}\n"
        ))
        .unwrap_err()
        .to_string();
        for want in [
            "uid 1000 is outside the node's range",
            "namespace \"nope\" is not declared",
            "two writers",
            "only stated writes meta",
            "\"Net\" is not a resource type group",
            "uid 1990000010 is also stated's",
            "binary \"x\" is not absolute",
            "CAP_SYS_ADMIN are outside its allow-list (none)",
            "envelope uids [1990000000, 1990000020] include stated's uid 1990000010",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
    }

    #[test]
    fn one_daemon_calls_init_and_its_group_is_its_own() {
        let ok = m(&format!("{STATED}  - {{name: apid, binary: /bin/a, uid: 1990000014, gid: 1990000014, seccomp: apid, initControl: true}}\n")).unwrap();
        assert_eq!(ok.init_control().unwrap().name, "apid");
        assert!(ok.daemon("stated").is_some_and(|d| !d.init_control));
        let e = m(&format!(
            "{STATED}  - {{name: a, binary: /a, uid: 1990000014, gid: 1990000014, seccomp: s, initControl: true}}\n  - {{name: b, binary: /b, uid: 1990000015, gid: 1990000014, seccomp: s, initControl: true}}\n"
        ))
        .unwrap_err()
        .to_string();
        for want in [
            "at most one daemon may call init's control socket (initControl), 2 do: a, b",
            "daemon a: its gid 1990000014 (the group of init's control socket) is also b's",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
    }
}
