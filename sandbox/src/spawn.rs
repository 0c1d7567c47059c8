//! fork, apply the sandbox in the child in a fixed order, exec; report a failed step to the
//! parent through a close-on-exec pipe.
//!
//! The spawner may be multi-threaded (init runs tokio): after fork only the calling thread
//! exists in the child, and any lock another thread held (malloc's, tracing's) stays locked
//! forever. So the child runs only async-signal-safe system calls on memory prepared before
//! fork ([`Prepared`]): no allocation, no locks, no logging, no panics.

use std::convert::Infallible;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use serde::{Deserialize, Serialize};

use crate::observe::{observe, ObserveError, Observed};
use crate::prepare::{Applied, Prepared};

/// The steps the child takes between fork and exec, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[repr(u32)]
pub enum Step {
    /// Reset signal dispositions and the signal mask inherited from the spawner.
    Signals = 1,
    /// Start a new session (and process group) so the whole group can be signalled.
    Session = 2,
    /// Move the supplied fds into place and close every other fd.
    CloseFds = 3,
    /// `PR_SET_KEEPCAPS`, so that leaving uid 0 keeps the permitted set.
    KeepCaps = 4,
    /// `setgroups`.
    SetGroups = 5,
    /// `setresgid`.
    SetGid = 6,
    /// `setresuid`.
    SetUid = 7,
    /// `chdir` to the working directory, as the program's uid.
    WorkingDir = 8,
    /// `capset`: permitted, effective and inheritable set to the policy's capabilities.
    Capabilities = 9,
    /// `PR_CAPBSET_DROP` of every capability outside the policy.
    BoundingSet = 10,
    /// `PR_CAP_AMBIENT_RAISE` of the policy's capabilities, so they survive exec.
    AmbientCapabilities = 11,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs = 12,
    /// `landlock_restrict_self`.
    Landlock = 13,
    /// `seccomp(SECCOMP_SET_MODE_FILTER)`.
    Seccomp = 14,
    /// `execve`.
    Exec = 15,
}

impl Step {
    const ALL: [Step; 15] = [
        Step::Signals,
        Step::Session,
        Step::CloseFds,
        Step::KeepCaps,
        Step::SetGroups,
        Step::SetGid,
        Step::SetUid,
        Step::WorkingDir,
        Step::Capabilities,
        Step::BoundingSet,
        Step::AmbientCapabilities,
        Step::NoNewPrivs,
        Step::Landlock,
        Step::Seccomp,
        Step::Exec,
    ];

    fn from_u32(n: u32) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u32 == n)
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Signals => "reset signals",
            Step::Session => "setsid",
            Step::CloseFds => "close fds",
            Step::KeepCaps => "keepcaps",
            Step::SetGroups => "setgroups",
            Step::SetGid => "setresgid",
            Step::SetUid => "setresuid",
            Step::WorkingDir => "chdir",
            Step::Capabilities => "capset",
            Step::BoundingSet => "drop bounding set",
            Step::AmbientCapabilities => "raise ambient capabilities",
            Step::NoNewPrivs => "no_new_privs",
            Step::Landlock => "landlock",
            Step::Seccomp => "seccomp",
            Step::Exec => "execve",
        })
    }
}

