//! The exposure score, on the `systemd-analyze security` model, computed from what the kernel
//! says ([`Observed`]) and not from what a manifest says.
//!
//! Model (systemd `src/analyze/analyze-security.c`): each check has a weight and a range and
//! yields a badness `b` in `0..=range`, or N/A (left out of both sums).
//! `exposure = ceil(100 · Σ ceil(b·weight/range) / Σ weight)`, an integer 0–100 shown as
//! `exposure / 10` with one decimal; levels: ≥100 DANGEROUS, ≥90 UNSAFE, ≥75 EXPOSED, ≥50
//! MEDIUM, ≥10 OK, ≥1 SAFE, 0 PERFECT. A row shows `ceil(ceil(b·w·100/range) / Σ weight)`.
//!
//! Checks taken from systemd, with its weights, ranges and `json_field` ids, where our sandbox
//! has the mechanism: `UserOrDynamicUser`, `SupplementaryGroups`, the 28
//! `CapabilityBoundingSet_*` checks (on the union of the bounding and permitted sets of every
//! thread), `AmbientCapabilities`, `NoNewPrivileges`, `UMask`, `SystemCallArchitectures`, the
//! 11 `SystemCallFilter_*` groups, `RestrictAddressFamilies_*` and `RestrictNamespaces_*`
//! (both read from the seccomp allow-list: `socket`'s family argument; `unshare`, `setns`,
//! `clone3`, `clone`'s flags), `LockPersonality` and `RestrictRealtime` (also from the
//! allow-list).
//!
//! Not assessed, because talos-rs has no equivalent mechanism (so the score is comparable with
//! systemd's only on the checks above): PrivateNetwork, PrivateTmp, PrivateDevices,
//! PrivateMounts, PrivateUsers, Protect{ControlGroups, KernelModules, KernelTunables,
//! KernelLogs, Clock, Home, System, Hostname, Proc}, ProcSubset, RootDirectory, KeyringMode,
//! NotifyAccess, RemoveIPC, Delegate, RestrictSUIDSGID, MemoryDenyWriteExecute, IPAddressDeny,
//! DeviceAllow.
//!
//! Our own checks (ids prefixed `Talos`): landlock filesystem, network and scopes coverage (from
//! what the spawner applied and the kernel ABI, since `/proc` has no landlock field), and IPC
//! reach through `stated` (admin identity, sensitive namespaces written or read, read-all).

use serde::{Deserialize, Serialize};

use crate::capset::CapSet;
use crate::landlock::{LandlockApplied, LandlockEnforcement};
use crate::observe::{Observed, SeccompMode};
use crate::policy::PathAccess;
use crate::seccomp::{AllowedSyscall, CmpOp, SeccompApplied};

/// The overall level, systemd's names and thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    /// 0.
    Perfect,
    /// 0.1–0.9.
    Safe,
    /// 1.0–4.9.
    Ok,
    /// 5.0–7.4.
    Medium,
    /// 7.5–8.9.
    Exposed,
    /// 9.0–9.9.
    Unsafe,
    /// 10.0.
    Dangerous,
}

impl Level {
    /// The level of an exposure (0–100).
    pub fn of(exposure: u64) -> Level {
        match exposure {
            100.. => Level::Dangerous,
            90.. => Level::Unsafe,
            75.. => Level::Exposed,
            50.. => Level::Medium,
            10.. => Level::Ok,
            1.. => Level::Safe,
            0 => Level::Perfect,
        }
    }

    /// systemd's spelling (`OK`, `UNSAFE`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Perfect => "PERFECT",
            Level::Safe => "SAFE",
            Level::Ok => "OK",
            Level::Medium => "MEDIUM",
            Level::Exposed => "EXPOSED",
            Level::Unsafe => "UNSAFE",
            Level::Dangerous => "DANGEROUS",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a check comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Origin {
    /// systemd's table, same weight, range and id.
    Systemd,
    /// Our own (landlock, IPC reach).
    Talos,
}

/// One assessed check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Check {
    /// Stable id (systemd's `json_field` for systemd checks).
    pub id: String,
    /// Where it comes from.
    pub origin: Origin,
    /// Weight.
    pub weight: u64,
    /// Range of the badness.
    pub range: u64,
    /// Badness in `0..=range`; `None`: not applicable (left out of the score).
    pub badness: Option<u64>,
    /// The row's share of the exposure in tenths (systemd's column), `None` when 0 or N/A.
    pub exposure: Option<u64>,
    /// What was found.
    pub description: String,
}

impl Check {
    /// True when the check passed (badness 0).
    pub fn good(&self) -> bool {
        self.badness == Some(0)
    }
}

/// The exposure of one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exposure {
    /// 0–100; shown as `exposure / 10` with one decimal.
    pub exposure: u64,
    /// The level.
    pub level: Level,
    /// Every check, sorted by weight (heaviest first) then id.
    pub checks: Vec<Check>,
}

impl Exposure {
    /// `9.6 UNSAFE`, as systemd prints it.
    pub fn summary(&self) -> String {
        format!(
            "{}.{} {}",
            self.exposure / 10,
            self.exposure % 10,
            self.level
        )
    }
}

