//! The sandbox of one program, as a manifest declares it: identity, capabilities, landlock rules,
//! seccomp profile, environment, inherited fds and working directory.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::capset::CapSet;

/// The highest fd number a policy may hand to its program.
pub const MAX_FD: RawFd = 1023;
/// How many named fds a policy may hand to its program (the child moves them without allocating).
pub const MAX_NAMED_FDS: usize = 13;

/// The sandbox of one program (a daemon or a requested service).
///
/// Every field is applied between fork and exec by [`crate::spawn()`]; nothing is inherited from the
/// spawner except what is written here (and stdin/stdout/stderr, see [`crate::Command`]).
/// `no_new_privs` has no field: it is always set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// The uid the program runs as (real, effective, saved and filesystem); never 0.
    pub uid: u32,
    /// The gid the program runs as (real, effective, saved and filesystem); never 0.
    pub gid: u32,
    /// Supplementary groups; none by default.
    #[serde(default)]
    pub supplementary_groups: Vec<u32>,
    /// Capabilities the program holds: its permitted, effective, inheritable and ambient sets
    /// are exactly these, and its bounding set is shrunk to them.
    #[serde(default)]
    pub capabilities: CapSet,
    /// Landlock filesystem and network rules.
    #[serde(default)]
    pub landlock: LandlockPolicy,
    /// The seccomp allow-list.
    pub seccomp: SeccompPolicy,
    /// The whole environment of the program (nothing of the spawner's is passed).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Named fds the program receives, by name and fd number, e.g. `{"notify": 3}` for the
    /// readiness notification pipe. The spawner supplies each with [`crate::Command::fd`].
    #[serde(default)]
    pub fds: BTreeMap<String, RawFd>,
    /// The working directory, entered as the program's uid; `/` by default.
    #[serde(default = "root_dir")]
    pub working_dir: PathBuf,
    /// The file mode creation mask, written in octal (`"0027"`); `"0077"` by default.
    #[serde(default = "private_umask", with = "octal")]
    pub umask: u32,
}

fn root_dir() -> PathBuf {
    PathBuf::from("/")
}

fn private_umask() -> u32 {
    0o077
}

/// A mode written as an octal string, as people write modes.
mod octal {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mode: &u32, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{mode:04o}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        let text = String::deserialize(deserializer)?;
        u32::from_str_radix(&text, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not an octal mode")))
    }
}

/// Landlock rules: what the program may reach beyond which everything landlock handles is denied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LandlockPolicy {
    /// Paths (each with everything beneath it) and what the program may do there.
    #[serde(default)]
    pub paths: Vec<PathRule>,
    /// TCP ports the program may bind (enforced from landlock ABI 4, Linux 6.7).
    #[serde(default)]
    pub bind_tcp: Vec<u16>,
    /// TCP ports the program may connect to (enforced from landlock ABI 4, Linux 6.7).
    #[serde(default)]
    pub connect_tcp: Vec<u16>,
    /// UDP ports the program may bind (enforced from landlock ABI 10).
    #[serde(default)]
    pub bind_udp: Vec<u16>,
    /// UDP ports the program may send to or connect to (enforced from landlock ABI 10).
    #[serde(default)]
    pub connect_udp: Vec<u16>,
}

/// One landlock filesystem rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathRule {
    /// An absolute path that exists when the policy is prepared; the rule covers what is beneath.
    pub path: PathBuf,
    /// What the program may do there.
    pub access: PathAccess,
}

/// What a landlock path rule allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathAccess {
    /// Read files and list directories.
    ReadOnly,
    /// Read, and execute files (binaries, shared libraries).
    Exec,
    /// Read, write, create, remove, rename, truncate, and ioctl on devices; not execute.
    ReadWrite,
}

/// The seccomp filter of a program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum SeccompPolicy {
    /// An allow-list from a seccompiler JSON profile.
    Profile(SeccompProfileRef),
    /// No filter at all. Only for bring-up; the audit reports it as a missing filter.
    Unconfined,
}

/// Where a seccomp profile is and which of its filters applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeccompProfileRef {
    /// The JSON file; `{arch}` in it is replaced with the running architecture (`x86_64`), since
    /// seccompiler profiles name system calls of one architecture.
    pub path: PathBuf,
    /// The name of the filter in the file (a profile may hold several).
    pub filter: String,
}

impl SeccompProfileRef {
    /// The path with `{arch}` replaced by the running architecture.
    pub fn resolved_path(&self) -> PathBuf {
        PathBuf::from(
            self.path
                .to_string_lossy()
                .replace("{arch}", std::env::consts::ARCH),
        )
    }
}

