//! The daemon manifest: one YAML file that says, per daemon, how it runs (binary, arguments,
//! uid/gid, capabilities, landlock paths and ports, seccomp profile, environment, held socket,
//! readiness, restart policy), what it may reach in `stated` (namespaces written and read),
//! what it depends on, and which services it may ask init to run (its envelope).
//!
//! stated reads the same file for its access policy (`namespaces`, `daemons[].{name, uid,
//! writes, reads}`); the other keys are init's. Strings may hold `{root}` (the node's root
//! directory, empty for `/`) and `{bin}` (the directory of the daemon binaries), replaced before
//! parsing, so one manifest serves the image and a development tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sandbox::{CapSet, LandlockPolicy, PathAccess, Policy, SeccompPolicy, SeccompProfileRef};
use serde::Deserialize;

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

/// The allow-list of `daemon` (empty for a daemon not in the table).
pub fn allowed_capabilities(daemon: &str) -> CapSet {
    CAPABILITY_ALLOW_LIST
        .iter()
        .find(|(name, _)| *name == daemon)
        .map(|(_, caps)| {
            caps.iter()
                .filter_map(|c| CapSet::parse_name(c).ok())
                .collect()
        })
        .unwrap_or(CapSet::EMPTY)
}

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
    /// Its fixed non-root uid.
    pub uid: u32,
    /// Its fixed non-root gid.
    pub gid: u32,
    /// Capabilities it holds (within [`CAPABILITY_ALLOW_LIST`]).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Landlock rules.
    #[serde(default)]
    pub landlock: Landlock,
    /// The seccomp profile compiled into init (`networkd`), or `unconfined` (reported by the
    /// audit).
    pub seccomp: String,
    /// Namespaces it writes in stated.
    #[serde(default)]
    pub writes: Vec<String>,
    /// Namespaces it reads besides those it writes.
    #[serde(default)]
    pub reads: Vec<String>,
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

/// When a daemon is restarted and when init gives up.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartPolicy {
    /// First delay before a restart, in milliseconds; doubled after each failure.
    #[serde(default = "default_backoff")]
    pub backoff_ms: u64,
    /// Largest delay, in milliseconds.
    #[serde(default = "default_max_backoff")]
    pub max_backoff_ms: u64,
    /// This many failures within `windowMs` is a crash loop: the daemon is left failed.
    #[serde(default = "default_limit")]
    pub limit: u32,
    /// The crash-loop window, in milliseconds.
    #[serde(default = "default_window")]
    pub window_ms: u64,
}