/// Which `stated` namespaces a process may reach (from the manifest that `stated` enforces).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpcReach {
    /// Namespaces it writes.
    pub writes: Vec<String>,
    /// Namespaces it may read besides those it writes; `*` means every namespace.
    pub reads: Vec<String>,
    /// The sensitive namespaces of the node (e.g. `secrets`, `config`).
    pub sensitive: Vec<String>,
}

/// One row before scoring: (id, origin, weight, range, badness, description).
struct Row {
    id: String,
    origin: Origin,
    weight: u64,
    range: u64,
    badness: Option<u64>,
    description: String,
}

fn row(id: &str, weight: u64, range: u64, badness: Option<u64>, description: &str) -> Row {
    Row {
        id: id.to_string(),
        origin: if id.starts_with("Talos") {
            Origin::Talos
        } else {
            Origin::Systemd
        },
        weight,
        range,
        badness: badness.map(|b| b.min(range)),
        description: description.to_string(),
    }
}

fn bool_row(id: &str, weight: u64, bad: Option<bool>, good: &str, bad_text: &str) -> Row {
    let description = match bad {
        Some(true) => bad_text,
        Some(false) => good,
        None => "not assessed",
    };
    row(id, weight, 1, bad.map(u64::from), description)
}

/// systemd's arithmetic over the rows.
fn assess(rows: Vec<Row>) -> Exposure {
    let div_ceil = |a: u64, b: u64| a.div_ceil(b.max(1));
    let (badness_sum, weight_sum) = rows
        .iter()
        .filter_map(|r| Some((div_ceil(r.badness? * r.weight, r.range), r.weight)))
        .fold((0, 0), |(b, w), (rb, rw)| (b + rb, w + rw));
    let exposure = div_ceil(badness_sum * 100, weight_sum);
    let mut checks: Vec<Check> = rows
        .into_iter()
        .map(|r| Check {
            exposure: r
                .badness
                .filter(|b| *b > 0)
                .map(|b| div_ceil(div_ceil(b * r.weight * 100, r.range), weight_sum)),
            id: r.id,
            origin: r.origin,
            weight: r.weight,
            range: r.range,
            badness: r.badness,
            description: r.description,
        })
        .collect();
    checks.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.id.cmp(&b.id)));
    Exposure {
        exposure,
        level: Level::of(exposure),
        checks,
    }
}

/// systemd's capability checks: (json_field, weight, capability numbers).
const CAPABILITY_CHECKS: &[(&str, u64, &[u8])] = &[
    ("CapabilityBoundingSet_CAP_SYS_ADMIN", 1500, &[21]),
    (
        "CapabilityBoundingSet_CAP_SET_UID_GID_PCAP",
        1500,
        &[7, 6, 8],
    ),
    ("CapabilityBoundingSet_CAP_SYS_PTRACE", 1500, &[19]),
    ("CapabilityBoundingSet_CAP_SYS_TIME", 1000, &[25]),
    ("CapabilityBoundingSet_CAP_NET_ADMIN", 1000, &[12]),
    ("CapabilityBoundingSet_CAP_SYS_RAWIO", 1000, &[17]),
    ("CapabilityBoundingSet_CAP_SYS_MODULE", 1000, &[16]),
    ("CapabilityBoundingSet_CAP_AUDIT", 500, &[30, 37, 29]),
    ("CapabilityBoundingSet_CAP_SYSLOG", 500, &[34]),
    (
        "CapabilityBoundingSet_CAP_SYS_NICE_RESOURCE",
        500,
        &[23, 24],
    ),
    ("CapabilityBoundingSet_CAP_MKNOD", 500, &[27]),
    (
        "CapabilityBoundingSet_CAP_CHOWN_FSETID_SETFCAP",
        1000,
        &[0, 4, 31],
    ),
    (
        "CapabilityBoundingSet_CAP_DAC_FOWNER_IPC_OWNER",
        1000,
        &[1, 2, 3, 15],
    ),
    ("CapabilityBoundingSet_CAP_KILL", 500, &[5]),
    // systemd's json_field carries a stray ")" here; we spell it without.
    (
        "CapabilityBoundingSet_CAP_NET_BIND_SERVICE_BROADCAST_RAW",
        500,
        &[10, 11, 13],
    ),
    ("CapabilityBoundingSet_CAP_SYS_BOOT", 100, &[22]),
    ("CapabilityBoundingSet_CAP_MAC", 100, &[33, 32]),
    ("CapabilityBoundingSet_CAP_LINUX_IMMUTABLE", 75, &[9]),
    ("CapabilityBoundingSet_CAP_IPC_LOCK", 50, &[14]),
    ("CapabilityBoundingSet_CAP_SYS_CHROOT", 50, &[18]),
    ("CapabilityBoundingSet_CAP_BLOCK_SUSPEND", 25, &[36]),
    ("CapabilityBoundingSet_CAP_WAKE_ALARM", 25, &[35]),
    ("CapabilityBoundingSet_CAP_LEASE", 25, &[28]),
    ("CapabilityBoundingSet_CAP_SYS_TTY_CONFIG", 25, &[26]),
    ("CapabilityBoundingSet_CAP_SYS_PACCT", 25, &[20]),
    ("CapabilityBoundingSet_CAP_BPF", 25, &[39]),
];

