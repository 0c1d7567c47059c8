//! The daemon manifest as init uses it. The schema and its structural rules are declared once,
//! in [`machinery::manifest`] (stated reads the same file for its access policy); here are
//! init's own parts: the seccomp profiles compiled into init, the capability sets, and the
//! sandbox policy of each start.

use std::collections::BTreeMap;
use std::path::Path;

use sandbox::{CapSet, LandlockPolicy, Policy, SeccompPolicy, SeccompProfileRef};

pub use machinery::manifest::{
    allowed_capabilities as allowed_capability_names, Daemon, DirDecl, Envelope, EnvelopePath,
    Landlock, ListenDecl, NamespaceDecl, PathAccess, PathDecl, Paths, Readiness, RestartPolicy,
    CAPABILITY_ALLOW_LIST, NOTIFY_FD, PERMANENT_FAILURE_EXIT,
};

/// The allow-list of `daemon` as a capability set (empty for a daemon not in the table).
pub fn allowed_capabilities(daemon: &str) -> CapSet {
    allowed_capability_names(daemon)
        .iter()
        .filter_map(|c| CapSet::parse_name(c).ok())
        .collect()
}

/// The manifest init runs: machinery's, checked further against what init itself holds.
pub type Manifest = machinery::manifest::Manifest;

/// A manifest that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// It does not parse or breaks the manifest's own rules.
    #[error(transparent)]
    Schema(#[from] machinery::manifest::ManifestError),
    /// It names what this init cannot provide (every problem listed).
    #[error("invalid manifest:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// Reads, substitutes, parses and validates a manifest file.
pub fn load(path: &Path, paths: &Paths) -> Result<Manifest, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        machinery::manifest::ManifestError::Read {
            path: path.to_path_buf(),
            source,
        }
    })?;
    parse(&text, paths)
}

/// Substitutes, parses and validates a manifest: every problem of the manifest's own rules
/// and of init's, together.
pub fn parse(text: &str, paths: &Paths) -> Result<Manifest, ManifestError> {
    let m = Manifest::from_text(&Manifest::substitute(text, paths))?;
    let mut problems = m.problems();
    problems.extend(init_problems(&m));
    if problems.is_empty() {
        Ok(m)
    } else {
        Err(ManifestError::Invalid(problems))
    }
}

/// init's own rules: capability names it knows, seccomp profiles compiled into it.
fn init_problems(m: &Manifest) -> Vec<String> {
    let mut p = Vec::new();
    for d in &m.daemons {
        let n = &d.name;
        if let Err(e) = capability_set(d) {
            p.push(format!("daemon {n}: {e}"));
        }
        if d.seccomp != "unconfined" {
            match crate::profiles::get(&d.seccomp) {
                None => p.push(format!(
                    "daemon {n}: seccomp profile {:?} is not compiled into init",
                    d.seccomp
                )),
                Some(json) => {
                    if let Err(e) = sandbox::seccomp::compile_bytes(
                        Path::new(&d.seccomp),
                        json.as_bytes(),
                        &d.seccomp,
                    ) {
                        p.push(format!(
                            "daemon {n}: seccomp profile: {}",
                            cosi::error::Chain(&e)
                        ));
                    }
                }
            }
        }
        if let Some(e) = &d.envelope {
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
    }
    p
}

/// The capability set a daemon is granted.
pub fn capability_set(d: &Daemon) -> Result<CapSet, String> {
    d.capabilities
        .iter()
        .map(|c| CapSet::parse_name(c).map_err(|e| e.to_string()))
        .collect()
}

/// The sandbox's name for a manifest access.
pub fn path_access(a: PathAccess) -> sandbox::PathAccess {
    match a {
        PathAccess::ReadOnly => sandbox::PathAccess::ReadOnly,
        PathAccess::Exec => sandbox::PathAccess::Exec,
        PathAccess::ReadWrite => sandbox::PathAccess::ReadWrite,
    }
}

/// The sandbox policy of one start: the manifest's rules, with optional paths that do not
/// exist dropped, the readiness fd and the held socket's fd declared.
pub fn policy(d: &Daemon, profiles_dir: &Path) -> Result<Policy, String> {
    let capabilities = capability_set(d)?;
    let mut fds = BTreeMap::new();
    if d.readiness == Readiness::Notify {
        fds.insert("notify".to_string(), NOTIFY_FD);
    }
    if let Some(l) = &d.listen {
        fds.insert("listen".to_string(), l.fd);
    }
    Ok(Policy {
        uid: d.uid,
        gid: d.gid,
        supplementary_groups: d.groups.clone(),
        capabilities,
        landlock: LandlockPolicy {
            paths: d
                .landlock
                .paths
                .iter()
                .filter(|r| !r.optional || r.path.exists())
                .map(|r| sandbox::PathRule {
                    path: r.path.clone(),
                    access: path_access(r.access),
                })
                .collect(),
            bind_tcp: d.landlock.bind_tcp.clone(),
            connect_tcp: d.landlock.connect_tcp.clone(),
            ..Default::default()
        },
        seccomp: seccomp_policy(&d.seccomp, profiles_dir),
        env: d.env.clone(),
        fds,
        working_dir: "/".into(),
        umask: 0o077,
    })
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
                && !daemon.read_grants().any(|g| {
                    g.namespace == e.namespace && g.r#type.is_none_or(|t| t == e.r#type)
                })
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
    use std::path::PathBuf;

    fn paths() -> Paths {
        Paths {
            root: "/".into(),
            bin: "/usr/bin".into(),
        }
    }

    #[test]
    fn the_shipped_manifest_is_valid() {
        let m = parse(crate::DEFAULT_MANIFEST, &paths()).unwrap();
        assert_eq!(m.broker().unwrap().name, "stated");
        let order = m.start_order().unwrap();
        assert_eq!(order[0], "stated");
        let networkd = m.daemon("networkd").unwrap();
        assert_eq!(
            capability_set(networkd).unwrap(),
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
        let e = parse(&text, &paths()).unwrap_err();
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
        let msg = parse(&text, &paths()).unwrap_err().to_string();
        assert!(msg.contains("nosuchprofile"), "{msg}");
        assert!(msg.contains("ghost"), "{msg}");
    }

    #[test]
    fn templates_follow_the_root() {
        let p = Paths {
            root: "/tmp/node".into(),
            bin: "/opt/bin".into(),
        };
        let m = parse(crate::DEFAULT_MANIFEST, &p).unwrap();
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
        let m = parse(crate::DEFAULT_MANIFEST, &paths()).unwrap();
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