/// One problem in a [`Policy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// uid 0 or gid 0: every program runs as its own non-root identity.
    #[error("{field} 0 is root: a sandboxed program runs as its own non-root identity")]
    Root {
        /// `uid`, `gid` or `supplementaryGroups`.
        field: &'static str,
    },
    /// A named fd is below 3 (stdio is not named), above [`MAX_FD`], or given twice.
    #[error("fd {name:?} = {fd}: named fds are unique numbers from 3 to {MAX_FD}")]
    Fd {
        /// The fd's name.
        name: String,
        /// Its number.
        fd: RawFd,
    },
    /// More than [`MAX_NAMED_FDS`] named fds.
    #[error("{count} named fds: at most {MAX_NAMED_FDS}")]
    TooManyFds {
        /// How many were given.
        count: usize,
    },
    /// A path is relative.
    #[error("{what} {path:?} is not absolute")]
    RelativePath {
        /// What the path is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// An environment variable name is empty or holds `=` or NUL, or a value holds NUL.
    #[error("environment variable {name:?} cannot be passed to execve")]
    Env {
        /// The name.
        name: String,
    },
}

impl Policy {
    /// Checks the whole policy and returns every problem, not just the first.
    pub fn validate(&self) -> Result<(), Vec<PolicyError>> {
        let mut errors = Vec::new();
        if self.uid == 0 {
            errors.push(PolicyError::Root { field: "uid" });
        }
        if self.gid == 0 {
            errors.push(PolicyError::Root { field: "gid" });
        }
        if self.supplementary_groups.contains(&0) {
            errors.push(PolicyError::Root {
                field: "supplementaryGroups",
            });
        }
        if self.fds.len() > MAX_NAMED_FDS {
            errors.push(PolicyError::TooManyFds {
                count: self.fds.len(),
            });
        }
        let mut seen = BTreeSet::new();
        for (name, fd) in &self.fds {
            if !(3..=MAX_FD).contains(fd) || !seen.insert(*fd) {
                errors.push(PolicyError::Fd {
                    name: name.clone(),
                    fd: *fd,
                });
            }
        }
        let mut absolute = |what, path: &Path| {
            if !path.is_absolute() {
                errors.push(PolicyError::RelativePath {
                    what,
                    path: path.to_path_buf(),
                });
            }
        };
        absolute("workingDir", &self.working_dir);
        for rule in &self.landlock.paths {
            absolute("landlock path", &rule.path);
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                errors.push(PolicyError::Env { name: name.clone() });
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NETWORKD: &str = r#"{
        "uid": 1001, "gid": 1001,
        "capabilities": ["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE"],
        "landlock": {
            "paths": [
                {"path": "/usr", "access": "exec"},
                {"path": "/etc/resolv.conf", "access": "read-write"}
            ],
            "connectTcp": [2379]
        },
        "seccomp": {"profile": {"path": "/etc/seccomp/{arch}/networkd.json", "filter": "networkd"}},
        "env": {"RUST_LOG": "info"},
        "fds": {"notify": 3}
    }"#;

    #[test]
    fn parses_a_manifest_entry_with_defaults() {
        let p: Policy = serde_json::from_str(NETWORKD).unwrap();
        assert_eq!(p.uid, 1001);
        assert!(p.supplementary_groups.is_empty());
        assert_eq!(p.capabilities.names().len(), 3);
        assert_eq!(p.landlock.paths[0].access, PathAccess::Exec);
        assert_eq!(p.working_dir, PathBuf::from("/"));
        assert_eq!(p.fds["notify"], 3);
        assert_eq!(p.umask, 0o077);
        let SeccompPolicy::Profile(profile) = &p.seccomp else {
            panic!("profile expected")
        };
        assert_eq!(
            profile.resolved_path(),
            PathBuf::from(format!(
                "/etc/seccomp/{}/networkd.json",
                std::env::consts::ARCH
            ))
        );
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn unknown_fields_and_caps_are_refused() {
        let typo = NETWORKD.replace("\"env\"", "\"environment\"");
        assert!(serde_json::from_str::<Policy>(&typo).is_err());
        let bad_cap = NETWORKD.replace("CAP_NET_RAW", "CAP_NET_RAWR");
        assert!(serde_json::from_str::<Policy>(&bad_cap).is_err());
        let unconfined = r#"{"uid": 5, "gid": 5, "seccomp": "unconfined", "umask": "0027"}"#;
        let p: Policy = serde_json::from_str(unconfined).unwrap();
        assert_eq!(p.seccomp, SeccompPolicy::Unconfined);
        assert_eq!(p.umask, 0o027);
        assert!(serde_json::to_string(&p)
            .unwrap()
            .contains(r#""umask":"0027""#));
        let bad_umask = unconfined.replace("0027", "0999");
        assert!(serde_json::from_str::<Policy>(&bad_umask).is_err());
    }

    #[test]
    fn validate_reports_every_problem() {
        let mut p: Policy = serde_json::from_str(NETWORKD).unwrap();
        p.uid = 0;
        p.fds.insert("stdout".into(), 1);
        p.fds.insert("again".into(), 3);
        p.working_dir = "relative".into();
        p.env.insert("A=B".into(), "x".into());
        let errors = p.validate().unwrap_err();
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors.contains(&PolicyError::Root { field: "uid" }));
    }
}
