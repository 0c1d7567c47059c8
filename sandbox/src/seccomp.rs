//! Seccomp profiles: seccompiler JSON files holding allow-lists, compiled to BPF before fork.
//!
//! A profile is data (one file per daemon, `profiles/<arch>/<daemon>.json`): an object of named
//! filters, each `{"mismatch_action": "kill_process" | {"errno": N}, "match_action": "allow",
//! "filter": [{"syscall": "read"}, {"syscall": "socket", "args": [...], "comment": "why"}]}`,
//! exactly seccompiler's format (its `docs/json_format.md`). Only allow-lists are accepted: the
//! match action must be `allow`, the mismatch action must refuse (kill or errno), and `execve`
//! must be allowed, since the filter is installed before the program is executed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use seccompiler::{BpfProgram, TargetArch};
use serde::{Deserialize, Serialize};

/// The action a filter takes, in seccompiler's JSON spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeccompAction {
    /// The system call runs.
    Allow,
    /// The system call fails with this errno.
    Errno(u32),
    /// The calling thread is killed (SIGSYS).
    KillThread,
    /// The whole process is killed (SIGSYS).
    KillProcess,
    /// The call runs and is logged.
    Log,
    /// A tracer is notified.
    Trace(u32),
    /// SIGSYS is sent to the calling thread.
    Trap,
}

/// A comparison in an argument condition, in seccompiler's JSON spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CmpOp {
    /// `arg == val`
    Eq,
    /// `arg != val`
    Ne,
    /// `arg < val`
    Lt,
    /// `arg <= val`
    Le,
    /// `arg > val`
    Gt,
    /// `arg >= val`
    Ge,
    /// `arg & mask == val`
    MaskedEq(u64),
}

/// Width of the compared argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgLen {
    /// 4 bytes.
    Dword,
    /// 8 bytes.
    Qword,
}

/// One condition on a system call argument.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgCondition {
    /// Argument index, 0 to 5.
    pub index: u8,
    /// Argument width.
    #[serde(rename = "type")]
    pub len: ArgLen,
    /// Comparison.
    pub op: CmpOp,
    /// Value compared with.
    pub val: u64,
    /// Why (e.g. `AF_UNIX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// One entry of a filter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallRule {
    /// The system call name on the profile's architecture.
    pub syscall: String,
    /// Conditions, all of which must hold (none: any arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<ArgCondition>>,
    /// Why the call is needed, for a reviewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// One named filter of a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSpec {
    /// What happens to a call no rule allows.
    #[serde(alias = "default_action")]
    pub mismatch_action: SeccompAction,
    /// What happens to a call a rule matches (`allow` for an allow-list).
    #[serde(alias = "filter_action")]
    pub match_action: SeccompAction,
    /// The rules.
    pub filter: Vec<SyscallRule>,
}

/// A system call an installed filter lets through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedSyscall {
    /// Its name.
    pub name: String,
    /// Alternative argument conditions (each a conjunction); empty: allowed with any arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only_if: Vec<Vec<ArgCondition>>,
}

impl AllowedSyscall {
    /// True when the call is allowed whatever its arguments.
    pub fn unconditional(&self) -> bool {
        self.only_if.is_empty()
    }
}

/// What seccomp filter the spawner installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeccompApplied {
    /// The profile file (with `{arch}` resolved).
    pub profile: PathBuf,
    /// The filter's name in it.
    pub filter: String,
    /// The architecture it was compiled for; seccompiler's program kills any other.
    pub arch: String,
    /// What happens to a call outside the allow-list.
    pub default_action: SeccompAction,
    /// Length of the BPF program in instructions.
    pub instructions: usize,
    /// The allow-list, sorted by name.
    pub allowed: Vec<AllowedSyscall>,
    /// Calls a second filter, stacked before the allow-list, fails with ENOSYS whatever the
    /// allow-list says ([`ENOSYS_CALLS`]): they run in no form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enosys: Vec<String>,
}

impl SeccompApplied {
    /// The entry for `name`, if the filters let it run in any form.
    pub fn allows(&self, name: &str) -> Option<&AllowedSyscall> {
        if self.enosys.iter().any(|n| n == name) {
            return None;
        }
        self.allowed.iter().find(|a| a.name == name)
    }
}

/// Calls that every confined process gets ENOSYS for, from a filter stacked before its
/// allow-list: `clone3` passes its flags in a struct that seccomp cannot read, so allowing it
/// would let a thread create namespaces whatever the allow-list says about `clone`. glibc
/// falls back to `clone` on ENOSYS, whose flags the allow-list can restrict (as Docker's and
/// systemd's profiles do).
pub const ENOSYS_CALLS: &[(&str, i64)] = &[("clone3", libc::SYS_clone3)];