/// systemd's system call groups (seccomp-util.c), as far as `SystemCallFilter_*` checks use them.
const SWAP: &[&str] = &["swapoff", "swapon"];
const CLOCK: &[&str] = &[
    "adjtimex",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_settime",
    "clock_settime64",
    "settimeofday",
];
const CPU_EMULATION: &[&str] = &[
    "modify_ldt",
    "subpage_prot",
    "switch_endian",
    "vm86",
    "vm86old",
];
const DEBUG: &[&str] = &[
    "lookup_dcookie",
    "perf_event_open",
    "pidfd_getfd",
    "ptrace",
    "rtas",
    "sys_debug_setcontext",
];
const MODULE: &[&str] = &["delete_module", "finit_module", "init_module"];
const MOUNT: &[&str] = &[
    "chroot",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "pivot_root",
    "umount",
    "umount2",
];
const OBSOLETE: &[&str] = &[
    "_sysctl",
    "afs_syscall",
    "bdflush",
    "break",
    "create_module",
    "ftime",
    "get_kernel_syms",
    "getpmsg",
    "gtty",
    "idle",
    "lock",
    "mpx",
    "prof",
    "profil",
    "putpmsg",
    "query_module",
    "security",
    "sgetmask",
    "ssetmask",
    "stime",
    "stty",
    "sysfs",
    "tuxcall",
    "ulimit",
    "uselib",
    "ustat",
    "vserver",
];
const RAW_IO: &[&str] = &[
    "ioperm",
    "iopl",
    "pciconfig_iobase",
    "pciconfig_read",
    "pciconfig_write",
];
const REBOOT: &[&str] = &["kexec_file_load", "kexec_load", "reboot"];
const RESOURCES: &[&str] = &[
    "ioprio_set",
    "mbind",
    "migrate_pages",
    "move_pages",
    "nice",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "set_mempolicy",
    "setpriority",
    "setrlimit",
];
const CHOWN: &[&str] = &[
    "chown", "chown32", "fchown", "fchown32", "fchownat", "lchown", "lchown32",
];
const PRIVILEGED_OWN: &[&str] = &[
    "_sysctl",
    "acct",
    "bpf",
    "capset",
    "chroot",
    "fanotify_init",
    "fanotify_mark",
    "nfsservctl",
    "open_by_handle_at",
    "pivot_root",
    "quotactl",
    "setdomainname",
    "setfsuid",
    "setfsuid32",
    "setgroups",
    "setgroups32",
    "sethostname",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setuid",
    "setuid32",
    "vhangup",
];
/// @privileged = @chown @clock @module @raw-io @reboot @swap + its own calls.
const PRIVILEGED: &[&[&str]] = &[CHOWN, CLOCK, MODULE, RAW_IO, REBOOT, SWAP, PRIVILEGED_OWN];

/// (json_field, weight, group).
const SYSCALL_FILTER_CHECKS: &[(&str, u64, &[&[&str]])] = &[
    ("SystemCallFilter_swap", 1000, &[SWAP]),
    ("SystemCallFilter_obsolete", 250, &[OBSOLETE]),
    ("SystemCallFilter_clock", 1000, &[CLOCK]),
    ("SystemCallFilter_cpu_emulation", 250, &[CPU_EMULATION]),
    ("SystemCallFilter_debug", 1000, &[DEBUG]),
    ("SystemCallFilter_mount", 1000, &[MOUNT]),
    ("SystemCallFilter_module", 1000, &[MODULE]),
    ("SystemCallFilter_raw_io", 1000, &[RAW_IO]),
    ("SystemCallFilter_reboot", 1000, &[REBOOT]),
    ("SystemCallFilter_privileged", 700, PRIVILEGED),
    ("SystemCallFilter_resources", 700, &[RESOURCES]),
];

/// (json_field, weight, CLONE_NEW* flag).
const NAMESPACE_CHECKS: &[(&str, u64, u64)] = &[
    ("RestrictNamespaces_user", 1500, 0x1000_0000),
    ("RestrictNamespaces_mnt", 500, 0x0002_0000),
    ("RestrictNamespaces_ipc", 500, 0x0800_0000),
    ("RestrictNamespaces_pid", 500, 0x2000_0000),
    ("RestrictNamespaces_cgroup", 500, 0x0200_0000),
    ("RestrictNamespaces_net", 500, 0x4000_0000),
    ("RestrictNamespaces_uts", 100, 0x0400_0000),
];

/// Address families systemd checks by name: AF_UNIX 1, AF_INET 2, AF_INET6 10, AF_NETLINK 16,
/// AF_PACKET 17; anything else is "other".
const NAMED_FAMILIES: [u64; 5] = [1, 2, 10, 16, 17];

