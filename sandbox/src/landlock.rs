//! Landlock: the ruleset built before fork from a [`LandlockPolicy`], and the record of what the
//! running kernel enforces.
//!
//! The ruleset handles every access right this build knows (`landlock` crate ABI V10), in
//! best-effort mode: the kernel's ABI decides which of them it really enforces, and
//! [`LandlockApplied`] says which ones. A right the kernel does not handle is not restricted at
//! all (on ABI 7, for example, connecting to a pathname UNIX socket and UDP are unrestricted).
//!
//! There is no `/proc` field for landlock, so the audit cannot read it back from the kernel:
//! [`LandlockApplied`] is what the spawner applied (restrict_self returned 0), and
//! [`kernel_abi`] is what the kernel supports; the tests prove the effect by trying forbidden
//! accesses from inside the sandbox.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};
use serde::{Deserialize, Serialize};

use crate::policy::{LandlockPolicy, PathAccess, PathRule};

/// The newest landlock ABI whose access rights this build requests.
pub const REQUESTED_ABI: u32 = 10;
const REQUESTED: ABI = ABI::V10;
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The landlock ABI version of the running kernel: 0 when landlock is not built in or not
/// enabled at boot.
pub fn kernel_abi() -> u32 {
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and the VERSION flag only
    // returns the ABI version (or -1 and errno); it reads no memory and creates no fd.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(version).unwrap_or(0)
}

/// How much of the requested landlock restriction the kernel enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LandlockEnforcement {
    /// Every right this build requests is handled by the kernel.
    Full,
    /// The kernel's older ABI handles only some of them (see [`LandlockApplied::unhandled`]).
    Partial,
    /// The kernel has no landlock: nothing is restricted.
    NotEnforced,
}

/// What the spawner applied with landlock, and what of it the running kernel enforces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LandlockApplied {
    /// The kernel's landlock ABI when the ruleset was built (0: none).
    pub kernel_abi: u32,
    /// The ABI whose rights were requested ([`REQUESTED_ABI`]).
    pub requested_abi: u32,
    /// Full, partial or no enforcement.
    pub enforcement: LandlockEnforcement,
    /// Filesystem rights the kernel restricts (kernel names, e.g. `write_file`).
    pub handled_fs: Vec<String>,
    /// Network rights the kernel restricts (`bind_tcp`, `connect_tcp`, …).
    pub handled_net: Vec<String>,
    /// Scopes the kernel restricts (`abstract_unix_socket`, `signal`).
    pub scopes: Vec<String>,
    /// Requested rights the kernel does not handle, hence does not restrict.
    pub unhandled: Vec<String>,
    /// The path rules, as granted.
    pub paths: Vec<PathRule>,
    /// TCP ports the program may bind.
    pub bind_tcp: Vec<u16>,
    /// TCP ports the program may connect to.
    pub connect_tcp: Vec<u16>,
    /// UDP ports the program may bind.
    pub bind_udp: Vec<u16>,
    /// UDP ports the program may send to.
    pub connect_udp: Vec<u16>,
}

impl LandlockApplied {
    /// True when the kernel restricts filesystem access for this program.
    pub fn restricts_fs(&self) -> bool {
        self.enforcement != LandlockEnforcement::NotEnforced && !self.handled_fs.is_empty()
    }

    /// True when the kernel restricts TCP bind and connect for this program.
    pub fn restricts_tcp(&self) -> bool {
        ["bind_tcp", "connect_tcp"]
            .iter()
            .all(|r| self.handled_net.iter().any(|h| h == r))
    }

    /// True when the kernel restricts UDP for this program.
    pub fn restricts_udp(&self) -> bool {
        ["bind_udp", "connect_send_udp"]
            .iter()
            .all(|r| self.handled_net.iter().any(|h| h == r))
    }
}

/// A landlock ruleset that failed to build.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// A rule's path cannot be opened (it must exist when the policy is prepared).
    #[error("landlock path {path:?} cannot be opened")]
    Path {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: landlock::PathFdError,
    },
    /// The kernel refused the ruleset or a rule.
    #[error("landlock ruleset")]
    Ruleset(#[from] landlock::RulesetError),
}

/// Rights of one path rule, for the newest ABI (the kernel keeps what it knows).
fn rights(access: PathAccess) -> BitFlags<AccessFs> {
    match access {
        PathAccess::ReadOnly => AccessFs::ReadFile | AccessFs::ReadDir,
        PathAccess::Exec => AccessFs::from_read(REQUESTED),
        PathAccess::ReadWrite => AccessFs::from_all(REQUESTED) & !AccessFs::Execute,
    }
}

