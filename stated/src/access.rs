//! Who may do what: peers are identified by the kernel (SO_PEERCRED), never by what they say.
//!
//! Standalone (no manifest): only uid 0 may connect, as admin, and a namespace exists once written.
//! On a node, init hands stated the daemon manifest: it declares the namespaces, and for each
//! daemon its uid, the namespaces it writes (each namespace has exactly one writer) and those it
//! reads. Everything else is `PermissionDenied`.

use std::collections::BTreeSet;

use cosi::definition::META_NAMESPACE;
use cosi::error::{ErrorKind, StateError};

/// The daemon manifest (declared once, in machinery): stated uses its namespaces and, per
/// daemon, the uid, the namespaces written and read and the type groups it may define.
pub use machinery::manifest::{Manifest, ManifestError};

/// Validates a namespace, type or ID component: non-empty, bounded, no control characters; for
/// namespaces also no `/` (they name files of durable namespaces).
pub fn check_name(what: &str, s: &str) -> Result<(), StateError> {
    let max = if what == "id" { 1024 } else { 256 };
    let bad = if s.is_empty() {
        Some("is empty")
    } else if s.len() > max {
        Some(if what == "id" {
            "is longer than 1024 bytes"
        } else {
            "is longer than 256 bytes"
        })
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
            format!("{what} {} {b}", cosi::error::quoted(s)),
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
        /// Namespaces it reads whole (including those it writes and `meta`).
        reads: BTreeSet<String>,
        /// (namespace, type) pairs it may read in namespaces it does not read whole.
        read_types: BTreeSet<(String, String)>,
        /// Resource type groups it may define in `meta` (`net.talos.dev`).
        defines: BTreeSet<String>,
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
            Some(m) => m.namespace(namespace).is_some_and(|n| n.durable),
            None => namespace == "config",
        }
    }

    /// Identifies the peer with kernel-verified uid `uid` (`None`: no credentials, refused).
    pub fn identify(&self, uid: Option<u32>) -> Peer {
        match uid {
            Some(0) => Peer::Admin,
            None => Peer::Stranger(u32::MAX),
            Some(uid) => {
                let Some(d) = self.manifest.as_ref().and_then(|m| m.daemon_by_uid(uid)) else {
                    return Peer::Stranger(uid);
                };
                let writes: BTreeSet<String> = d.writes.iter().cloned().collect();
                let mut reads = BTreeSet::new();
                let mut read_types = BTreeSet::new();
                for g in d.read_grants() {
                    match g.r#type {
                        None => reads.insert(g.namespace.to_string()),
                        Some(t) => read_types.insert((g.namespace.to_string(), t.to_string())),
                    };
                }
                reads.extend(writes.iter().cloned());
                reads.insert(META_NAMESPACE.to_string());
                Peer::Daemon {
                    name: d.name.clone(),
                    writes,
                    reads,
                    read_types,
                    defines: d.defines.iter().cloned().collect(),
                }
            }
        }
    }

    /// Checks that `peer` may read resources of `r#type` in `namespace`: the whole namespace,
    /// or that one type of it, is granted.
    pub fn check_read(&self, peer: &Peer, namespace: &str, r#type: &str) -> Result<(), StateError> {
        if let Peer::Daemon {
            name,
            reads,
            read_types,
            ..
        } = peer
        {
            if !reads.contains(namespace) && read_types.iter().any(|(ns, _)| ns == namespace) {
                check_name("namespace", namespace)?;
                if read_types.contains(&(namespace.to_string(), r#type.to_string())) {
                    return Ok(());
                }
                return Err(StateError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "daemon {name} may read only some types of namespace {namespace:?}, not {}",
                        cosi::error::quoted(r#type)
                    ),
                ));
            }
        }
        self.check(peer, namespace, Access::Read)
    }

    /// Checks that `peer` may `access` the whole of `namespace`.
    pub fn check(&self, peer: &Peer, namespace: &str, access: Access) -> Result<(), StateError> {
        check_name("namespace", namespace)?;
        if let Some(m) = &self.manifest {
            if namespace != META_NAMESPACE && m.namespace(namespace).is_none() {
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
  - {name: stated, broker: true, binary: /s, uid: 1990000010, gid: 1990000010, seccomp: stated}
  - {name: networkd, binary: /n, uid: 1990000011, gid: 1990000011, seccomp: networkd,
     writes: [network], reads: [config], defines: [net.talos.dev]}
  - {name: other, binary: /o, uid: 1990000012, gid: 1990000012, seccomp: o, writes: [runtime]}
"#;

    #[test]
    fn policy() {
        let p = Policy::with_manifest(Manifest::parse_substituted(M).unwrap());
        let n = p.identify(Some(1990000011));
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
    fn a_read_grant_of_one_type_reads_only_that_type() {
        let m = M.replace(
            "writes: [runtime]}",
            "writes: [runtime], reads: [network/Links.net.talos.dev]}",
        );
        let p = Policy::with_manifest(Manifest::parse_substituted(&m).unwrap());
        let o = p.identify(Some(1990000012));
        assert!(p.check_read(&o, "network", "Links.net.talos.dev").is_ok());
        let e = p
            .check_read(&o, "network", "AddressSpecs.net.talos.dev")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.message().contains("only some types"), "{}", e.message());
        // Not the whole namespace, and nothing else.
        assert!(p.check(&o, "network", Access::Read).is_err());
        assert!(p.check_read(&o, "config", "Links.net.talos.dev").is_err());
        assert!(p.check(&o, "network", Access::Write).is_err());
        // A whole-namespace reader is unaffected.
        let n = p.identify(Some(1990000011));
        assert!(p.check_read(&n, "config", "Anything.x.talos.dev").is_ok());
        assert!(Manifest::parse_substituted(&M.replace(
            "writes: [runtime]}",
            "writes: [runtime], reads: [network/NotAType]}"
        ))
        .is_err());
    }

    #[test]
    fn long_names_are_not_echoed() {
        let e = check_name("id", &"x".repeat(1 << 20)).unwrap_err();
        assert!(e.message().len() < 200, "{}", e.message());
        assert!(e.message().contains("longer than 1024 bytes"));
    }
}