/// A spawn that failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The error pipe could not be created.
    #[error("cannot create the error pipe")]
    Pipe(#[source] std::io::Error),
    /// fork failed.
    #[error("fork")]
    Fork(#[source] std::io::Error),
    /// The child failed at `step`; it has exited and been reaped.
    #[error("child failed at step {step}")]
    Child {
        /// The step that failed.
        step: Step,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The child reported something unreadable (a bug, or a program that wrote to the pipe).
    #[error("child sent {len} bytes on the error pipe")]
    Protocol {
        /// How many bytes.
        len: usize,
    },
}

impl SpawnError {
    /// The step that failed in the child, if the child got that far.
    pub fn step(&self) -> Option<Step> {
        match self {
            SpawnError::Child { step, .. } => Some(*step),
            _ => None,
        }
    }

    /// The errno of a failed child step.
    pub fn errno(&self) -> Option<i32> {
        match self {
            SpawnError::Child { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A running sandboxed program.
///
/// Dropping it neither kills nor reaps the process: the spawner owns its lifecycle (init reaps
/// every child as PID 1).
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    applied: Applied,
}

impl Child {
    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// What was applied to it.
    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    /// Reads its sandbox back from `/proc` (every thread), with what was applied attached.
    pub fn observe(&self) -> Result<Observed, ObserveError> {
        Ok(observe(self.pid)?.with_applied(self.applied.clone()))
    }

    /// Sends `signal` to it.
    pub fn signal(&self, signal: libc::c_int) -> std::io::Result<()> {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        if unsafe { libc::kill(self.pid, signal) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Waits for it to exit and reaps it (blocking).
    pub fn wait(&self) -> std::io::Result<ExitStatus> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid writes one int through a pointer to a live local.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                return Ok(ExitStatus::from_raw(status));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reaps it if it has exited, without blocking.
    pub fn try_wait(&self) -> std::io::Result<Option<ExitStatus>> {
        let mut status = 0;
        // SAFETY: as in `wait`.
        match unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } {
            0 => Ok(None),
            r if r == self.pid => Ok(Some(ExitStatus::from_raw(status))),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

/// Starts the prepared program in its sandbox.
///
/// Returns once the child has executed the program (the error pipe closed on exec) or failed
/// a step (reported with its errno, the child reaped).
///
/// # Guarantees
/// Between fork and exec the child runs, in this order: reset signals, setsid, close fds,
/// keepcaps, setgroups, setresgid, setresuid, chdir (and umask), capset, bounding set, ambient
/// capabilities, no_new_privs, landlock, seccomp, execve (DESIGN.md §5). The environment is
/// exactly the policy's.
///
/// # Caveats
/// - It blocks until the child has exec'd (a few milliseconds): from async code, call it on a
///   blocking thread.
/// - A process forked meanwhile by other code of the spawner that neither execs nor closes its
///   fds keeps the error pipe open and delays the return until it does.
/// - Do not exec a binary that a thread of the spawner still has open for writing: a child forked
///   meanwhile inherits that fd for a moment and exec fails with ETXTBSY.
pub fn spawn(prepared: &Prepared) -> Result<Child, SpawnError> {
    let (read_end, write_end) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SpawnError::Pipe(e.into()))?;

    // SAFETY: the child branch calls only `child_main`, which never returns and runs only
    // async-signal-safe system calls on memory that was fully built before fork (see the
    // module docs); the parent branch is ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SpawnError::Fork(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        child_main(prepared, write_end.as_raw_fd());
    }
    drop(write_end);

    let mut report = Vec::with_capacity(8);
    let read = std::fs::File::from(read_end).read_to_end(&mut report);
    let child = Child {
        pid,
        applied: prepared.applied.clone(),
    };
    match (read, report.len()) {
        (Ok(_), 0) => Ok(child),
        (Ok(_), 8) => {
            let step_bytes: [u8; 4] = report[..4].try_into().unwrap_or_default();
            let errno_bytes: [u8; 4] = report[4..].try_into().unwrap_or_default();
            let _ = child.wait();
            match Step::from_u32(u32::from_ne_bytes(step_bytes)) {
                Some(step) => Err(SpawnError::Child {
                    step,
                    source: std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno_bytes)),
                }),
                None => Err(SpawnError::Protocol { len: 8 }),
            }
        }
        (Ok(_), len) => {
            let _ = child.signal(libc::SIGKILL);
            let _ = child.wait();
            Err(SpawnError::Protocol { len })
        }
        (Err(e), _) => {
            let _ = child.signal(libc::SIGKILL);
            let _ = child.wait();
            Err(SpawnError::Pipe(e))
        }
    }
}

/// A failed step in the child: what it was and errno.
struct ChildError {
    step: Step,
    errno: i32,
}

/// The child after fork: applies the sandbox and execs, or reports the failed step and exits.
fn child_main(p: &Prepared, report_fd: RawFd) -> ! {
    let landlock_fd = p.landlock_fd.as_ref().map_or(-1, AsRawFd::as_raw_fd);
    // The child's own fds, renumbered by the CloseFds step: [error pipe, landlock ruleset].
    let mut own = [report_fd, landlock_fd];
    let Err(e) = apply_in_child(p, &mut own);
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&(e.step as u32).to_ne_bytes());
    msg[4..].copy_from_slice(&e.errno.to_ne_bytes());
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `msg` is a live local buffer. A
    // short or failed write leaves the parent with a protocol error, which it reports.
    unsafe {
        let _ = libc::write(own[0], msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

/// Runs in the child between fork and exec: async-signal-safe calls only (no allocation,
/// locks or tracing). Each line says why its step is where it is. `own` holds the error pipe
/// and the landlock ruleset fd, which the CloseFds step keeps (close-on-exec) and renumbers.
fn apply_in_child(p: &Prepared, own: &mut [RawFd; 2]) -> Result<Infallible, ChildError> {
    // The spawner's dispositions (Rust ignores SIGPIPE) and mask (tokio) are not the program's.
    reset_signals().at(Step::Signals)?;
    new_session().at(Step::Session)?; // its own process group: init can stop it and its children
    close_fds_except(&p.fd_moves, own).at(Step::CloseFds)?; // nothing of init's leaks
    prctl(libc::PR_SET_KEEPCAPS, 1, 0).at(Step::KeepCaps)?; // else leaving uid 0 clears permitted
    set_groups(&p.groups).at(Step::SetGroups)?; // needs CAP_SETGID: before leaving uid 0
    syscall3(libc::SYS_setresgid, p.gid, p.gid, p.gid).at(Step::SetGid)?; // raw: this thread,
    syscall3(libc::SYS_setresuid, p.uid, p.uid, p.uid).at(Step::SetUid)?; // the only one now
    chdir(p).at(Step::WorkingDir)?; // as the program's uid: it must be allowed in there
    set_umask(p); // the policy's, not init's (umask cannot fail)
    let setup = p.caps.with(caps::Capability::CAP_SETPCAP); // the bounding drop needs it
    capset(setup, p.caps).at(Step::Capabilities)?; // effective was cleared by the uid switch
    drop_bounding_set(p).at(Step::BoundingSet)?; // then gives CAP_SETPCAP up
    raise_ambient(p).at(Step::AmbientCapabilities)?; // the uid switch cleared ambient: so after it
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0).at(Step::NoNewPrivs)?; // unprivileged landlock/seccomp
    restrict_landlock(own[1]).at(Step::Landlock)?; // before seccomp: no landlock_* in allow-lists
    install_seccomp(p).at(Step::Seccomp)?; // last: from here only the program's own calls work
    exec(p).at(Step::Exec) // with the policy's env only (scrubbed); returns only on error
}

/// errno of a failed system call in the child.
type Errno = i32;

trait At<T> {
    fn at(self, step: Step) -> Result<T, ChildError>;
}

impl<T> At<T> for Result<T, Errno> {
    fn at(self, step: Step) -> Result<T, ChildError> {
        self.map_err(|errno| ChildError { step, errno })
    }
}

fn errno() -> Errno {
    nix::errno::Errno::last_raw()
}

/// Maps a C return value (-1 = error) to a result.
fn check(rc: libc::c_long) -> Result<libc::c_long, Errno> {
    if rc == -1 {
        Err(errno())
    } else {
        Ok(rc)
    }
}

fn prctl(option: libc::c_int, arg2: libc::c_ulong, arg3: libc::c_ulong) -> Result<(), Errno> {
    // SAFETY: the prctl options used here take integers only.
    check(unsafe { libc::prctl(option, arg2, arg3, 0 as libc::c_ulong, 0 as libc::c_ulong) }.into())
        .map(drop)
}

fn syscall3(nr: libc::c_long, a: u32, b: u32, c: u32) -> Result<(), Errno> {
    // SAFETY: setresuid/setresgid take three integers.
    check(unsafe { libc::syscall(nr, a, b, c) }).map(drop)
}

fn reset_signals() -> Result<(), Errno> {
    // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask and no flags; sigaction and
    // sigprocmask read/write only these locals. Signals the kernel refuses to change (SIGKILL,
    // SIGSTOP, the two reserved for glibc's threads) fail with EINVAL and are skipped.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=64 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        check(libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()).into()).map(drop)
    }
}

fn new_session() -> Result<(), Errno> {
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() }.into()).map(drop)
}

/// The most fds a child receives: stdio plus the policy's named fds.
const MAX_MOVES: usize = 3 + crate::policy::MAX_NAMED_FDS;

/// Moves each (source, target) into place and closes every other fd but stdio and the
/// child's own fds (`own`, renumbered above every target and kept close-on-exec; -1 = none).
/// Sources may sit on targets: all are first copied above every number in play.
fn close_fds_except(moves: &[(RawFd, RawFd)], own: &mut [RawFd; 2]) -> Result<(), Errno> {
    if moves.len() > MAX_MOVES {
        return Err(libc::E2BIG);
    }
    let base = moves
        .iter()
        .fold(own[0].max(own[1]), |m, (s, t)| m.max(*s).max(*t))
        .max(2)
        + 1;
    for fd in own.iter_mut().filter(|fd| **fd >= 0) {
        *fd = dup_above(*fd, base)?;
    }
    let mut staged = [-1 as RawFd; MAX_MOVES];
    for (slot, (source, _)) in staged.iter_mut().zip(moves) {
        *slot = dup_above(*source, base)?;
    }
    for (staged, (_, target)) in staged.iter().zip(moves) {
        // SAFETY: dup2 takes two integers. It leaves `target` without FD_CLOEXEC: it crosses exec.
        check(unsafe { libc::dup2(*staged, *target) }.into())?;
    }
    // Keep stdio, the targets and the child's own fds; close every gap between them.
    let mut keep = [-1 as RawFd; MAX_MOVES + 5];
    let wanted = [0, 1, 2, own[0], own[1]]
        .into_iter()
        .chain(moves.iter().map(|(_, target)| *target))
        .filter(|fd| *fd >= 0);
    let mut n = 0;
    for (slot, fd) in keep.iter_mut().zip(wanted) {
        *slot = fd;
        n += 1;
    }
    let keep = &mut keep[..n];
    keep.sort_unstable();
    let mut low: libc::c_uint = 0;
    for fd in keep.iter() {
        let fd = *fd as libc::c_uint;
        if fd > low {
            close_range(low, fd - 1)?;
        }
        low = low.max(fd + 1);
    }
    close_range(low, libc::c_uint::MAX)
}

/// A close-on-exec copy of `fd` at the lowest free number from `base` up.
fn dup_above(fd: RawFd, base: RawFd) -> Result<RawFd, Errno> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes two integers.
    let copy = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, base) }.into())?;
    RawFd::try_from(copy).map_err(|_| libc::EBADF)
}