/// The filter stacked before an allow-list: [`ENOSYS_CALLS`] fail with ENOSYS, every other call
/// goes on to the allow-list (the kernel applies the strictest answer of all filters).
pub fn enosys_filter() -> Result<BpfProgram, SeccompError> {
    let arch_name = std::env::consts::ARCH;
    let arch =
        TargetArch::try_from(arch_name).map_err(|_| SeccompError::Arch { arch: arch_name })?;
    let rules = ENOSYS_CALLS.iter().map(|(_, nr)| (*nr, vec![])).collect();
    let filter = seccompiler::SeccompFilter::new(
        rules,
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| SeccompError::Builtin(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| SeccompError::Builtin(e.to_string()))
}

/// A profile that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The file cannot be read.
    #[error("seccomp profile {path:?} cannot be read")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid profile.
    #[error("seccomp profile {path:?} is not a valid seccompiler JSON profile")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The file has no filter of that name.
    #[error("seccomp profile {path:?} has no filter {filter:?}")]
    NoFilter {
        /// The file.
        path: PathBuf,
        /// The missing name.
        filter: String,
    },
    /// The filter is not an allow-list that refuses everything else.
    #[error("seccomp filter {filter:?} in {path:?} is not an allow-list: match action {match_action:?}, mismatch action {mismatch_action:?}")]
    NotAnAllowList {
        /// The file.
        path: PathBuf,
        /// The filter.
        filter: String,
        /// Its match action (must be allow).
        match_action: SeccompAction,
        /// Its mismatch action (must be kill_process, kill_thread, trap or errno).
        mismatch_action: SeccompAction,
    },
    /// `execve` is not allowed: the program could not even be started.
    #[error("seccomp filter {filter:?} in {path:?} does not allow execve, which runs after the filter is installed")]
    NoExecve {
        /// The file.
        path: PathBuf,
        /// The filter.
        filter: String,
    },
    /// The built-in ENOSYS filter does not compile (a bug).
    #[error("seccomp: the built-in ENOSYS filter: {0}")]
    Builtin(String),
    /// The running architecture has no seccompiler support.
    #[error("seccomp: architecture {arch} is not supported by seccompiler")]
    Arch {
        /// The architecture.
        arch: &'static str,
    },
    /// seccompiler refused the filter (an unknown system call name, a bad condition).
    #[error("seccomp filter {filter:?} in {path:?} does not compile")]
    Compile {
        /// The file.
        path: PathBuf,
        /// The filter.
        filter: String,
        /// Why.
        #[source]
        source: seccompiler::Error,
    },
}

