//! Requested services: a daemon writes a `ServiceSpec` in a namespace of its own; init checks it
//! against that daemon's envelope in the manifest (binaries, capabilities, paths, uids, ports,
//! seccomp profiles it may grant) and runs it sandboxed like a daemon, or keeps a failed
//! `ServiceStatus` whose message says every reason it was refused. Deleting the `ServiceSpec`
//! stops the service; changing it restarts it with the new spec. No service may have a path
//! rule that reaches a protected block device (a system volume's, crate::devices), whatever
//! its envelope allows. The reconcile loop is `runtime.ServiceSpecController`
//! (crate::controllers); the checks are here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use machinery::resources::runtime::{ServiceSpecSpec, UnitKind};
use sandbox::{CapSet, LandlockPolicy, PathAccess, PathRule, Policy};

use crate::devices::Protected;
use crate::manifest::{seccomp_policy, Daemon, Envelope, Readiness, RestartPolicy};
use crate::supervisor::{Launch, Supervisor};

/// The envelopes of the manifest's daemons: which namespaces' `ServiceSpec`s init runs, for
/// which daemon, within what. The `runtime.ServiceSpecController` uses it.
#[derive(Clone, Debug, Default)]
pub struct Envelopes {
    /// (namespace, daemon, its envelope), one per namespace a daemon with an envelope writes.
    by_namespace: Vec<(String, String, Envelope)>,
    /// Daemon names: no service may take one.
    reserved: BTreeSet<String>,
    /// Daemon uids: no service may run as one.
    daemon_uids: BTreeSet<u32>,
}

impl Envelopes {
    /// The envelopes of `daemons`.
    pub fn of(daemons: &[Daemon]) -> Self {
        let mut by_namespace = Vec::new();
        for d in daemons {
            if let Some(e) = &d.envelope {
                for ns in &d.writes {
                    by_namespace.push((ns.clone(), d.name.clone(), e.clone()));
                }
            }
        }
        Self {
            by_namespace,
            reserved: daemons.iter().map(|d| d.name.clone()).collect(),
            daemon_uids: daemons.iter().flat_map(|d| [d.uid, d.gid]).collect(),
        }
    }

    /// (namespace, daemon) pairs whose `ServiceSpec`s are watched.
    pub fn namespaces(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_namespace
            .iter()
            .map(|(ns, d, _)| (ns.as_str(), d.as_str()))
    }

    /// The service's launch if `daemon`'s spec stays within its envelope and reaches none of
    /// the `protected` devices, else every reason it does not.
    pub fn check(
        &self,
        supervisor: &Supervisor,
        daemon: &str,
        id: &str,
        spec: &ServiceSpecSpec,
        profiles_dir: &Path,
        protected: &Protected,
    ) -> Result<Launch, Vec<String>> {
        let Some((_, _, envelope)) = self.by_namespace.iter().find(|(_, d, _)| d == daemon) else {
            return Err(vec![format!("daemon {daemon} has no envelope")]);
        };
        let c = Checker {
            supervisor,
            daemon,
            envelope,
            reserved: &self.reserved,
            daemon_uids: &self.daemon_uids,
            profiles_dir,
            protected,
        };
        c.check(id, spec)
    }
}

struct Checker<'a> {
    supervisor: &'a Supervisor,
    daemon: &'a str,
    envelope: &'a Envelope,
    reserved: &'a BTreeSet<String>,
    daemon_uids: &'a BTreeSet<u32>,
    profiles_dir: &'a Path,
    protected: &'a Protected,
}

