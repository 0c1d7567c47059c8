//! Who may do what: peers are identified by the kernel (SO_PEERCRED), never by what they say.
//!
//! Standalone (no manifest): only uid 0 may connect, as admin, and a namespace exists once written.
//! On a node, init hands stated the daemon manifest: it declares the namespaces, and for each
//! daemon its uid, the namespaces it writes (each namespace has exactly one writer) and those it
//! reads. Everything else is `PermissionDenied`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cosi::definition::META_NAMESPACE;
use cosi::error::{ErrorKind, StateError};
use serde::Deserialize;

/// The parts of the daemon manifest that stated uses. Other keys of the manifest (binary,
/// capabilities, sandbox rules) belong to init and are ignored here.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Manifest {
    /// Declared namespaces.
    #[serde(default)]
    pub namespaces: Vec<NamespaceDecl>,
    /// Daemons.
    #[serde(default)]
    pub daemons: Vec<DaemonDecl>,
}

/// A namespace of the node.
#[derive(Clone, Debug, Deserialize)]
pub struct NamespaceDecl {
    /// Name, e.g. `network`.
    pub name: String,
    /// What it holds.
    #[serde(default)]
    pub description: String,
    /// Survives reboot (written to the state directory).
    #[serde(default)]
    pub durable: bool,
}

/// A daemon's identity and namespace access.
#[derive(Clone, Debug, Deserialize)]
pub struct DaemonDecl {
    /// Name, e.g. `networkd`.
    pub name: String,
    /// Its fixed uid.
    pub uid: u32,
    /// Namespaces it writes (it is their only writer).
    #[serde(default)]
    pub writes: Vec<String>,
    /// Namespaces it reads besides those it writes and `meta`.
    #[serde(default)]
    pub reads: Vec<String>,
}

/// Errors of a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read manifest {path}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The YAML did not parse.
    #[error("cannot parse manifest")]
    Parse(#[source] serde_yaml_ng::Error),
    /// The manifest contradicts itself.
    #[error("invalid manifest:\n{}", .0.join("\n"))]
    Invalid(Vec<String>),
}

impl Manifest {
    /// Loads and checks a manifest file.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and checks a manifest.
    pub fn parse(text: &str) -> Result<Self, ManifestError> {
        let m: Manifest = serde_yaml_ng::from_str(text).map_err(ManifestError::Parse)?;
        m.check()?;
        Ok(m)
    }

    fn check(&self) -> Result<(), ManifestError> {
        let mut problems = Vec::new();
        let declared: BTreeSet<&str> = self.namespaces.iter().map(|n| n.name.as_str()).collect();
        if declared.len() != self.namespaces.len() {
            problems.push("a namespace is declared twice".to_string());
        }
        for n in &self.namespaces {
            if let Err(e) = check_name("namespace", &n.name) {
                problems.push(e.message().to_string());
            }
        }
        let mut writer: BTreeMap<&str, &str> = BTreeMap::new();
        let mut uids = BTreeSet::new();
        for d in &self.daemons {
            if d.uid == 0 {
                problems.push(format!(
                    "daemon {}: uid 0 is reserved for the administrator",
                    d.name
                ));
            }
            if !uids.insert(d.uid) {
                problems.push(format!("daemon {}: uid {} is used twice", d.name, d.uid));
            }
            for ns in d.writes.iter().chain(&d.reads) {
                if !declared.contains(ns.as_str()) {
                    problems.push(format!(
                        "daemon {}: namespace {ns:?} is not declared",
                        d.name
                    ));
                }
            }
            for ns in &d.writes {
                if ns == META_NAMESPACE {
                    problems.push(format!(
                        "daemon {}: only stated writes {META_NAMESPACE}",
                        d.name
                    ));
                }
                if let Some(other) = writer.insert(ns, &d.name) {
                    problems.push(format!(
                        "namespace {ns:?} has two writers: {other} and {}",
                        d.name
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ManifestError::Invalid(problems))
        }
    }
}

/// Validates a namespace, type or ID component: non-empty, bounded, no control characters; for
/// namespaces also no `/` (they name files of durable namespaces).
pub fn check_name(what: &str, s: &str) -> Result<(), StateError> {
    let max = if what == "id" { 1024 } else { 256 };
    let bad = if s.is_empty() {
        Some("is empty")
    } else if s.len() > max {
        Some("is too long")
    } else if s.chars().any(char::is_control) {
        Some("contains control characters")
    } else if what == "namespace" && (s.contains('/') || s.starts_with('.')) {
        Some("contains '/' or starts with '.'")
    } else {
        None
    };
    match bad {
        Some(b) => Err(StateError::new(
            ErrorKind::InvalidArgument,
            format!("{what} {s:?} {b}"),
        )),
        None => Ok(()),
    }
}

/// The identity of a connected peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// uid 0: may do anything.
    Admin,
    /// A daemon of the manifest.
    Daemon {
        /// Its name.
        name: String,
        /// Namespaces it writes.
        writes: BTreeSet<String>,
        /// Namespaces it reads (including those it writes and `meta`).
        reads: BTreeSet<String>,
    },
    /// Anyone else.
    Stranger(u32),
}

/// The access policy of one stated.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    manifest: Option<Manifest>,
}

/// What a request does to a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Get, List, Watch.
    Read,
    /// Create, Update, Destroy, Teardown.
    Write,
}