/// Builds the ruleset (opening every path) and records what the kernel will enforce.
/// The returned fd is `None` when the kernel has no landlock.
pub(crate) fn prepare(
    policy: &LandlockPolicy,
) -> Result<(Option<OwnedFd>, LandlockApplied), LandlockError> {
    let kernel = kernel_abi();
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(REQUESTED))?
        .handle_access(AccessNet::from_all(REQUESTED))?
        .scope(Scope::from_all(REQUESTED))?
        .create()?;
    for rule in &policy.paths {
        let fd = PathFd::new(&rule.path).map_err(|source| LandlockError::Path {
            path: rule.path.clone(),
            source,
        })?;
        ruleset = ruleset.add_rule(PathBeneath::new(fd, rights(rule.access)))?;
    }
    let ports = [
        (&policy.bind_tcp, AccessNet::BindTcp),
        (&policy.connect_tcp, AccessNet::ConnectTcp),
        (&policy.bind_udp, AccessNet::BindUdp),
        (&policy.connect_udp, AccessNet::ConnectSendUdp),
    ];
    for (list, access) in ports {
        for port in list {
            ruleset = ruleset.add_rule(NetPort::new(*port, access))?;
        }
    }
    let fd: Option<OwnedFd> = ruleset.into();

    // What the kernel handles is what its ABI defines (ABI versions are cumulative).
    let abi = ABI::from(i32::try_from(kernel).unwrap_or(i32::MAX));
    let handled_fs = AccessFs::from_all(abi);
    let handled_net = AccessNet::from_all(abi);
    let scopes = Scope::from_all(abi);
    let unhandled: Vec<String> = (AccessFs::from_all(REQUESTED) & !handled_fs)
        .iter()
        .map(fs_name)
        .chain(
            (AccessNet::from_all(REQUESTED) & !handled_net)
                .iter()
                .map(net_name),
        )
        .chain(
            (Scope::from_all(REQUESTED) & !scopes)
                .iter()
                .map(scope_name),
        )
        .map(str::to_string)
        .collect();
    let enforcement = match (&fd, unhandled.is_empty()) {
        (None, _) => LandlockEnforcement::NotEnforced,
        (Some(_), true) => LandlockEnforcement::Full,
        (Some(_), false) => LandlockEnforcement::Partial,
    };
    let names = |v: Vec<&str>| v.into_iter().map(str::to_string).collect::<Vec<_>>();
    let applied = LandlockApplied {
        kernel_abi: kernel,
        requested_abi: REQUESTED_ABI,
        enforcement,
        handled_fs: names(handled_fs.iter().map(fs_name).collect()),
        handled_net: names(handled_net.iter().map(net_name).collect()),
        scopes: names(scopes.iter().map(scope_name).collect()),
        unhandled,
        paths: policy.paths.clone(),
        bind_tcp: policy.bind_tcp.clone(),
        connect_tcp: policy.connect_tcp.clone(),
        bind_udp: policy.bind_udp.clone(),
        connect_udp: policy.connect_udp.clone(),
    };
    Ok((fd, applied))
}

/// The kernel's name of a filesystem right (`LANDLOCK_ACCESS_FS_<NAME>`, lower case).
fn fs_name(access: AccessFs) -> &'static str {
    match access {
        AccessFs::Execute => "execute",
        AccessFs::WriteFile => "write_file",
        AccessFs::ReadFile => "read_file",
        AccessFs::ReadDir => "read_dir",
        AccessFs::RemoveDir => "remove_dir",
        AccessFs::RemoveFile => "remove_file",
        AccessFs::MakeChar => "make_char",
        AccessFs::MakeDir => "make_dir",
        AccessFs::MakeReg => "make_reg",
        AccessFs::MakeSock => "make_sock",
        AccessFs::MakeFifo => "make_fifo",
        AccessFs::MakeBlock => "make_block",
        AccessFs::MakeSym => "make_sym",
        AccessFs::Refer => "refer",
        AccessFs::Truncate => "truncate",
        AccessFs::IoctlDev => "ioctl_dev",
        AccessFs::ResolveUnix => "resolve_unix",
        _ => "unknown_fs_right",
    }
}

/// The kernel's name of a network right (`LANDLOCK_ACCESS_NET_<NAME>`, lower case).
fn net_name(access: AccessNet) -> &'static str {
    match access {
        AccessNet::BindTcp => "bind_tcp",
        AccessNet::ConnectTcp => "connect_tcp",
        AccessNet::BindUdp => "bind_udp",
        AccessNet::ConnectSendUdp => "connect_send_udp",
        _ => "unknown_net_right",
    }
}

/// The kernel's name of a scope (`LANDLOCK_SCOPE_<NAME>`, lower case).
fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::AbstractUnixSocket => "abstract_unix_socket",
        Scope::Signal => "signal",
        _ => "unknown_scope",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_per_access() {
        assert!(!rights(PathAccess::ReadOnly).contains(AccessFs::Execute));
        assert!(rights(PathAccess::Exec).contains(AccessFs::Execute));
        assert!(!rights(PathAccess::Exec).contains(AccessFs::WriteFile));
        let rw = rights(PathAccess::ReadWrite);
        assert!(rw.contains(AccessFs::WriteFile | AccessFs::Truncate | AccessFs::ReadFile));
        assert!(!rw.contains(AccessFs::Execute));
    }

    #[test]
    fn records_what_the_running_kernel_handles() {
        let policy = LandlockPolicy {
            paths: vec![PathRule {
                path: "/tmp".into(),
                access: PathAccess::ReadWrite,
            }],
            bind_tcp: vec![8080],
            ..Default::default()
        };
        let (fd, applied) = prepare(&policy).unwrap();
        assert_eq!(applied.kernel_abi, kernel_abi());
        if applied.kernel_abi == 0 {
            assert!(fd.is_none());
            assert_eq!(applied.enforcement, LandlockEnforcement::NotEnforced);
            return;
        }
        assert!(fd.is_some());
        assert!(applied.handled_fs.iter().any(|r| r == "write_file"));
        assert_eq!(applied.restricts_tcp(), applied.kernel_abi >= 4);
        let expected = if applied.kernel_abi >= REQUESTED_ABI {
            LandlockEnforcement::Full
        } else {
            LandlockEnforcement::Partial
        };
        assert_eq!(applied.enforcement, expected);
    }

    #[test]
    fn a_missing_path_is_a_typed_error() {
        let policy = LandlockPolicy {
            paths: vec![PathRule {
                path: "/nonexistent/talos-rs".into(),
                access: PathAccess::ReadOnly,
            }],
            ..Default::default()
        };
        if kernel_abi() > 0 {
            assert!(matches!(prepare(&policy), Err(LandlockError::Path { .. })));
        }
    }
}