impl Checker<'_> {
    /// The service's launch if the spec stays within the envelope, else every reason it does
    /// not.
    fn check(&self, id: &str, spec: &ServiceSpecSpec) -> Result<Launch, Vec<String>> {
        let mut why = check_envelope(self.envelope, spec);
        why.extend(
            self.protected
                .reasons(spec.paths.iter().map(|p| Path::new(&p.path))),
        );
        if self.reserved.contains(id) {
            why.push(format!("{id:?} is the name of a daemon"));
        }
        if let Some(u) = self.supervisor.get(id) {
            let s = u.snapshot();
            if s.kind != UnitKind::Service || s.requested_by != self.daemon {
                why.push(format!("{id:?} is already used by another service"));
            }
        }
        if self.daemon_uids.contains(&spec.uid) || self.daemon_uids.contains(&spec.gid) {
            why.push(format!(
                "uid/gid {}/{} belongs to a daemon",
                spec.uid, spec.gid
            ));
        }
        if !why.is_empty() {
            return Err(why);
        }
        let capabilities: CapSet = spec
            .capabilities
            .iter()
            .filter_map(|c| CapSet::parse_name(c).ok())
            .collect();
        let paths = spec
            .paths
            .iter()
            .filter_map(|p| {
                Some(PathRule {
                    path: PathBuf::from(&p.path),
                    access: parse_access(&p.access)?,
                })
            })
            .collect();
        Ok(Launch {
            program: PathBuf::from(&spec.binary),
            args: spec.args.clone(),
            policy: Policy {
                uid: spec.uid,
                gid: spec.gid,
                supplementary_groups: vec![],
                capabilities,
                landlock: LandlockPolicy {
                    paths,
                    bind_tcp: spec.bind_tcp.clone(),
                    connect_tcp: spec.connect_tcp.clone(),
                    ..Default::default()
                },
                seccomp: seccomp_policy(&spec.seccomp_profile, self.profiles_dir),
                env: spec.env.clone(),
                fds: BTreeMap::new(),
                working_dir: "/".into(),
                umask: 0o077,
            },
            readiness: Readiness::Exec,
            listen: None,
            restart: RestartPolicy::default(),
            restart_always: spec.restart,
            stop_timeout: Duration::from_secs(10),
            ready_timeout: Duration::from_secs(30),
            audit: None,
        })
    }
}

fn parse_access(s: &str) -> Option<PathAccess> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

/// True when an envelope's `granted` access covers `asked` (exec and read-write both include
/// reading; neither includes the other).
fn covers(granted: PathAccess, asked: PathAccess) -> bool {
    granted == asked || asked == PathAccess::ReadOnly
}