/// Whether an address family number belongs to a check.
type FamilyTest = fn(u64) -> bool;

/// The seccomp filter every thread runs, as far as it is known.
enum Filter<'a> {
    /// Some thread has no filter.
    None,
    /// Every thread is filtered, but not by a filter whose allow-list we know.
    Unknown,
    /// Every thread is filtered, and this is the allow-list installed.
    Known(&'a SeccompApplied),
}

/// Which address families `socket` may create.
enum Families {
    All,
    Only(Vec<u64>),
}

impl Families {
    fn of(filter: &SeccompApplied) -> Families {
        let Some(socket) = filter.allows("socket") else {
            return Families::Only(Vec::new());
        };
        if socket.unconditional() {
            return Families::All;
        }
        let mut families = Vec::new();
        for alternative in &socket.only_if {
            match alternative
                .iter()
                .find(|c| c.index == 0 && c.op == CmpOp::Eq)
            {
                Some(c) => families.push(c.val),
                None => return Families::All,
            }
        }
        Families::Only(families)
    }

    fn allows(&self, wanted: impl Fn(u64) -> bool) -> bool {
        match self {
            Families::All => true,
            Families::Only(list) => list.iter().any(|f| wanted(*f)),
        }
    }
}

/// True when `call` may pass `flag` in argument 0 under the allow-list entry.
fn may_pass_flag(call: &AllowedSyscall, flag: u64) -> bool {
    call.unconditional()
        || call.only_if.iter().any(|alternative| {
            !alternative.iter().any(|c| {
            c.index == 0
                && matches!(c.op, CmpOp::MaskedEq(mask) if mask & flag != 0 && c.val & flag == 0)
        })
        })
}

