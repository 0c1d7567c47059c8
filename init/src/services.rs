//! Requested services: a daemon writes a `ServiceSpec` in a namespace of its own; init checks it
//! against that daemon's envelope in the manifest (binaries, capabilities, paths, uids, ports,
//! seccomp profiles it may grant) and runs it sandboxed like a daemon, or keeps a failed
//! `ServiceStatus` whose message says every reason it was refused. Deleting the `ServiceSpec`
//! stops the service; changing it restarts it with the new spec.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cosi::{Client, EventKind, Query, ResourceSpec, WatchSpec};
use machinery::resources::runtime::{ServiceSpecSpec, UnitKind};
use sandbox::{CapSet, LandlockPolicy, PathAccess, PathRule, Policy};

use crate::manifest::{seccomp_policy, Daemon, Envelope, Readiness, RestartPolicy};
use crate::supervisor::{Launch, Supervisor};

/// Watches the `ServiceSpec`s of every daemon that has an envelope, forever.
pub fn watch_all(
    client: &Client,
    supervisor: &Arc<Supervisor>,
    daemons: &[Daemon],
    profiles_dir: &Path,
) {
    let reserved: BTreeSet<String> = daemons.iter().map(|d| d.name.clone()).collect();
    let uids: BTreeSet<u32> = daemons.iter().map(|d| d.uid).collect();
    for d in daemons {
        let Some(envelope) = &d.envelope else {
            continue;
        };
        for ns in &d.writes {
            let w = Watcher {
                client: client.clone(),
                supervisor: supervisor.clone(),
                daemon: d.name.clone(),
                namespace: ns.clone(),
                envelope: envelope.clone(),
                reserved: reserved.clone(),
                daemon_uids: uids.clone(),
                profiles_dir: profiles_dir.to_path_buf(),
            };
            tokio::spawn(w.run());
        }
    }
}

struct Watcher {
    client: Client,
    supervisor: Arc<Supervisor>,
    daemon: String,
    namespace: String,
    envelope: Envelope,
    reserved: BTreeSet<String>,
    daemon_uids: BTreeSet<u32>,
    profiles_dir: PathBuf,
}

impl Watcher {
    async fn run(self) {
        let mut known: BTreeMap<String, ServiceSpecSpec> = BTreeMap::new();
        let mut watch = self.client.watch(WatchSpec {
            namespace: self.namespace.clone(),
            r#type: ServiceSpecSpec::TYPE.to_string(),
            bootstrap: true,
            ..Default::default()
        });
        loop {
            match watch.next_batch().await {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(namespace = %self.namespace, error = %e, "service spec watch ended");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    watch = self.client.watch(WatchSpec {
                        namespace: self.namespace.clone(),
                        r#type: ServiceSpecSpec::TYPE.to_string(),
                        bootstrap: true,
                        ..Default::default()
                    });
                }
                Some(Ok(events)) => {
                    if events.iter().all(|e| e.kind == EventKind::Noop) {
                        continue;
                    }
                    if let Err(e) = self.reconcile(&mut known).await {
                        tracing::warn!(namespace = %self.namespace, error = %e, "cannot list service specs");
                    }
                }
            }
        }
    }

    async fn reconcile(
        &self,
        known: &mut BTreeMap<String, ServiceSpecSpec>,
    ) -> Result<(), cosi::StateError> {
        let list = self
            .client
            .list(&self.namespace, ServiceSpecSpec::TYPE, &Query::default())
            .await?;
        let mut seen = BTreeSet::new();
        for raw in list {
            let id = raw.metadata.id.clone();
            seen.insert(id.clone());
            let spec = match raw.decode::<ServiceSpecSpec>() {
                Ok(r) => r.spec,
                Err(e) => {
                    if let std::collections::btree_map::Entry::Vacant(slot) = known.entry(id) {
                        self.supervisor
                            .add_refused(
                                slot.key(),
                                UnitKind::Service,
                                &self.daemon,
                                format!("refused: the spec does not decode: {e}"),
                            )
                            .await;
                        slot.insert(ServiceSpecSpec::default());
                    }
                    continue;
                }
            };
            if known.get(&id) == Some(&spec) {
                continue;
            }
            match self.check(&id, &spec) {
                Ok(launch) => {
                    tracing::info!(service = %id, daemon = %self.daemon, "starting requested service");
                    self.supervisor
                        .add(&id, UnitKind::Service, &self.daemon, launch, vec![], true)
                        .await;
                }
                Err(reasons) => {
                    let reason = format!("refused: {}", reasons.join("; "));
                    tracing::warn!(service = %id, daemon = %self.daemon, %reason, "refused requested service");
                    self.supervisor
                        .add_refused(&id, UnitKind::Service, &self.daemon, reason)
                        .await;
                }
            }
            known.insert(id, spec);
        }
        let gone: Vec<String> = known
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            tracing::info!(service = %id, "service spec removed: stopping the service");
            self.supervisor.remove(&id).await;
            known.remove(&id);
        }
        Ok(())
    }

    /// The service's launch if the spec stays within the envelope, else every reason it does
    /// not.
    fn check(&self, id: &str, spec: &ServiceSpecSpec) -> Result<Launch, Vec<String>> {
        let mut why = check_envelope(&self.envelope, spec);
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
                seccomp: seccomp_policy(&spec.seccomp_profile, &self.profiles_dir),
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
}