/// Every way `spec` asks for more than `envelope` allows (empty: it fits).
pub fn check_envelope(envelope: &Envelope, spec: &ServiceSpecSpec) -> Vec<String> {
    let mut why = Vec::new();
    let binary = Path::new(&spec.binary);
    if !envelope.binaries.iter().any(|b| b == binary) {
        why.push(format!("binary {:?} is not in the envelope", spec.binary));
    }
    let [lo, hi] = envelope.uids;
    for (what, id) in [("uid", spec.uid), ("gid", spec.gid)] {
        if id == 0 || id < lo || id > hi {
            why.push(format!("{what} {id} is outside {lo}-{hi}"));
        }
    }
    let allowed: CapSet = envelope
        .capabilities
        .iter()
        .filter_map(|c| CapSet::parse_name(c).ok())
        .collect();
    for c in &spec.capabilities {
        match CapSet::parse_name(c) {
            Ok(i) if allowed.contains_index(i) => {}
            Ok(_) => why.push(format!("capability {c} is not in the envelope")),
            Err(e) => why.push(e.to_string()),
        }
    }
    for p in &spec.paths {
        let Some(access) = parse_access(&p.access) else {
            why.push(format!("path {:?}: unknown access {:?}", p.path, p.access));
            continue;
        };
        let path = Path::new(&p.path);
        let inside = path.is_absolute()
            && !path
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            && envelope.paths.iter().any(|g| {
                path.starts_with(&g.path) && covers(crate::manifest::path_access(g.access), access)
            });
        if !inside {
            why.push(format!(
                "path {:?} ({}) is not in the envelope",
                p.path, p.access
            ));
        }
    }
    for (what, asked, granted) in [
        ("bind", &spec.bind_tcp, &envelope.bind_tcp),
        ("connect", &spec.connect_tcp, &envelope.connect_tcp),
    ] {
        for port in asked {
            if !granted.contains(port) {
                why.push(format!("TCP {what} port {port} is not in the envelope"));
            }
        }
    }
    if !envelope.profiles.contains(&spec.seccomp_profile) {
        why.push(format!(
            "seccomp profile {:?} is not in the envelope",
            spec.seccomp_profile
        ));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::EnvelopePath;
    use machinery::resources::runtime::ServicePath;

    fn envelope() -> Envelope {
        Envelope {
            binaries: vec!["/usr/bin/sleep".into()],
            capabilities: vec!["CAP_NET_BIND_SERVICE".into()],
            paths: vec![
                EnvelopePath {
                    path: "/usr".into(),
                    access: crate::manifest::PathAccess::Exec,
                },
                EnvelopePath {
                    path: "/var/lib/etcd".into(),
                    access: crate::manifest::PathAccess::ReadWrite,
                },
            ],
            uids: [2000, 2099],
            bind_tcp: vec![2379],
            connect_tcp: vec![],
            profiles: vec!["service".into()],
        }
    }

    fn spec() -> ServiceSpecSpec {
        ServiceSpecSpec {
            binary: "/usr/bin/sleep".into(),
            args: vec!["60".into()],
            uid: 2000,
            gid: 2000,
            paths: vec![ServicePath {
                path: "/usr/lib".into(),
                access: "exec".into(),
            }],
            seccomp_profile: "service".into(),
            restart: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_spec_within_the_envelope_fits() {
        assert!(check_envelope(&envelope(), &spec()).is_empty());
    }

    #[test]
    fn every_excess_is_named() {
        let mut s = spec();
        s.binary = "/bin/sh".into();
        s.uid = 0;
        s.capabilities = vec!["CAP_SYS_ADMIN".into()];
        s.paths.push(ServicePath {
            path: "/var/lib/etcd/../../etc".into(),
            access: "read-write".into(),
        });
        s.paths.push(ServicePath {
            path: "/usr/bin".into(),
            access: "read-write".into(),
        });
        s.bind_tcp = vec![22];
        s.seccomp_profile = "unconfined".into();
        let why = check_envelope(&envelope(), &s);
        assert_eq!(why.len(), 7, "{why:#?}");
        assert!(why.iter().any(|w| w.contains("CAP_SYS_ADMIN")));
        assert!(why.iter().any(|w| w.contains("port 22")));
    }

    /// blockd's mkfs.xfs request (as blockd writes it) on `device`.
    fn mkfs(device: &str) -> ServiceSpecSpec {
        let path = |p: &str, a: &str| ServicePath {
            path: p.into(),
            access: a.into(),
        };
        ServiceSpecSpec {
            binary: "/usr/bin/mkfs.xfs".into(),
            args: vec!["-L".into(), "EPHEMERAL".into(), device.into()],
            uid: 1_990_001_500,
            gid: 1_990_001_500,
            capabilities: vec!["CAP_SYS_ADMIN".into(), "CAP_DAC_OVERRIDE".into()],
            paths: vec![
                path(device, "read-write"),
                path("/sys", "read-only"),
                path("/proc", "read-only"),
                path("/usr/bin/mkfs.xfs", "exec"),
                path("/usr/lib", "exec"),
                path("/lib64", "exec"),
            ],
            seccomp_profile: "mkfs".into(),
            restart: false,
            ..Default::default()
        }
    }

    #[test]
    fn a_service_reaching_a_protected_device_is_refused_and_one_beside_it_is_not() {
        let paths = crate::manifest::Paths {
            root: "/".into(),
            bin: "/usr/bin".into(),
        };
        let m = crate::manifest::parse(crate::DEFAULT_MANIFEST, &paths).unwrap();
        let envelopes = Envelopes::of(&m.daemons);
        let sup = Supervisor::new(crate::reaper::Reaper::new());
        // STATE mounted from /dev/vda3: it and its disk are protected.
        let protected = Protected {
            dev: "/dev".into(),
            devices: [
                (
                    "vda".to_string(),
                    "is the disk that holds STATE".to_string(),
                ),
                ("vda3".to_string(), "holds STATE".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let check = |device: &str, protected: &Protected| {
            envelopes.check(
                &sup,
                "blockd",
                "mkfs-ephemeral",
                &mkfs(device),
                Path::new("/run/init/seccomp"),
                protected,
            )
        };
        // EPHEMERAL's partition, beside STATE's on the same disk: within blockd's envelope.
        assert!(check("/dev/vda4", &protected).is_ok());
        for (device, reason) in [
            ("/dev/vda3", "reaches /dev/vda3, which holds STATE"),
            (
                "/dev/vda",
                "reaches /dev/vda, which is the disk that holds STATE",
            ),
            (
                "/dev",
                "reaches /dev/vda, which is the disk that holds STATE",
            ),
        ] {
            let why = check(device, &protected).unwrap_err();
            assert_eq!(why.len(), 1, "{device}: only that: {why:#?}");
            assert!(why[0].contains(reason), "{device}: {why:?}");
            assert!(why[0].contains("no service may have it"), "{why:?}");
        }
        // Before STATE is mounted (a first boot), the same request for its partition runs.
        assert!(check("/dev/vda3", &Protected::default()).is_ok());
    }
}