/// Scores a process from its observed state. `reach` is what `stated` lets it read and write
/// (`None`: the IPC checks are not assessed, except the admin identity, which /proc shows).
pub fn score(observed: &Observed, reach: Option<&IpcReach>) -> Exposure {
    let applied = observed.applied.as_ref();
    let mut rows = Vec::new();

    // Identity.
    let uids: Vec<u32> = observed.threads.iter().flat_map(|t| t.uid.all()).collect();
    let root = uids.is_empty() || uids.contains(&0);
    let (user, user_text) = if root {
        (10, "runs as root (uid 0 in some thread)")
    } else if uids.contains(&65534) {
        (9, "runs as nobody, which should not be used for services")
    } else {
        (0, "runs under a static non-root uid")
    };
    rows.push(row("UserOrDynamicUser", 2000, 10, Some(user), user_text));
    let groups = observed.threads.iter().any(|t| !t.groups.is_empty());
    rows.push(bool_row(
        "SupplementaryGroups",
        200,
        (!root).then_some(groups),
        "no supplementary groups",
        "runs with supplementary groups",
    ));

    // Capabilities: what any thread holds or could still gain.
    let reachable = observed.union_of(|t| t.cap_bounding.union(t.cap_permitted));
    for (id, weight, caps) in CAPABILITY_CHECKS {
        let held: CapSet = caps
            .iter()
            .copied()
            .filter(|c| reachable.contains_index(*c))
            .collect();
        let text = format!("bounding/permitted set holds {held}");
        rows.push(row(
            id,
            *weight,
            1,
            Some(u64::from(!held.is_empty())),
            if held.is_empty() {
                "not in the bounding or permitted set"
            } else {
                &text
            },
        ));
    }
    let ambient = observed.union_of(|t| t.cap_ambient);
    rows.push(bool_row(
        "AmbientCapabilities",
        500,
        Some(!ambient.is_empty()),
        "no ambient capabilities",
        "receives ambient capabilities",
    ));
    rows.push(bool_row(
        "NoNewPrivileges",
        1000,
        Some(!observed.every_thread(|t| t.no_new_privs)),
        "no_new_privs on every thread",
        "some thread may acquire new privileges",
    ));
    let umask = observed
        .threads
        .iter()
        .map(|t| t.umask)
        .collect::<Option<Vec<u32>>>()
        .and_then(|masks| masks.into_iter().map(umask_badness).max());
    rows.push(row("UMask", 100, 10, umask, "worst umask over the threads"));

    // Seccomp.
    let filter = if !observed.every_thread(|t| t.seccomp == SeccompMode::Filter) {
        Filter::None
    } else {
        match applied.and_then(|a| a.seccomp.as_ref()) {
            Some(s) => Filter::Known(s),
            None => Filter::Unknown,
        }
    };
    let (archs, archs_text) = match filter {
        Filter::None => (Some(10), "some thread has no seccomp filter: every ABI"),
        Filter::Unknown => (None, "filter of unknown origin"),
        Filter::Known(_) => (
            Some(0),
            "native ABI only (seccompiler kills other architectures)",
        ),
    };
    rows.push(row("SystemCallArchitectures", 1000, 10, archs, archs_text));
    for (id, weight, groups) in SYSCALL_FILTER_CHECKS {
        let (badness, text) = match filter {
            Filter::None => (Some(10), "no system call filter".to_string()),
            Filter::Unknown => (None, "filter of unknown origin".to_string()),
            Filter::Known(s) => match groups
                .iter()
                .flat_map(|g| g.iter())
                .find(|c| s.allows(c).is_some())
            {
                Some(call) => (
                    Some(9),
                    format!("allow-list includes the group (e.g. {call})"),
                ),
                None => (Some(0), "allow-list excludes the group".to_string()),
            },
        };
        rows.push(row(id, *weight, 10, badness, &text));
    }
    let families = match filter {
        Filter::Known(s) => Some(Families::of(s)),
        Filter::None => Some(Families::All),
        Filter::Unknown => None,
    };
    let family_checks: [(&str, u64, FamilyTest); 5] = [
        ("RestrictAddressFamilies_AF_INET_INET6", 1500, |f| {
            f == 2 || f == 10
        }),
        ("RestrictAddressFamilies_AF_UNIX", 25, |f| f == 1),
        ("RestrictAddressFamilies_AF_NETLINK", 200, |f| f == 16),
        ("RestrictAddressFamilies_AF_PACKET", 1000, |f| f == 17),
        ("RestrictAddressFamilies_OTHER", 1250, |f| {
            !NAMED_FAMILIES.contains(&f)
        }),
    ];
    for (id, weight, wanted) in family_checks {
        rows.push(bool_row(
            id,
            weight,
            families.as_ref().map(|f| f.allows(wanted)),
            "socket() cannot create these",
            "socket() may create these",
        ));
    }
    for (id, weight, flag) in NAMESPACE_CHECKS {
        let bad = match filter {
            Filter::None => Some(true),
            Filter::Unknown => None,
            Filter::Known(s) => Some(
                ["unshare", "setns", "clone3"]
                    .iter()
                    .any(|c| s.allows(c).is_some())
                    || s.allows("clone").is_some_and(|c| may_pass_flag(c, *flag)),
            ),
        };
        rows.push(bool_row(
            id,
            *weight,
            bad,
            "cannot create or join it",
            "may create or join it",
        ));
    }
    let allowed_any = |calls: &[&str]| match filter {
        Filter::None => Some(true),
        Filter::Unknown => None,
        Filter::Known(s) => Some(calls.iter().any(|c| s.allows(c).is_some())),
    };
    rows.push(bool_row(
        "LockPersonality",
        100,
        allowed_any(&["personality"]),
        "personality() is not allowed",
        "personality() is allowed",
    ));
    rows.push(bool_row(
        "RestrictRealtime",
        500,
        allowed_any(&["sched_setscheduler", "sched_setattr", "sched_setparam"]),
        "cannot change its scheduling policy",
        "may change its scheduling policy",
    ));

    // Landlock (our checks): no /proc field, so only what the spawner applied counts.
    let landlock = applied.map(|a| &a.landlock);
    rows.push(landlock_fs_row(landlock));
    let (net, net_text) = match landlock {
        None => (None, "not assessed: no record of what was applied"),
        Some(l) if l.restricts_tcp() && l.restricts_udp() => {
            (Some(0), "TCP and UDP ports restricted")
        }
        Some(l) if l.restricts_tcp() => (
            Some(1),
            "TCP ports restricted; UDP not handled by the kernel's landlock ABI",
        ),
        Some(_) => (Some(2), "TCP and UDP not restricted by landlock"),
    };
    rows.push(row("TalosLandlockNetwork", 1000, 2, net, net_text));
    rows.push(bool_row(
        "TalosLandlockScopes",
        250,
        landlock.map(|l| l.scopes.len() < 2),
        "abstract UNIX sockets and signals scoped to its domain",
        "abstract UNIX sockets or signals not scoped",
    ));

    // IPC reach through stated.
    rows.push(bool_row(
        "TalosIpcAdmin",
        2000,
        Some(root),
        "stated maps it to its own daemon identity",
        "uid 0: stated treats it as admin (every namespace)",
    ));
    let (writes_sensitive, reads_sensitive, reads_all) = match reach {
        Some(r) => {
            // A read entry is `namespace` or `namespace/Type`: a type of a sensitive namespace
            // counts as reading it.
            let sensitive = |n: &&String| {
                let ns = n.split_once('/').map_or(n.as_str(), |(ns, _)| ns);
                ns == "*" || r.sensitive.iter().any(|s| s == ns)
            };
            (
                Some(root || r.writes.iter().any(|n| sensitive(&n))),
                Some(root || r.writes.iter().chain(&r.reads).any(|n| sensitive(&n))),
                Some(root || r.reads.iter().any(|n| n == "*")),
            )
        }
        None => (None, None, None),
    };
    rows.push(bool_row(
        "TalosIpcWriteSensitive",
        1000,
        writes_sensitive,
        "writes no sensitive namespace",
        "writes a sensitive namespace",
    ));
    rows.push(bool_row(
        "TalosIpcReadSensitive",
        1000,
        reads_sensitive,
        "reads no sensitive namespace",
        "reads a sensitive namespace",
    ));
    rows.push(bool_row(
        "TalosIpcReadAll",
        500,
        reads_all,
        "reads only the namespaces it needs",
        "reads every namespace",
    ));

    assess(rows)
}

