//! Everything resolved before fork: C strings, the BPF program, the landlock ruleset fd, the
//! capability masks, the fd moves. The child then only copies and issues system calls.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::capset::CapSet;
use crate::landlock::{LandlockApplied, LandlockEnforcement, LandlockError};
use crate::policy::{Policy, PolicyError, SeccompPolicy};
use crate::seccomp::{SeccompApplied, SeccompError};

/// The program to run under a [`Policy`], and the fds it receives.
///
/// stdin, stdout and stderr are inherited from the spawner unless replaced with
/// [`Command::stdin`], [`Command::stdout`], [`Command::stderr`]; every other fd is closed in the
/// child, except the named fds of the policy, each supplied with [`Command::fd`].
#[derive(Debug)]
pub struct Command {
    program: PathBuf,
    argv0: Option<OsString>,
    args: Vec<OsString>,
    stdio: [Option<OwnedFd>; 3],
    named: BTreeMap<String, OwnedFd>,
}

impl Command {
    /// Runs `program`, an absolute path (there is no `PATH` search).
    pub fn new(program: impl Into<PathBuf>) -> Command {
        Command {
            program: program.into(),
            argv0: None,
            args: Vec::new(),
            stdio: [None, None, None],
            named: BTreeMap::new(),
        }
    }

    /// Sets `argv[0]` (the program path by default).
    #[must_use]
    pub fn argv0(mut self, argv0: impl Into<OsString>) -> Command {
        self.argv0 = Some(argv0.into());
        self
    }

    /// Appends one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Command {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Gives the program `fd` as its stdin (fd 0).
    #[must_use]
    pub fn stdin(mut self, fd: OwnedFd) -> Command {
        self.stdio[0] = Some(fd);
        self
    }

    /// Gives the program `fd` as its stdout (fd 1).
    #[must_use]
    pub fn stdout(mut self, fd: OwnedFd) -> Command {
        self.stdio[1] = Some(fd);
        self
    }

    /// Gives the program `fd` as its stderr (fd 2).
    #[must_use]
    pub fn stderr(mut self, fd: OwnedFd) -> Command {
        self.stdio[2] = Some(fd);
        self
    }

    /// Supplies the policy's named fd `name` (e.g. `"notify"`), placed at the number the policy
    /// gives it.
    #[must_use]
    pub fn fd(mut self, name: impl Into<String>, fd: OwnedFd) -> Command {
        self.named.insert(name.into(), fd);
        self
    }
}

/// What the spawner applied to a program: the part of its sandbox that `/proc` does not show
/// (landlock, the seccomp allow-list) and the identity it was given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Applied {
    /// The program.
    pub program: PathBuf,
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Supplementary groups.
    pub supplementary_groups: Vec<u32>,
    /// The capability set (permitted, effective, inheritable, ambient and bounding).
    pub capabilities: CapSet,
    /// The landlock ruleset and how much of it the kernel enforces.
    pub landlock: LandlockApplied,
    /// The seccomp filter, or `None` for a policy that is explicitly unconfined.
    pub seccomp: Option<SeccompApplied>,
}