/// Reads, checks and compiles one filter of a profile for the running architecture.
pub fn compile(path: &Path, filter: &str) -> Result<(BpfProgram, SeccompApplied), SeccompError> {
    let bytes = std::fs::read(path).map_err(|source| SeccompError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    compile_bytes(path, &bytes, filter)
}

/// [`compile`] on bytes already read; `path` is only for messages and the record.
pub fn compile_bytes(
    path: &Path,
    bytes: &[u8],
    filter: &str,
) -> Result<(BpfProgram, SeccompApplied), SeccompError> {
    let specs: BTreeMap<String, FilterSpec> =
        serde_json::from_slice(bytes).map_err(|source| SeccompError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    let spec = specs.get(filter).ok_or_else(|| SeccompError::NoFilter {
        path: path.to_path_buf(),
        filter: filter.to_string(),
    })?;
    let refuses = matches!(
        spec.mismatch_action,
        SeccompAction::KillProcess
            | SeccompAction::KillThread
            | SeccompAction::Trap
            | SeccompAction::Errno(_)
    );
    if spec.match_action != SeccompAction::Allow || !refuses {
        return Err(SeccompError::NotAnAllowList {
            path: path.to_path_buf(),
            filter: filter.to_string(),
            match_action: spec.match_action,
            mismatch_action: spec.mismatch_action,
        });
    }
    let allowed = allow_list(spec);
    if !allowed
        .iter()
        .any(|a| a.name == "execve" && a.unconditional())
    {
        return Err(SeccompError::NoExecve {
            path: path.to_path_buf(),
            filter: filter.to_string(),
        });
    }
    let arch_name = std::env::consts::ARCH;
    let arch =
        TargetArch::try_from(arch_name).map_err(|_| SeccompError::Arch { arch: arch_name })?;
    let compile_error = |source| SeccompError::Compile {
        path: path.to_path_buf(),
        filter: filter.to_string(),
        source,
    };
    let mut programs = seccompiler::compile_from_json(bytes, arch).map_err(compile_error)?;
    let program = programs
        .remove(filter)
        .ok_or_else(|| SeccompError::NoFilter {
            path: path.to_path_buf(),
            filter: filter.to_string(),
        })?;
    let applied = SeccompApplied {
        profile: path.to_path_buf(),
        filter: filter.to_string(),
        arch: arch_name.to_string(),
        default_action: spec.mismatch_action,
        instructions: program.len(),
        allowed,
        enosys: ENOSYS_CALLS.iter().map(|(n, _)| n.to_string()).collect(),
    };
    Ok((program, applied))
}

/// The allow-list of a filter, one entry per system call, with the argument alternatives
/// merged (an entry without conditions makes the call unconditional).
fn allow_list(spec: &FilterSpec) -> Vec<AllowedSyscall> {
    let mut by_name: BTreeMap<&str, Option<Vec<Vec<ArgCondition>>>> = BTreeMap::new();
    for rule in &spec.filter {
        let entry = by_name
            .entry(rule.syscall.as_str())
            .or_insert_with(|| Some(Vec::new()));
        match (&rule.args, entry.as_mut()) {
            (Some(args), Some(alternatives)) if !args.is_empty() => alternatives.push(args.clone()),
            _ => *entry = None,
        }
    }
    by_name
        .into_iter()
        .map(|(name, only_if)| AllowedSyscall {
            name: name.to_string(),
            only_if: only_if.unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROFILE: &str = r#"{
        "main": {
            "mismatch_action": "kill_process",
            "match_action": "allow",
            "filter": [
                {"syscall": "execve"},
                {"syscall": "exit_group"},
                {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1, "comment": "AF_UNIX"}]},
                {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 16, "comment": "AF_NETLINK"}]},
                {"syscall": "clone", "comment": "threads", "args": [{"index": 0, "type": "qword", "op": {"masked_eq": 2114060288}, "val": 0}]}
            ]
        },
        "errno": {"mismatch_action": {"errno": 1}, "match_action": "allow", "filter": [{"syscall": "execve"}]},
        "denylist": {"mismatch_action": "allow", "match_action": "kill_process", "filter": [{"syscall": "ptrace"}]},
        "noexec": {"mismatch_action": "kill_process", "match_action": "allow", "filter": [{"syscall": "read"}]}
    }"#;

    fn compile_str(filter: &str) -> Result<(BpfProgram, SeccompApplied), SeccompError> {
        compile_bytes(Path::new("test.json"), PROFILE.as_bytes(), filter)
    }

    #[test]
    fn compiles_an_allow_list_and_records_it() {
        let (program, applied) = compile_str("main").unwrap();
        assert!(!program.is_empty());
        assert_eq!(applied.instructions, program.len());
        assert_eq!(applied.default_action, SeccompAction::KillProcess);
        let names: Vec<_> = applied.allowed.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["clone", "execve", "exit_group", "socket"]);
        let socket = applied.allows("socket").unwrap();
        assert_eq!(socket.only_if.len(), 2);
        assert!(applied.allows("execve").unwrap().unconditional());
        let (_, errno) = compile_str("errno").unwrap();
        assert_eq!(errno.default_action, SeccompAction::Errno(1));
    }

    #[test]
    fn refuses_what_is_not_a_usable_allow_list() {
        assert!(matches!(
            compile_str("denylist"),
            Err(SeccompError::NotAnAllowList { .. })
        ));
        assert!(matches!(
            compile_str("noexec"),
            Err(SeccompError::NoExecve { .. })
        ));
        // seccompiler compiles the whole file: an unknown name anywhere fails it.
        let typo = r#"{"typo": {"mismatch_action": "kill_process", "match_action": "allow",
            "filter": [{"syscall": "execve"}, {"syscall": "no_such_call"}]}}"#;
        assert!(matches!(
            compile_bytes(Path::new("typo.json"), typo.as_bytes(), "typo"),
            Err(SeccompError::Compile { .. })
        ));
        assert!(matches!(
            compile_str("absent"),
            Err(SeccompError::NoFilter { .. })
        ));
        assert!(matches!(
            compile_bytes(Path::new("x"), b"{", "main"),
            Err(SeccompError::Parse { .. })
        ));
    }
}