fn default_backoff() -> u64 {
    100
}
fn default_max_backoff() -> u64 {
    30_000
}
fn default_limit() -> u32 {
    5
}
fn default_window() -> u64 {
    60_000
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            backoff_ms: default_backoff(),
            max_backoff_ms: default_max_backoff(),
            limit: default_limit(),
            window_ms: default_window(),
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
    /// The uids (and gids) its services may run as: `[first, last]`, inclusive.
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
    /// stated would refuse it.
    #[error("stated refuses the manifest")]
    Stated(#[source] stated::access::ManifestError),
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

    /// Substitutes, parses and validates a manifest.
    pub fn parse(text: &str, paths: &Paths) -> Result<Manifest, ManifestError> {
        let text = text
            .replace("{root}", &paths.root_prefix())
            .replace("{bin}", &paths.bin.to_string_lossy());
        let mut manifest: Manifest =
            serde_yaml_ng::from_str(&text).map_err(ManifestError::Parse)?;
        stated::access::Manifest::parse(&text).map_err(ManifestError::Stated)?;
        manifest.text = text;
        manifest.validate()?;
        Ok(manifest)
    }

    /// The daemon called `name`.
    pub fn daemon(&self, name: &str) -> Option<&Daemon> {
        self.daemons.iter().find(|d| d.name == name)
    }

    /// The broker.
    pub fn broker(&self) -> Option<&Daemon> {
        self.daemons.iter().find(|d| d.broker)
    }

    /// The sensitive namespaces.
    pub fn sensitive(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .filter(|n| n.sensitive)
            .map(|n| n.name.clone())
            .collect()
    }

    /// Every problem of the manifest: stated's rules are checked by stated's own parser; these
    /// are init's (allow-lists, profiles, dependencies, envelopes).
    pub fn validate(&self) -> Result<(), ManifestError> {
        let mut problems = Vec::new();
        let names: BTreeSet<&str> = self.daemons.iter().map(|d| d.name.as_str()).collect();
        if names.len() != self.daemons.len() {
            problems.push("a daemon is declared twice".to_string());
        }
        match self.daemons.iter().filter(|d| d.broker).count() {
            1 => {}
            n => problems.push(format!("exactly one daemon must be the broker, {n} are")),
        }
        for d in &self.daemons {
            problems.extend(d.problems(&names));
        }
        if let Err(cycle) = self.start_order() {
            problems.push(cycle);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ManifestError::Invalid(problems))
        }
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

impl Daemon {
    /// The capability set it is granted.
    pub fn capability_set(&self) -> Result<CapSet, String> {
        self.capabilities
            .iter()
            .map(|c| CapSet::parse_name(c).map_err(|e| e.to_string()))
            .collect()
    }

    fn problems(&self, names: &BTreeSet<&str>) -> Vec<String> {
        let mut p = Vec::new();
        let n = &self.name;
        if self.uid == 0 || self.gid == 0 {
            p.push(format!("daemon {n}: uid and gid must not be 0"));
        }
        if !self.binary.is_absolute() {
            p.push(format!(
                "daemon {n}: binary {:?} is not absolute",
                self.binary
            ));
        }
        match self.capability_set() {
            Ok(caps) => {
                let extra = caps.difference(allowed_capabilities(n));
                if !extra.is_empty() {
                    p.push(format!(
                        "daemon {n}: capabilities {} are outside its allow-list ({})",
                        extra.names().join(", "),
                        match allowed_capabilities(n).names() {
                            v if v.is_empty() => "none".to_string(),
                            v => v.join(", "),
                        }
                    ));
                }
            }
            Err(e) => p.push(format!("daemon {n}: {e}")),
        }
        if self.seccomp != "unconfined" {
            match crate::profiles::get(&self.seccomp) {
                None => p.push(format!(
                    "daemon {n}: seccomp profile {:?} is not compiled into init",
                    self.seccomp
                )),
                Some(json) => {
                    if let Err(e) = sandbox::seccomp::compile_bytes(
                        Path::new(&self.seccomp),
                        json.as_bytes(),
                        &self.seccomp,
                    ) {
                        p.push(format!(
                            "daemon {n}: seccomp profile: {}",
                            cosi::error::Chain(&e)
                        ));
                    }
                }
            }
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
        if let Some(e) = &self.envelope {
            if e.uids[0] == 0 || e.uids[0] > e.uids[1] {
                p.push(format!(
                    "daemon {n}: envelope uids {:?} must be a non-root range",
                    e.uids
                ));
            }
            for c in &e.capabilities {
                if let Err(err) = CapSet::parse_name(c) {
                    p.push(format!("daemon {n}: envelope: {err}"));
                }
            }
            for prof in &e.profiles {
                if crate::profiles::get(prof).is_none() {
                    p.push(format!(
                        "daemon {n}: envelope profile {prof:?} is not compiled into init"
                    ));
                }
            }
        }
        p
    }

    /// The sandbox policy of one start: the manifest's rules, with optional paths that do not
    /// exist dropped, the readiness fd and the held socket's fd declared.
    pub fn policy(&self, profiles_dir: &Path) -> Result<Policy, String> {
        let capabilities = self.capability_set()?;
        let mut fds = BTreeMap::new();
        if self.readiness == Readiness::Notify {
            fds.insert("notify".to_string(), NOTIFY_FD);
        }
        if let Some(l) = &self.listen {
            fds.insert("listen".to_string(), l.fd);
        }
        Ok(Policy {
            uid: self.uid,
            gid: self.gid,
            supplementary_groups: vec![],
            capabilities,
            landlock: LandlockPolicy {
                paths: self
                    .landlock
                    .paths
                    .iter()
                    .filter(|r| !r.optional || r.path.exists())
                    .map(|r| sandbox::PathRule {
                        path: r.path.clone(),
                        access: r.access,
                    })
                    .collect(),
                bind_tcp: self.landlock.bind_tcp.clone(),
                connect_tcp: self.landlock.connect_tcp.clone(),
                ..Default::default()
            },
            seccomp: seccomp_policy(&self.seccomp, profiles_dir),
            env: self.env.clone(),
            fds,
            working_dir: "/".into(),
            umask: 0o077,
        })
    }
}

/// The seccomp policy for a profile name (`unconfined`: none).
pub fn seccomp_policy(profile: &str, profiles_dir: &Path) -> SeccompPolicy {
    if profile == "unconfined" {
        SeccompPolicy::Unconfined
    } else {
        SeccompPolicy::Profile(SeccompProfileRef {
            path: profiles_dir.join(format!("{profile}.json")),
            filter: profile.to_string(),
        })
    }
}

/// Problems of a daemon whose controllers declare outputs (from its runtime's dependency
/// graph) in namespaces it does not write: stated would refuse those writes at run time.
pub fn check_outputs(daemon: &Daemon, graph: &cosi::runtime::DependencyGraph) -> Vec<String> {
    graph
        .edges
        .iter()
        .filter(|e| e.kind.is_output() && !daemon.writes.contains(&e.namespace))
        .map(|e| {
            format!(
                "daemon {}: controller {} writes {} in namespace {:?}, which the manifest does not let it write",
                daemon.name, e.controller, e.r#type, e.namespace
            )
        })
        .collect()
}

/// Problems of a daemon whose controllers read namespaces it may not read.
pub fn check_inputs(daemon: &Daemon, graph: &cosi::runtime::DependencyGraph) -> Vec<String> {
    graph
        .edges
        .iter()
        .filter(|e| {
            !e.kind.is_output()
                && e.namespace != cosi::META_NAMESPACE
                && !daemon.writes.contains(&e.namespace)
                && !daemon.reads.contains(&e.namespace)
        })
        .map(|e| {
            format!(
                "daemon {}: controller {} reads {} in namespace {:?}, which the manifest does not let it read",
                daemon.name, e.controller, e.r#type, e.namespace
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> Paths {
        Paths {
            root: "/".into(),
            bin: "/usr/bin".into(),
        }
    }

    #[test]
    fn the_shipped_manifest_is_valid() {
        let m = Manifest::parse(crate::DEFAULT_MANIFEST, &paths()).unwrap();
        assert_eq!(m.broker().unwrap().name, "stated");
        let order = m.start_order().unwrap();
        assert_eq!(order[0], "stated");
        let networkd = m.daemon("networkd").unwrap();
        assert_eq!(
            networkd.capability_set().unwrap(),
            allowed_capabilities("networkd")
        );
        assert!(m.text.contains("/run/stated/state.sock"));
        assert!(!m.text.contains("{root}"));
    }

    #[test]
    fn a_capability_outside_the_allow_list_fails() {
        let text = crate::DEFAULT_MANIFEST.replace(
            "capabilities: [CAP_NET_ADMIN",
            "capabilities: [CAP_SYS_ADMIN, CAP_NET_ADMIN",
        );
        let e = Manifest::parse(&text, &paths()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("CAP_SYS_ADMIN are outside its allow-list"),
            "{msg}"
        );
    }

    #[test]
    fn cycles_unknown_profiles_and_dependencies_fail() {
        let text = crate::DEFAULT_MANIFEST
            .replace("seccomp: networkd", "seccomp: nosuchprofile")
            .replace("dependsOn: []", "dependsOn: [ghost]");
        let msg = Manifest::parse(&text, &paths()).unwrap_err().to_string();
        assert!(msg.contains("nosuchprofile"), "{msg}");
        assert!(msg.contains("ghost"), "{msg}");
    }

    #[test]
    fn templates_follow_the_root() {
        let p = Paths {
            root: "/tmp/node".into(),
            bin: "/opt/bin".into(),
        };
        let m = Manifest::parse(crate::DEFAULT_MANIFEST, &p).unwrap();
        let stated = m.daemon("stated").unwrap();
        assert_eq!(stated.binary, PathBuf::from("/opt/bin/stated"));
        assert!(stated
            .args
            .iter()
            .any(|a| a == "/tmp/node/run/stated/state.sock"));
        assert_eq!(p.node("/run/init"), PathBuf::from("/tmp/node/run/init"));
        assert_eq!(paths().node("/run/init"), PathBuf::from("/run/init"));
    }

    #[test]
    fn output_and_input_checks_name_the_controller() {
        use cosi::runtime::{DependencyGraph, Input, InputKind, Output, OutputKind};
        let m = Manifest::parse(crate::DEFAULT_MANIFEST, &paths()).unwrap();
        let networkd = m.daemon("networkd").unwrap();
        let mut g = DependencyGraph::default();
        g.add_controller(
            "network.Bad",
            &[Input::new("secrets", "X.talos.dev", InputKind::Weak)],
            &[Output::new("runtime", "Y.talos.dev", OutputKind::Exclusive)],
        );
        let out = check_outputs(networkd, &g);
        assert_eq!(out.len(), 1);
        assert!(out[0].contains("network.Bad"), "{out:?}");
        assert_eq!(check_inputs(networkd, &g).len(), 1);
    }
}