fn close_range(first: libc::c_uint, last: libc::c_uint) -> Result<(), Errno> {
    // SAFETY: close_range takes integers; closing fds nobody in this process uses any more.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) }).map(drop)
}

fn set_groups(groups: &[libc::gid_t]) -> Result<(), Errno> {
    // SAFETY: setgroups reads `groups.len()` gids from a live slice.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) }).map(drop)
}

fn chdir(p: &Prepared) -> Result<(), Errno> {
    // SAFETY: a NUL-terminated string owned by `p`.
    check(unsafe { libc::chdir(p.working_dir.as_ptr()) }.into()).map(drop)
}

fn set_umask(p: &Prepared) {
    // SAFETY: umask takes an integer and cannot fail.
    unsafe { libc::umask(p.umask) };
}

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (linux/capability.h); version 3 takes two: bits 0-31, 32-63.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Sets this thread's permitted and effective sets to `permitted` and inheritable to
/// `inheritable`.
fn capset(permitted: crate::CapSet, inheritable: crate::CapSet) -> Result<(), Errno> {
    let (p, i) = (permitted.bits(), inheritable.bits());
    let half = |bits: u64, high: bool| (if high { bits >> 32 } else { bits & 0xffff_ffff }) as u32;
    let data = [false, true].map(|high| CapData {
        effective: half(p, high),
        permitted: half(p, high),
        inheritable: half(i, high),
    });
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads one header and two data structs from live locals.
    check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) }).map(drop)
}