/// A policy that cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The policy itself is wrong (every problem is listed).
    #[error("invalid policy: {}", list(.0))]
    Policy(Vec<PolicyError>),
    /// The program path is not absolute.
    #[error("program {0:?} is not an absolute path")]
    RelativeProgram(PathBuf),
    /// A string holds a NUL byte and cannot be passed to execve.
    #[error("{what} holds a NUL byte")]
    Nul {
        /// Which string.
        what: &'static str,
    },
    /// A named fd of the policy was not supplied, or one was supplied that the policy lacks.
    #[error("named fd {name:?}: {problem}")]
    NamedFd {
        /// The fd's name.
        name: String,
        /// `declared by the policy but not supplied` or `supplied but not declared by the policy`.
        problem: &'static str,
    },
    /// The spawner cannot grant capabilities it does not have in its own bounding set.
    #[error("capabilities {missing} are not in the spawner's bounding set")]
    CapabilitiesUnavailable {
        /// The capabilities the spawner lacks.
        missing: CapSet,
    },
    /// `/proc/sys/kernel/cap_last_cap` or `/proc/self/status` cannot be read.
    #[error("cannot read the kernel's capability limits from /proc")]
    CapabilityLimits(#[source] std::io::Error),
    /// The landlock ruleset cannot be built.
    #[error("landlock")]
    Landlock(#[from] LandlockError),
    /// The seccomp profile cannot be used.
    #[error("seccomp")]
    Seccomp(#[from] SeccompError),
}

fn list(errors: &[PolicyError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A NUL-terminated array of pointers to owned C strings, as execve wants argv and envp.
pub(crate) struct CStringArray {
    _strings: Vec<CString>,
    ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the `CString`s owned by the same struct, whose heap buffers
// never move or change after construction; the array is only read. Sharing or sending it is
// as safe as sharing or sending the `Vec<CString>` itself.
unsafe impl Send for CStringArray {}
// SAFETY: see `Send`: nothing is ever written through the pointers.
unsafe impl Sync for CStringArray {}

impl CStringArray {
    fn new(strings: Vec<CString>) -> CStringArray {
        let ptrs = strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        CStringArray {
            _strings: strings,
            ptrs,
        }
    }

    /// The NUL-terminated pointer array.
    pub(crate) fn as_ptr(&self) -> *const *const libc::c_char {
        self.ptrs.as_ptr()
    }
}

impl std::fmt::Debug for CStringArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self._strings).finish()
    }
}

/// A policy and a command with everything resolved, ready for [`crate::spawn()`] (any number of
/// times: each spawn gets copies of the same fds).
///
/// Dropping it closes the fds it holds (the landlock ruleset and the supplied fds).
#[derive(Debug)]
pub struct Prepared {
    pub(crate) program: CString,
    pub(crate) argv: CStringArray,
    pub(crate) envp: CStringArray,
    pub(crate) working_dir: CString,
    pub(crate) umask: libc::mode_t,
    pub(crate) uid: libc::uid_t,
    pub(crate) gid: libc::gid_t,
    pub(crate) groups: Vec<libc::gid_t>,
    pub(crate) caps: CapSet,
    pub(crate) cap_last: u8,
    /// (source, target) pairs; sources are owned by `_fds`.
    pub(crate) fd_moves: Vec<(RawFd, RawFd)>,
    _fds: Vec<OwnedFd>,
    pub(crate) landlock_fd: Option<OwnedFd>,
    pub(crate) bpf: Option<seccompiler::BpfProgram>,
    /// Installed before `bpf`: the calls every confined process gets ENOSYS for.
    pub(crate) bpf_enosys: Option<seccompiler::BpfProgram>,
    pub(crate) applied: Applied,
}

impl Prepared {
    /// Resolves `policy` for `command`: validates the policy, opens the landlock paths,
    /// compiles the seccomp filter and lays out argv, envp and the fd moves.
    ///
    /// # Errors
    /// Every problem that can be found before fork is found here, so that a child fails only on
    /// what the kernel refuses at that moment.
    pub fn new(policy: &Policy, command: Command) -> Result<Prepared, PrepareError> {
        policy.validate().map_err(PrepareError::Policy)?;
        if !command.program.is_absolute() {
            return Err(PrepareError::RelativeProgram(command.program));
        }
        let program = cstring(command.program.as_os_str(), "program path")?;
        let argv0 = command
            .argv0
            .as_deref()
            .unwrap_or(command.program.as_os_str());
        let argv = std::iter::once(argv0)
            .chain(command.args.iter().map(OsString::as_os_str))
            .map(|a| cstring(a, "argument"))
            .collect::<Result<Vec<_>, _>>()?;
        let envp = policy
            .env
            .iter()
            .map(|(k, v)| {
                CString::new(format!("{k}={v}")).map_err(|_| PrepareError::Nul {
                    what: "environment",
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let working_dir = cstring(policy.working_dir.as_os_str(), "working directory")?;

        let (fd_moves, fds) = fd_moves(policy, command.stdio, command.named)?;

        let (cap_last, bounding) = capability_limits().map_err(PrepareError::CapabilityLimits)?;
        let missing = policy.capabilities.difference(bounding);
        if !missing.is_empty() {
            return Err(PrepareError::CapabilitiesUnavailable { missing });
        }

        let (landlock_fd, landlock) = crate::landlock::prepare(&policy.landlock)?;
        match landlock.enforcement {
            LandlockEnforcement::Full => {}
            LandlockEnforcement::Partial => tracing::debug!(
                program = %command.program.display(),
                kernel_abi = landlock.kernel_abi,
                unhandled = ?landlock.unhandled,
                "landlock partially enforced by this kernel"
            ),
            LandlockEnforcement::NotEnforced => tracing::warn!(
                program = %command.program.display(),
                "no landlock on this kernel: the program's filesystem and ports are not restricted"
            ),
        }
        let (bpf, bpf_enosys, seccomp) = match &policy.seccomp {
            SeccompPolicy::Profile(profile) => {
                let (bpf, applied) =
                    crate::seccomp::compile(&profile.resolved_path(), &profile.filter)?;
                (
                    Some(bpf),
                    Some(crate::seccomp::enosys_filter()?),
                    Some(applied),
                )
            }
            SeccompPolicy::Unconfined => (None, None, None),
        };

        Ok(Prepared {
            program,
            argv: CStringArray::new(argv),
            envp: CStringArray::new(envp),
            working_dir,
            umask: policy.umask,
            uid: policy.uid,
            gid: policy.gid,
            groups: policy.supplementary_groups.clone(),
            caps: policy.capabilities,
            cap_last,
            fd_moves,
            _fds: fds,
            landlock_fd,
            bpf,
            bpf_enosys,
            applied: Applied {
                program: command.program,
                uid: policy.uid,
                gid: policy.gid,
                supplementary_groups: policy.supplementary_groups.clone(),
                capabilities: policy.capabilities,
                landlock,
                seccomp,
            },
        })
    }

    /// What a spawn of this will apply.
    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    /// The program path.
    pub fn program(&self) -> &Path {
        &self.applied.program
    }
}

fn cstring(s: &OsStr, what: &'static str) -> Result<CString, PrepareError> {
    CString::new(s.as_bytes()).map_err(|_| PrepareError::Nul { what })
}

/// (source, target) pairs, and the owned sources.
type FdMoves = (Vec<(RawFd, RawFd)>, Vec<OwnedFd>);

/// Pairs every supplied fd with its target number and checks them against the policy.
fn fd_moves(
    policy: &Policy,
    stdio: [Option<OwnedFd>; 3],
    mut named: BTreeMap<String, OwnedFd>,
) -> Result<FdMoves, PrepareError> {
    let mut moves = Vec::new();
    let mut owned = Vec::new();
    for (target, fd) in (0..).zip(stdio) {
        if let Some(fd) = fd {
            moves.push((fd.as_raw_fd(), target));
            owned.push(fd);
        }
    }
    for (name, target) in &policy.fds {
        let fd = named.remove(name).ok_or_else(|| PrepareError::NamedFd {
            name: name.clone(),
            problem: "declared by the policy but not supplied",
        })?;
        moves.push((fd.as_raw_fd(), *target));
        owned.push(fd);
    }
    if let Some(name) = named.into_keys().next() {
        return Err(PrepareError::NamedFd {
            name,
            problem: "supplied but not declared by the policy",
        });
    }
    Ok((moves, owned))
}

/// The highest capability number of the running kernel, and the spawner's bounding set.
fn capability_limits() -> std::io::Result<(u8, CapSet)> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")?
        .trim()
        .parse::<u8>()
        .map_err(|_| invalid("cap_last_cap"))?;
    let status = std::fs::read_to_string("/proc/thread-self/status")?;
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(CapSet::from_hex)
        .ok_or_else(|| invalid("CapBnd"))?;
    Ok((last.min(63), bounding))
}