impl Policy {
    /// Standalone: uid 0 only, namespaces exist once written.
    pub fn standalone() -> Self {
        Self { manifest: None }
    }

    /// On a node: the manifest declares namespaces and daemons.
    pub fn with_manifest(manifest: Manifest) -> Self {
        Self {
            manifest: Some(manifest),
        }
    }

    /// The manifest, if any.
    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// Whether `namespace` is durable.
    pub fn is_durable(&self, namespace: &str) -> bool {
        match &self.manifest {
            Some(m) => m
                .namespaces
                .iter()
                .any(|n| n.name == namespace && n.durable),
            None => namespace == "config",
        }
    }

    /// Identifies the peer with kernel-verified uid `uid` (`None`: no credentials, refused).
    pub fn identify(&self, uid: Option<u32>) -> Peer {
        match uid {
            Some(0) => Peer::Admin,
            None => Peer::Stranger(u32::MAX),
            Some(uid) => {
                let Some(d) = self
                    .manifest
                    .as_ref()
                    .and_then(|m| m.daemons.iter().find(|d| d.uid == uid))
                else {
                    return Peer::Stranger(uid);
                };
                let writes: BTreeSet<String> = d.writes.iter().cloned().collect();
                let mut reads: BTreeSet<String> = d.reads.iter().cloned().collect();
                reads.extend(writes.iter().cloned());
                reads.insert(META_NAMESPACE.to_string());
                Peer::Daemon {
                    name: d.name.clone(),
                    writes,
                    reads,
                }
            }
        }
    }

    /// Checks that `peer` may `access` `namespace`.
    pub fn check(&self, peer: &Peer, namespace: &str, access: Access) -> Result<(), StateError> {
        check_name("namespace", namespace)?;
        if let Some(m) = &self.manifest {
            if namespace != META_NAMESPACE && !m.namespaces.iter().any(|n| n.name == namespace) {
                return Err(StateError::new(
                    ErrorKind::InvalidArgument,
                    format!("namespace {namespace:?} is not declared on this node"),
                ));
            }
        }
        let allowed = match peer {
            Peer::Admin => true,
            Peer::Stranger(_) => false,
            Peer::Daemon { writes, reads, .. } => match access {
                Access::Read => reads.contains(namespace),
                Access::Write => writes.contains(namespace),
            },
        };
        if allowed {
            Ok(())
        } else {
            let who = match peer {
                Peer::Daemon { name, .. } => format!("daemon {name}"),
                Peer::Stranger(uid) => format!("uid {uid}"),
                Peer::Admin => "admin".into(),
            };
            let verb = match access {
                Access::Read => "read",
                Access::Write => "write",
            };
            Err(StateError::new(
                ErrorKind::PermissionDenied,
                format!("{who} may not {verb} namespace {namespace:?}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = r#"
namespaces:
  - {name: config, durable: true}
  - {name: network}
  - {name: runtime}
daemons:
  - {name: networkd, uid: 1002, writes: [network], reads: [config]}
  - {name: init, uid: 1001, writes: [runtime]}
"#;

    #[test]
    fn policy() {
        let p = Policy::with_manifest(Manifest::parse(M).unwrap());
        let n = p.identify(Some(1002));
        assert!(p.check(&n, "network", Access::Write).is_ok());
        assert!(p.check(&n, "config", Access::Read).is_ok());
        assert!(p.check(&n, "meta", Access::Read).is_ok());
        assert_eq!(
            p.check(&n, "config", Access::Write).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            p.check(&n, "runtime", Access::Read).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            p.check(&Peer::Admin, "nope", Access::Read)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
        let s = p.identify(Some(4242));
        assert_eq!(
            p.check(&s, "network", Access::Read).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        assert!(p.is_durable("config"));
        assert!(!p.is_durable("network"));
    }

    #[test]
    fn bad_manifest_lists_every_problem() {
        let e = Manifest::parse(
            "namespaces: [{name: a}]\ndaemons:\n - {name: x, uid: 0, writes: [a, b]}\n - {name: y, uid: 5, writes: [a]}\n",
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(s.contains("uid 0"), "{s}");
        assert!(s.contains("\"b\" is not declared"), "{s}");
        assert!(s.contains("two writers"), "{s}");
    }
}
