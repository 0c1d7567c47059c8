//! What the kernel says about a running program: `/proc/<pid>/task/<tid>/status` of every
//! thread (capabilities, no_new_privs and seccomp are per thread, so one thread's state proves
//! nothing about the others).
//!
//! Landlock has no `/proc` field. [`Observed`] therefore carries the kernel's landlock ABI (read
//! by the observer) and, when the observer is the spawner, what it applied
//! ([`Observed::with_applied`]); the audit marks landlock as not assessed without the latter.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::capset::CapSet;
use crate::prepare::Applied;

/// The four ids of one kind (`Uid:` or `Gid:` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ids {
    /// Real.
    pub real: u32,
    /// Effective.
    pub effective: u32,
    /// Saved set.
    pub saved: u32,
    /// Filesystem.
    pub fs: u32,
}

impl Ids {
    /// The four ids in `/proc` order.
    pub fn all(&self) -> [u32; 4] {
        [self.real, self.effective, self.saved, self.fs]
    }
}

/// The seccomp mode of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SeccompMode {
    /// 0: no seccomp.
    Disabled,
    /// 1: strict mode (read, write, exit, sigreturn only).
    Strict,
    /// 2: BPF filters.
    Filter,
}

/// The security state of one thread, as `/proc/<pid>/task/<tid>/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThreadStatus {
    /// Thread id.
    pub tid: i32,
    /// The thread's name (`comm`).
    pub name: String,
    /// File mode creation mask.
    pub umask: Option<u32>,
    /// uids.
    pub uid: Ids,
    /// gids.
    pub gid: Ids,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// `CapInh`.
    pub cap_inheritable: CapSet,
    /// `CapPrm`.
    pub cap_permitted: CapSet,
    /// `CapEff`.
    pub cap_effective: CapSet,
    /// `CapBnd`.
    pub cap_bounding: CapSet,
    /// `CapAmb`.
    pub cap_ambient: CapSet,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp`.
    pub seccomp: SeccompMode,
    /// `Seccomp_filters`: how many filters are stacked on the thread.
    pub seccomp_filters: u32,
}

/// The observed sandbox of one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Observed {
    /// Process id.
    pub pid: i32,
    /// Every thread, by tid.
    pub threads: Vec<ThreadStatus>,
    /// The running kernel's landlock ABI (0: none), probed by the observer.
    pub landlock_kernel_abi: u32,
    /// What the spawner applied, which `/proc` cannot show (landlock, the seccomp allow-list);
    /// `None` when observing a process this code did not spawn.
    pub applied: Option<Applied>,
    /// Whether the process is dumpable, as /proc shows it: the kernel gives a non-dumpable
    /// process's `/proc/<pid>` files to root. `None` for a process running as root (its files
    /// are root's either way).
    pub dumpable: Option<bool>,
}

impl Observed {
    /// Attaches what the spawner applied.
    #[must_use]
    pub fn with_applied(mut self, applied: Applied) -> Observed {
        self.applied = Some(applied);
        self
    }

    /// The union of one capability set over every thread.
    pub fn union_of(&self, set: impl Fn(&ThreadStatus) -> CapSet) -> CapSet {
        self.threads.iter().map(set).collect()
    }

    /// True when `check` holds for every thread (and there is at least one).
    pub fn every_thread(&self, check: impl Fn(&ThreadStatus) -> bool) -> bool {
        !self.threads.is_empty() && self.threads.iter().all(check)
    }
}

/// A process that cannot be observed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// `/proc/<pid>/task` cannot be listed (no such process, or no permission).
    #[error("cannot list the threads of pid {pid}")]
    Tasks {
        /// The pid.
        pid: i32,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A status file lacks a field or holds a value this parser does not understand.
    #[error("/proc/{pid}/task/{tid}/status: field {field} missing or malformed")]
    Field {
        /// The pid.
        pid: i32,
        /// The thread.
        tid: i32,
        /// The field.
        field: &'static str,
    },
    /// Every thread exited while being read.
    #[error("pid {pid} has no threads left")]
    Gone {
        /// The pid.
        pid: i32,
    },
}

/// Reads the status of every thread of `pid`. Threads that exit while being read are skipped.
pub fn observe(pid: i32) -> Result<Observed, ObserveError> {
    observe_in(Path::new("/proc"), pid)
}

/// [`observe`] under another procfs mount (e.g. a node's in container mode).
pub fn observe_in(proc_root: &Path, pid: i32) -> Result<Observed, ObserveError> {
    let task_dir = proc_root.join(pid.to_string()).join("task");
    let tasks_error = |source| ObserveError::Tasks { pid, source };
    let mut tids: Vec<i32> = std::fs::read_dir(&task_dir)
        .map_err(tasks_error)?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    let mut threads = Vec::with_capacity(tids.len());
    for tid in tids {
        let Ok(text) = std::fs::read_to_string(task_dir.join(tid.to_string()).join("status"))
        else {
            continue; // the thread exited since the listing
        };
        threads.push(
            parse_status(tid, &text).map_err(|field| ObserveError::Field { pid, tid, field })?,
        );
    }
    if threads.is_empty() {
        return Err(ObserveError::Gone { pid });
    }
    let euid = threads[0].uid.effective;
    let dumpable = if euid == 0 {
        None
    } else {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(proc_root.join(pid.to_string()).join("environ"))
            .ok()
            .map(|m| m.uid() == euid)
    };
    Ok(Observed {
        pid,
        threads,
        landlock_kernel_abi: crate::landlock::kernel_abi(),
        applied: None,
        dumpable,
    })
}

/// Parses one status file; the error names the missing or malformed field.
pub fn parse_status(tid: i32, text: &str) -> Result<ThreadStatus, &'static str> {
    let field = |name: &'static str| -> Result<&str, &'static str> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .ok_or(name)
    };
    let ids = |name: &'static str| -> Result<Ids, &'static str> {
        let v: Vec<u32> = field(name)?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| name)?;
        match v[..] {
            [real, effective, saved, fs] => Ok(Ids {
                real,
                effective,
                saved,
                fs,
            }),
            _ => Err(name),
        }
    };
    let caps = |name: &'static str| field(name).and_then(|v| CapSet::from_hex(v).ok_or(name));
    let number = |name: &'static str| field(name).and_then(|v| v.parse::<u32>().map_err(|_| name));
    Ok(ThreadStatus {
        tid,
        name: field("Name").unwrap_or_default().to_string(),
        umask: field("Umask")
            .ok()
            .and_then(|v| u32::from_str_radix(v, 8).ok()),
        uid: ids("Uid")?,
        gid: ids("Gid")?,
        groups: field("Groups")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| "Groups")?,
        cap_inheritable: caps("CapInh")?,
        cap_permitted: caps("CapPrm")?,
        cap_effective: caps("CapEff")?,
        cap_bounding: caps("CapBnd")?,
        cap_ambient: caps("CapAmb")?,
        no_new_privs: number("NoNewPrivs")? == 1,
        seccomp: match number("Seccomp")? {
            0 => SeccompMode::Disabled,
            1 => SeccompMode::Strict,
            2 => SeccompMode::Filter,
            _ => return Err("Seccomp"),
        },
        // Absent before Linux 5.9: no filter count known, report 0.
        seccomp_filters: number("Seccomp_filters").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str =
        "Name:\tsandbox-probe\nUmask:\t0077\nState:\tS (sleeping)\nTgid:\t42\nPid:\t43\n\
        Uid:\t1001\t1001\t1001\t1001\nGid:\t1002\t1002\t1002\t1002\nGroups:\t\n\
        CapInh:\t0000000000001000\nCapPrm:\t0000000000001000\nCapEff:\t0000000000001000\n\
        CapBnd:\t0000000000001000\nCapAmb:\t0000000000001000\nNoNewPrivs:\t1\n\
        Seccomp:\t2\nSeccomp_filters:\t1\nSpeculation_Store_Bypass:\tthread vulnerable\n";

    #[test]
    fn parses_a_sandboxed_thread() {
        let t = parse_status(43, STATUS).unwrap();
        assert_eq!(t.name, "sandbox-probe");
        assert_eq!(t.umask, Some(0o077));
        assert_eq!(t.uid.all(), [1001; 4]);
        assert_eq!(t.gid.effective, 1002);
        assert!(t.groups.is_empty());
        assert_eq!(t.cap_effective.names(), ["CAP_NET_ADMIN"]);
        assert_eq!(t.cap_ambient, t.cap_bounding);
        assert!(t.no_new_privs);
        assert_eq!(t.seccomp, SeccompMode::Filter);
        assert_eq!(t.seccomp_filters, 1);
    }

    #[test]
    fn names_the_broken_field() {
        assert_eq!(
            parse_status(1, &STATUS.replace("Seccomp:\t2", "Seccomp:\t7")),
            Err("Seccomp")
        );
        assert_eq!(
            parse_status(1, &STATUS.replace("Uid:", "Uuid:")),
            Err("Uid")
        );
        assert_eq!(
            parse_status(
                1,
                &STATUS.replace("0000000000001000\nCapPrm", "xyz\nCapPrm")
            ),
            Err("CapInh")
        );
    }

    #[test]
    fn observes_this_test_process_on_every_thread() {
        let helper =
            std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(300)));
        let pid = i32::try_from(std::process::id()).unwrap();
        let observed = observe(pid).unwrap();
        assert!(observed.threads.len() >= 2, "{:?}", observed.threads.len());
        assert!(observed.threads.iter().any(|t| t.tid == pid));
        helper.join().unwrap();
        assert!(matches!(observe(-5), Err(ObserveError::Tasks { .. })));
    }
}