/// Drops from the bounding set every capability outside the policy, then gives up CAP_SETPCAP
/// unless the policy has it.
fn drop_bounding_set(p: &Prepared) -> Result<(), Errno> {
    for cap in 0..=p.cap_last {
        if !p.caps.contains_index(cap) {
            prctl(libc::PR_CAPBSET_DROP, cap.into(), 0)?;
        }
    }
    capset(p.caps, p.caps)
}

fn raise_ambient(p: &Prepared) -> Result<(), Errno> {
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
    )?;
    for cap in p.caps.indices() {
        prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            cap.into(),
        )?;
    }
    Ok(())
}

fn restrict_landlock(ruleset_fd: RawFd) -> Result<(), Errno> {
    if ruleset_fd < 0 {
        return Ok(()); // the kernel has no landlock; recorded as NotEnforced in `applied`
    }
    // SAFETY: landlock_restrict_self takes an fd (the prepared ruleset, renumbered) and flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            ruleset_fd,
            0 as libc::c_uint,
        )
    })
    .map(drop)
}

/// `struct sock_fprog` over seccompiler's instructions.
#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const seccompiler::sock_filter,
}

fn install_seccomp(p: &Prepared) -> Result<(), Errno> {
    let Some(bpf) = &p.bpf else {
        return Ok(()); // an explicitly unconfined policy; recorded as no filter in `applied`
    };
    // The ENOSYS filter first: it lets `seccomp` through, so the allow-list can follow it.
    if let Some(enosys) = &p.bpf_enosys {
        install_filter(enosys)?;
    }
    install_filter(bpf)
}

fn install_filter(bpf: &seccompiler::BpfProgram) -> Result<(), Errno> {
    let prog = SockFprog {
        len: libc::c_ushort::try_from(bpf.len()).map_err(|_| libc::E2BIG)?,
        filter: bpf.as_ptr(),
    };
    // SAFETY: the kernel copies `prog.len` instructions from memory owned by the caller.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &prog as *const SockFprog,
        )
    })
    .map(drop)
}

fn exec(p: &Prepared) -> Result<Infallible, Errno> {
    // SAFETY: program, argv and envp are NUL-terminated strings and NULL-terminated pointer
    // arrays owned by `p`; execve returns only on failure.
    unsafe { libc::execve(p.program.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr()) };
    Err(errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_and_child_can_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Prepared>();
        send_sync::<Child>();
    }

    #[test]
    fn steps_round_trip_through_the_pipe_encoding() {
        for step in Step::ALL {
            assert_eq!(Step::from_u32(step as u32), Some(step));
        }
        assert_eq!(Step::from_u32(0), None);
    }
}