fn landlock_fs_row(landlock: Option<&LandlockApplied>) -> Row {
    let root_rule = |l: &LandlockApplied, access: &[PathAccess]| {
        l.paths
            .iter()
            .any(|p| p.path.as_os_str() == "/" && access.contains(&p.access))
    };
    let (badness, text) = match landlock {
        None => (
            None,
            "not assessed: no /proc field and no record of what was applied",
        ),
        Some(l) if !l.restricts_fs() || l.enforcement == LandlockEnforcement::NotEnforced => {
            (Some(10), "no landlock filesystem restriction")
        }
        Some(l) if root_rule(l, &[PathAccess::ReadWrite]) => {
            (Some(10), "may write everywhere (read-write rule on /)")
        }
        Some(l) if root_rule(l, &[PathAccess::ReadOnly, PathAccess::Exec]) => {
            (Some(5), "may read everywhere (rule on /)")
        }
        Some(l) if l.unhandled.iter().any(|r| r == "resolve_unix") => (
            Some(1),
            "paths restricted; connecting to pathname UNIX sockets is not (landlock ABI < 9)",
        ),
        Some(_) => (Some(0), "paths restricted"),
    };
    row("TalosLandlockFilesystem", 1000, 10, badness, text)
}

/// systemd's UMask badness.
fn umask_badness(mask: u32) -> u64 {
    if mask & 0o002 == 0 {
        10
    } else if mask & 0o004 == 0 {
        5
    } else if mask & 0o020 == 0 {
        2
    } else if mask & 0o040 == 0 {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::landlock::LandlockApplied;
    use crate::observe::{Ids, ThreadStatus};
    use crate::policy::PathRule;
    use crate::prepare::Applied;
    use crate::seccomp::{compile_bytes, SeccompAction};

    #[test]
    fn levels_use_systemds_thresholds() {
        let table = [
            (0, "PERFECT"),
            (1, "SAFE"),
            (9, "SAFE"),
            (10, "OK"),
            (49, "OK"),
            (50, "MEDIUM"),
            (74, "MEDIUM"),
            (75, "EXPOSED"),
            (89, "EXPOSED"),
            (90, "UNSAFE"),
            (99, "UNSAFE"),
            (100, "DANGEROUS"),
        ];
        for (exposure, name) in table {
            assert_eq!(Level::of(exposure).as_str(), name, "{exposure}");
        }
    }

    #[test]
    fn rounding_is_systemds() {
        // Σ ceil(b·w/r) = ceil(9·2000/10) + ceil(5·100/10) + 0 = 1850 over Σw = 3100 (the N/A
        // row is left out): ceil(185000/3100) = 60 → 6.0 MEDIUM.
        let e = assess(vec![
            row("A", 2000, 10, Some(9), ""),
            row("B", 100, 10, Some(5), ""),
            row("C", 1000, 1, Some(0), ""),
            row("D", 25, 1, None, ""),
        ]);
        assert_eq!(e.exposure, 60);
        assert_eq!(e.summary(), "6.0 MEDIUM");
        let column: Vec<_> = e
            .checks
            .iter()
            .map(|c| (c.id.as_str(), c.exposure))
            .collect();
        // ceil(ceil(9·2000·100/10)/3100) = 59; ceil(ceil(5·100·100/10)/3100) = 2.
        assert_eq!(
            column,
            [("A", Some(59)), ("C", None), ("B", Some(2)), ("D", None)]
        );
        // Any non-zero badness rounds up to at least 0.1.
        let tiny = assess(vec![
            row("A", 10_000, 1, Some(0), ""),
            row("B", 1, 10, Some(1), ""),
        ]);
        assert_eq!(tiny.exposure, 1);
        assert_eq!(tiny.checks[1].exposure, Some(1));
    }

    #[test]
    fn umask_table() {
        for (mask, badness) in [
            (0o000, 10),
            (0o022, 5),
            (0o006, 2),
            (0o026, 1),
            (0o027, 1),
            (0o077, 0),
            (0o007, 2),
        ] {
            assert_eq!(umask_badness(mask), badness, "{mask:o}");
        }
    }

    fn thread(uid: u32, caps: CapSet, nnp: bool, seccomp: SeccompMode) -> ThreadStatus {
        let ids = Ids {
            real: uid,
            effective: uid,
            saved: uid,
            fs: uid,
        };
        ThreadStatus {
            tid: 1,
            name: "t".into(),
            umask: Some(0o022),
            uid: ids,
            gid: ids,
            groups: vec![],
            cap_inheritable: caps,
            cap_permitted: caps,
            cap_effective: caps,
            cap_bounding: caps,
            cap_ambient: if uid == 0 { CapSet::EMPTY } else { caps },
            no_new_privs: nnp,
            seccomp,
            seccomp_filters: u32::from(seccomp == SeccompMode::Filter),
        }
    }

    const PROFILE: &str = r#"{"d": {"mismatch_action": "kill_process", "match_action": "allow", "filter": [
        {"syscall": "execve"}, {"syscall": "read"}, {"syscall": "clone3"}, {"syscall": "sched_setaffinity"},
        {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1}]},
        {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 16}]}
    ]}}"#;

    fn landlock(abi: u32, paths: Vec<PathRule>) -> LandlockApplied {
        let mut unhandled = vec![];
        if abi < 9 {
            unhandled.push("resolve_unix".to_string());
        }
        LandlockApplied {
            kernel_abi: abi,
            requested_abi: 10,
            enforcement: if abi == 0 {
                LandlockEnforcement::NotEnforced
            } else {
                LandlockEnforcement::Partial
            },
            handled_fs: if abi == 0 {
                vec![]
            } else {
                vec!["read_file".into(), "write_file".into()]
            },
            handled_net: if abi >= 4 {
                vec!["bind_tcp".into(), "connect_tcp".into()]
            } else {
                vec![]
            },
            scopes: if abi >= 6 {
                vec!["abstract_unix_socket".into(), "signal".into()]
            } else {
                vec![]
            },
            unhandled,
            paths,
            bind_tcp: vec![],
            connect_tcp: vec![],
            bind_udp: vec![],
            connect_udp: vec![],
        }
    }

    fn sandboxed(caps: CapSet, abi: u32) -> Observed {
        let (_, seccomp) =
            compile_bytes(std::path::Path::new("p.json"), PROFILE.as_bytes(), "d").unwrap();
        Observed {
            pid: 1,
            threads: vec![
                thread(1001, caps, true, SeccompMode::Filter),
                thread(1001, caps, true, SeccompMode::Filter),
            ],
            landlock_kernel_abi: abi,
            dumpable: Some(false),
            applied: Some(Applied {
                program: "/bin/x".into(),
                uid: 1001,
                gid: 1001,
                supplementary_groups: vec![],
                capabilities: caps,
                landlock: landlock(
                    abi,
                    vec![PathRule {
                        path: "/usr".into(),
                        access: PathAccess::Exec,
                    }],
                ),
                seccomp: Some(seccomp),
            }),
        }
    }

    fn badness(e: &Exposure, id: &str) -> Option<u64> {
        e.checks
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no check {id}"))
            .badness
    }

    #[test]
    fn per_check_table() {
        let net_admin: CapSet = "CAP_NET_ADMIN,CAP_NET_RAW".parse().unwrap();
        let reach = IpcReach {
            writes: vec!["network".into()],
            reads: vec!["config".into()],
            sensitive: vec!["config".into(), "secrets".into()],
        };
        let e = score(&sandboxed(net_admin, 7), Some(&reach));
        let table: &[(&str, Option<u64>)] = &[
            ("UserOrDynamicUser", Some(0)),
            ("SupplementaryGroups", Some(0)),
            ("CapabilityBoundingSet_CAP_NET_ADMIN", Some(1)),
            (
                "CapabilityBoundingSet_CAP_NET_BIND_SERVICE_BROADCAST_RAW",
                Some(1),
            ),
            ("CapabilityBoundingSet_CAP_SYS_ADMIN", Some(0)),
            ("AmbientCapabilities", Some(1)),
            ("NoNewPrivileges", Some(0)),
            ("UMask", Some(5)),
            ("SystemCallArchitectures", Some(0)),
            ("SystemCallFilter_debug", Some(0)),
            ("SystemCallFilter_resources", Some(9)), // sched_setaffinity
            ("SystemCallFilter_privileged", Some(0)),
            ("RestrictAddressFamilies_AF_INET_INET6", Some(0)),
            ("RestrictAddressFamilies_AF_UNIX", Some(1)),
            ("RestrictAddressFamilies_AF_NETLINK", Some(1)),
            ("RestrictAddressFamilies_AF_PACKET", Some(0)),
            ("RestrictAddressFamilies_OTHER", Some(0)),
            // clone3 cannot be filtered by flags: the stacked filter fails it with ENOSYS.
            ("RestrictNamespaces_user", Some(0)),
            ("LockPersonality", Some(0)),
            ("RestrictRealtime", Some(0)),
            ("TalosLandlockFilesystem", Some(1)),
            ("TalosLandlockNetwork", Some(1)),
            ("TalosLandlockScopes", Some(0)),
            ("TalosIpcAdmin", Some(0)),
            ("TalosIpcWriteSensitive", Some(0)),
            ("TalosIpcReadSensitive", Some(1)),
            ("TalosIpcReadAll", Some(0)),
        ];
        for (id, expected) in table {
            assert_eq!(badness(&e, id), *expected, "{id}");
        }
        assert!(e.checks.iter().all(|c| c.origin
            == if c.id.starts_with("Talos") {
                Origin::Talos
            } else {
                Origin::Systemd
            }));
    }

    #[test]
    fn unknown_filter_and_missing_record_are_not_assessed() {
        let mut o = sandboxed(CapSet::EMPTY, 7);
        o.applied = None;
        let e = score(&o, None);
        for id in [
            "SystemCallArchitectures",
            "SystemCallFilter_mount",
            "RestrictNamespaces_net",
            "TalosLandlockFilesystem",
            "TalosIpcReadAll",
        ] {
            assert_eq!(badness(&e, id), None, "{id}");
        }
        assert_eq!(badness(&e, "NoNewPrivileges"), Some(0));
        assert_eq!(badness(&e, "TalosIpcAdmin"), Some(0));
    }

    #[test]
    fn one_unfiltered_thread_counts_as_no_filter() {
        let mut o = sandboxed(CapSet::EMPTY, 7);
        o.threads[1].seccomp = SeccompMode::Disabled;
        o.threads[1].no_new_privs = false;
        let e = score(&o, None);
        assert_eq!(badness(&e, "SystemCallFilter_mount"), Some(10));
        assert_eq!(badness(&e, "SystemCallArchitectures"), Some(10));
        assert_eq!(badness(&e, "RestrictAddressFamilies_AF_PACKET"), Some(1));
        assert_eq!(badness(&e, "NoNewPrivileges"), Some(1));
    }

    #[test]
    fn landlock_rows() {
        let cases = [
            (0, vec![], Some(10), Some(2), Some(1)),
            (3, vec![], Some(1), Some(2), Some(1)),
            (7, vec![], Some(1), Some(1), Some(0)),
            (
                7,
                vec![PathRule {
                    path: "/".into(),
                    access: PathAccess::ReadOnly,
                }],
                Some(5),
                Some(1),
                Some(0),
            ),
            (
                7,
                vec![PathRule {
                    path: "/".into(),
                    access: PathAccess::ReadWrite,
                }],
                Some(10),
                Some(1),
                Some(0),
            ),
            (10, vec![], Some(0), Some(1), Some(0)),
        ];
        for (abi, paths, fs, net, scopes) in cases {
            let mut o = sandboxed(CapSet::EMPTY, abi);
            if let Some(a) = o.applied.as_mut() {
                a.landlock = landlock(abi, paths.clone());
            }
            let e = score(&o, None);
            assert_eq!(
                badness(&e, "TalosLandlockFilesystem"),
                fs,
                "abi {abi} {paths:?}"
            );
            assert_eq!(badness(&e, "TalosLandlockNetwork"), net, "abi {abi}");
            assert_eq!(badness(&e, "TalosLandlockScopes"), scopes, "abi {abi}");
        }
    }

    #[test]
    fn clone_flag_conditions_restrict_namespaces() {
        let profile = r#"{"d": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [
            {"syscall": "execve"},
            {"syscall": "clone", "args": [{"index": 0, "type": "qword", "op": {"masked_eq": 2114060288}, "val": 0}]}
        ]}}"#;
        let (_, s) = compile_bytes(std::path::Path::new("p"), profile.as_bytes(), "d").unwrap();
        assert_eq!(s.default_action, SeccompAction::Errno(38));
        let mut o = sandboxed(CapSet::EMPTY, 7);
        if let Some(a) = o.applied.as_mut() {
            a.seccomp = Some(s);
        }
        let e = score(&o, None);
        for (id, _, _) in NAMESPACE_CHECKS {
            assert_eq!(badness(&e, id), Some(0), "{id}");
        }
        assert_eq!(
            badness(&e, "RestrictAddressFamilies_AF_INET_INET6"),
            Some(0)
        );
    }

    #[test]
    fn root_without_sandbox_is_dangerous_and_a_tight_sandbox_is_ok() {
        let all = CapSet::from_hex("000001ffffffffff").unwrap();
        let root = Observed {
            pid: 1,
            threads: vec![thread(0, all, false, SeccompMode::Disabled)],
            landlock_kernel_abi: 7,
            applied: None,
            dumpable: None,
        };
        let reach = IpcReach {
            writes: vec![],
            reads: vec![],
            sensitive: vec!["secrets".into()],
        };
        let e = score(&root, Some(&reach));
        // Every assessed check is at its worst except UMask 022 (5 of 10, weight 100) and the
        // empty ambient set (weight 500); the landlock rows are N/A without a record. With the
        // 40,700 weight assessed: ceil(100 · 40,150 / 40,700) = 99, UNSAFE (systemd gives a
        // bare `ExecStart=/bin/true` unit 9.6 UNSAFE).
        let weight: u64 = e
            .checks
            .iter()
            .filter(|c| c.badness.is_some())
            .map(|c| c.weight)
            .sum();
        assert_eq!(weight, 40_700);
        assert_eq!(e.summary(), "9.9 UNSAFE");
        assert!(e
            .checks
            .iter()
            .filter(|c| c.badness.is_some()
                && !["UMask", "AmbientCapabilities"].contains(&c.id.as_str()))
            .all(|c| c.badness == Some(c.range)));

        let tight = score(&sandboxed(CapSet::EMPTY, 7), Some(&IpcReach::default()));
        assert!(tight.level <= Level::Ok, "{}", tight.summary());
    }
}
