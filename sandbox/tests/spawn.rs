//! Spawns `sandbox-probe` under policies and checks, from `/proc` and from what the probe can
//! and cannot do, that the sandbox is what the policy says. Needs root (to switch uid); skipped
//! with a message otherwise.
#![allow(clippy::unwrap_used)] // helpers of tests: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use sandbox::{
    score, spawn, CapSet, Command, IpcReach, LandlockPolicy, PathAccess, PathRule, Policy,
    PrepareError, Prepared, SeccompMode, SeccompPolicy, SeccompProfileRef, SpawnError, Step,
};

const UID: u32 = 4242;
const GID: u32 = 4343;

macro_rules! require_root {
    () => {
        if !testkit::require_root("the sandbox tests switch uid") {
            return;
        }
    };
}

/// A directory shared by all tests of this process: the probe copied in (`bin/`, 0755, so uid
/// 4242 may execute it), a directory the policy makes writable (`rw/`) and one it does not
/// (`ro/`), both owned by the probe's uid so that only landlock can refuse a write, a copy of
/// the probe outside the exec rules (`rw/sandbox-probe`) and a root-only directory
/// (`private/`).
///
/// Everything is written once, before any test forks: a binary still open for writing in one
/// thread while another forks is inherited by that child, and exec of it then fails with
/// ETXTBSY until the child closes its fds.
struct Fixture {
    root: PathBuf,
    probe: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("sandbox-test-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let root = dir.keep();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sub in ["bin", "rw", "ro", "private"] {
            std::fs::create_dir(root.join(sub)).unwrap();
        }
        for sub in ["rw", "ro"] {
            std::os::unix::fs::chown(root.join(sub), Some(UID), Some(GID)).unwrap();
        }
        std::fs::set_permissions(root.join("private"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let probe = root.join("bin/sandbox-probe");
        for copy in [&probe, &root.join("rw/sandbox-probe")] {
            std::fs::copy(env!("CARGO_BIN_EXE_sandbox-probe"), copy).unwrap();
            std::fs::set_permissions(copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Fixture { root, probe }
    })
}

impl Fixture {
    fn path(&self, sub: &str) -> PathBuf {
        self.root.join(sub)
    }

    /// The probe's policy: its own uid, no capabilities, exec on its binary and the shared
    /// libraries, read-write on `rw/` only, its seccomp profile.
    fn policy(&self) -> Policy {
        let rule = |path: &str, access| PathRule {
            path: path.into(),
            access,
        };
        Policy {
            uid: UID,
            gid: GID,
            supplementary_groups: vec![],
            capabilities: CapSet::EMPTY,
            landlock: LandlockPolicy {
                paths: vec![
                    PathRule {
                        path: self.path("bin"),
                        access: PathAccess::Exec,
                    },
                    rule("/usr/lib", PathAccess::Exec),
                    rule("/usr/lib64", PathAccess::Exec),
                    rule("/etc/ld.so.cache", PathAccess::ReadOnly),
                    PathRule {
                        path: self.path("rw"),
                        access: PathAccess::ReadWrite,
                    },
                ],
                ..Default::default()
            },
            seccomp: SeccompPolicy::Profile(SeccompProfileRef {
                path: concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/{arch}/probe.json").into(),
                filter: "probe".into(),
            }),
            env: [("PROBE".to_string(), "1".to_string())].into(),
            fds: Default::default(),
            working_dir: "/".into(),
            umask: 0o027,
        }
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

/// Runs the probe with `args` under `policy`; returns how it ended and its stdout.
fn run(f: &Fixture, policy: &Policy, args: &[&str]) -> (ExitStatus, String) {
    let (out_r, out_w) = pipe();
    let prepared = Prepared::new(policy, Command::new(&f.probe).args(args).stdout(out_w)).unwrap();
    let child = spawn(&prepared).unwrap();
    drop(prepared); // the parent's copy of the stdout pipe
    let mut out = String::new();
    std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
    (child.wait().unwrap(), out.trim().to_string())
}

fn ok(result: &(ExitStatus, String)) -> bool {
    result.0.code() == Some(0) && result.1.ends_with("ok")
}

fn errno(result: &(ExitStatus, String)) -> Option<i32> {
    result.1.strip_prefix("errno ")?.parse().ok()
}

#[test]
fn every_thread_has_the_policys_identity_capabilities_nnp_and_seccomp() {
    require_root!();
    let f = fixture();
    let mut policy = f.policy();
    policy.capabilities = "CAP_NET_BIND_SERVICE".parse().unwrap();
    policy.fds.insert("notify".into(), 3);
    let (ready_r, ready_w) = pipe();
    let prepared = Prepared::new(
        &policy,
        Command::new(&f.probe)
            .args(["sleep", "30"])
            .fd("notify", ready_w),
    )
    .unwrap();
    let child = spawn(&prepared).unwrap();
    drop(prepared);
    let mut line = String::new();
    BufReader::new(std::fs::File::from(ready_r))
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n", "the probe signals readiness on fd 3");

    let observed = child.observe().unwrap();
    let _ = child.signal(libc::SIGKILL);
    let _ = child.wait();

    assert!(
        observed.threads.len() >= 3,
        "main + 2 threads: {}",
        observed.threads.len()
    );
    for t in &observed.threads {
        assert_eq!(t.uid.all(), [UID; 4], "uid of thread {}", t.tid);
        assert_eq!(t.gid.all(), [GID; 4], "gid of thread {}", t.tid);
        assert!(t.groups.is_empty(), "groups of thread {}", t.tid);
        assert_eq!(t.umask, Some(0o027), "umask of thread {}", t.tid);
        for (set, caps) in [
            ("effective", t.cap_effective),
            ("permitted", t.cap_permitted),
            ("inheritable", t.cap_inheritable),
            ("ambient", t.cap_ambient),
            ("bounding", t.cap_bounding),
        ] {
            assert_eq!(caps, policy.capabilities, "{set} set of thread {}", t.tid);
        }
        assert!(t.no_new_privs, "NoNewPrivs of thread {}", t.tid);
        assert_eq!(
            t.seccomp,
            SeccompMode::Filter,
            "Seccomp of thread {}",
            t.tid
        );
        // The allow-list and the filter stacked before it (clone3 fails with ENOSYS).
        assert_eq!(t.seccomp_filters, 2, "two filters on thread {}", t.tid);
    }
    let applied = observed.applied.as_ref().unwrap();
    assert_eq!(applied.landlock.kernel_abi, sandbox::landlock_kernel_abi());
    let exposure = score(&observed, Some(&IpcReach::default()));
    eprintln!(
        "probe under its policy (landlock ABI {}, {:?}): exposure {}",
        applied.landlock.kernel_abi,
        applied.landlock.enforcement,
        exposure.summary()
    );
    for check in exposure.checks.iter().filter(|c| !c.good()) {
        eprintln!(
            "  ✗ {} ({:?}/{}): {}",
            check.id, check.badness, check.range, check.description
        );
    }
}

#[test]
fn landlock_allows_writes_only_beneath_read_write_paths() {
    require_root!();
    if !testkit::require(
        sandbox::landlock_kernel_abi() > 0,
        "this kernel has no landlock",
    ) {
        return;
    }
    let f = fixture();
    let policy = f.policy();
    let inside = run(f, &policy, &["write", f.path("rw/file").to_str().unwrap()]);
    assert!(ok(&inside), "write inside rw/: {inside:?}");
    let outside = run(f, &policy, &["write", f.path("ro/file").to_str().unwrap()]);
    assert_eq!(
        errno(&outside),
        Some(libc::EACCES),
        "write in ro/ (owned by the probe's uid): {outside:?}"
    );
    assert!(!f.path("ro/file").exists());
    let tmp = run(f, &policy, &["write", "/tmp/talos-rs-sandbox-probe"]);
    assert_eq!(errno(&tmp), Some(libc::EACCES), "write in /tmp: {tmp:?}");
}

#[test]
fn a_syscall_outside_the_profile_is_killed_or_refused_per_the_profiles_action() {
    require_root!();
    let f = fixture();
    let policy = f.policy();
    let ptrace = run(f, &policy, &["ptrace"]);
    assert_eq!(
        ptrace.0.signal(),
        Some(libc::SIGSYS),
        "ptrace under kill_process: {ptrace:?}"
    );
    let packet = run(f, &policy, &["packet-socket"]);
    assert_eq!(
        packet.0.signal(),
        Some(libc::SIGSYS),
        "socket(AF_PACKET), family not allowed: {packet:?}"
    );

    // The same profile with errno(EPERM) as its default action.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe-errno.json");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/profiles/x86_64/probe.json"
    ))
    .unwrap();
    let mut profile: serde_json::Value = serde_json::from_str(&text).unwrap();
    profile["probe"]["mismatch_action"] = serde_json::json!({"errno": libc::EPERM});
    std::fs::write(&path, profile.to_string()).unwrap();
    let mut errno_policy = policy.clone();
    errno_policy.seccomp = SeccompPolicy::Profile(SeccompProfileRef {
        path,
        filter: "probe".into(),
    });
    let refused = run(f, &errno_policy, &["ptrace"]);
    assert_eq!(
        errno(&refused),
        Some(libc::EPERM),
        "ptrace under errno(EPERM): {refused:?}"
    );

    // Control: without the filter the same call succeeds, so the refusal above is the filter's.
    let mut unconfined = policy;
    unconfined.seccomp = SeccompPolicy::Unconfined;
    let allowed = run(f, &unconfined, &["ptrace"]);
    assert!(
        ok(&allowed),
        "ptrace(PTRACE_TRACEME) without a filter: {allowed:?}"
    );
}

#[test]
fn a_capability_the_policy_lacks_is_refused() {
    require_root!();
    let f = fixture();
    let policy = f.policy();
    let refused = run(f, &policy, &["sethostname"]);
    assert_eq!(
        errno(&refused),
        Some(libc::EPERM),
        "sethostname without CAP_SYS_ADMIN: {refused:?}"
    );

    // Control: granted CAP_SYS_ADMIN (as an ambient capability of uid 4242) it succeeds; the
    // probe sets the hostname to its current value.
    let mut admin = policy;
    admin.capabilities = "CAP_SYS_ADMIN".parse().unwrap();
    let allowed = run(f, &admin, &["sethostname"]);
    assert!(ok(&allowed), "sethostname with CAP_SYS_ADMIN: {allowed:?}");
}

fn free_port(range: std::ops::RangeInclusive<u16>) -> Option<u16> {
    range
        .into_iter()
        .find(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).is_ok())
}

#[test]
fn tcp_bind_and_connect_are_limited_to_the_policys_ports() {
    require_root!();
    let abi = sandbox::landlock_kernel_abi();
    if !testkit::require(
        abi >= 4,
        &format!("landlock ABI {abi} < 4 (Linux 6.7) has no TCP port rules"),
    ) {
        return;
    }
    let f = fixture();
    let allowed_port = free_port(20000..=29999).unwrap();
    let other_port = free_port(30000..=39999).unwrap();
    let mut policy = f.policy();
    policy.landlock.bind_tcp = vec![allowed_port];
    let inside = run(f, &policy, &["bind", &allowed_port.to_string()]);
    assert!(ok(&inside), "bind {allowed_port} (allowed): {inside:?}");
    let outside = run(f, &policy, &["bind", &other_port.to_string()]);
    assert_eq!(
        errno(&outside),
        Some(libc::EACCES),
        "bind {other_port} (not allowed): {outside:?}"
    );

    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let listening = listener.local_addr().unwrap().port();
    let refused = run(f, &policy, &["connect", &listening.to_string()]);
    assert_eq!(
        errno(&refused),
        Some(libc::EACCES),
        "connect {listening} (not allowed): {refused:?}"
    );
    policy.landlock.connect_tcp = vec![listening];
    let connected = run(f, &policy, &["connect", &listening.to_string()]);
    assert!(
        ok(&connected),
        "connect {listening} (allowed): {connected:?}"
    );

    // A port below 1024 allowed by landlock still needs CAP_NET_BIND_SERVICE, which only an
    // ambient capability carries across exec to a non-root uid.
    let Some(low) = free_port(900..=1000) else {
        eprintln!("skipped the low-port part: no free port in 900..=1000");
        return;
    };
    policy.landlock.bind_tcp = vec![low];
    let without = run(f, &policy, &["bind", &low.to_string()]);
    assert_eq!(
        errno(&without),
        Some(libc::EACCES),
        "bind {low} without CAP_NET_BIND_SERVICE: {without:?}"
    );
    policy.capabilities = "CAP_NET_BIND_SERVICE".parse().unwrap();
    let with = run(f, &policy, &["bind", &low.to_string()]);
    assert!(ok(&with), "bind {low} with CAP_NET_BIND_SERVICE: {with:?}");
}

fn spawn_error(f: &Fixture, policy: &Policy, program: &Path) -> SpawnError {
    let prepared = Prepared::new(policy, Command::new(program).arg("env")).unwrap();
    match spawn(&prepared) {
        Ok(child) => panic!(
            "spawned {program:?} as pid {}: {:?}",
            child.pid(),
            child.wait()
        ),
        Err(e) => {
            let _ = f;
            e
        }
    }
}

#[test]
fn a_failure_in_the_child_comes_back_naming_its_step() {
    require_root!();
    let f = fixture();
    let policy = f.policy();

    let missing = spawn_error(f, &policy, &f.path("bin/no-such-probe"));
    assert_eq!(missing.step(), Some(Step::Exec), "{missing:?}");
    assert_eq!(missing.errno(), Some(libc::ENOENT), "{missing:?}");
    assert!(missing.to_string().contains("execve"), "{missing}");

    // The working directory is entered as the probe's uid: a root-only directory is refused.
    let mut cwd = policy.clone();
    cwd.working_dir = f.path("private");
    let denied = spawn_error(f, &cwd, &f.probe);
    assert_eq!(
        (denied.step(), denied.errno()),
        (Some(Step::WorkingDir), Some(libc::EACCES)),
        "{denied:?}"
    );

    // Exec outside the landlock exec paths: the binary exists, landlock refuses it.
    if sandbox::landlock_kernel_abi() > 0 {
        let refused = spawn_error(f, &policy, &f.path("rw/sandbox-probe"));
        assert_eq!(
            (refused.step(), refused.errno()),
            (Some(Step::Exec), Some(libc::EACCES)),
            "{refused:?}"
        );
    }

    // What can be found before fork is a PrepareError, not a child failure.
    let mut bad = policy;
    bad.landlock.paths.push(PathRule {
        path: "/nonexistent/talos-rs".into(),
        access: PathAccess::ReadOnly,
    });
    if sandbox::landlock_kernel_abi() > 0 {
        assert!(matches!(
            Prepared::new(&bad, Command::new(&f.probe)),
            Err(PrepareError::Landlock(_))
        ));
    }
}

#[test]
fn only_the_declared_fds_and_environment_cross_exec() {
    require_root!();
    let f = fixture();
    let mut policy = f.policy();
    policy.fds.insert("notify".into(), 3);
    // An fd the parent leaks without FD_CLOEXEC (dup does not set it).
    let leaked = nix::unistd::dup(std::io::stderr()).unwrap();
    let leaked_number = std::os::fd::AsRawFd::as_raw_fd(&leaked);

    let (out_r, out_w) = pipe();
    let (_ready_r, ready_w) = pipe();
    let prepared = Prepared::new(
        &policy,
        Command::new(&f.probe)
            .arg("fds")
            .stdout(out_w)
            .fd("notify", ready_w),
    )
    .unwrap();
    let child = spawn(&prepared).unwrap();
    drop(prepared);
    let mut out = String::new();
    std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
    assert!(child.wait().unwrap().success(), "{out}");
    let fds: Vec<i32> = out
        .lines()
        .find_map(|l| l.strip_prefix("fds "))
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        fds.contains(&1) && fds.contains(&3),
        "stdout and notify: {fds:?}"
    );
    assert!(
        fds.iter().all(|fd| *fd <= 3),
        "nothing else: {fds:?} (leaked {leaked_number})"
    );
    drop(leaked);

    let env = run(f, &policy_without_fds(&policy), &["env"]);
    assert_eq!(
        env.1, "PROBE=1\nok",
        "the policy's environment and nothing else"
    );
}

fn policy_without_fds(policy: &Policy) -> Policy {
    let mut p = policy.clone();
    p.fds.clear();
    p
}

#[test]
fn concurrent_spawns_from_many_threads_leak_no_fds_into_each_other() {
    require_root!();
    let f = fixture();
    let threads: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                (0..5)
                    .map(|_| run(f, &f.policy(), &["fds"]))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        for (status, out) in t.join().unwrap() {
            assert!(status.success(), "{out}");
            let fds = out.lines().next().unwrap_or_default();
            let numbers: Vec<i32> = fds
                .trim_start_matches("fds ")
                .split_whitespace()
                .map(|n| n.parse().unwrap())
                .collect();
            // Another thread's error pipe or stdout pipe, forked in meanwhile, would show here.
            assert!(
                numbers.contains(&1) && numbers.iter().all(|fd| *fd <= 2),
                "{fds}"
            );
        }
    }
}

/// clone3's flags sit in a struct seccomp cannot read, so the sandbox stacks a filter that fails
/// it with ENOSYS; glibc then creates threads with clone, whose flags the allow-list restricts:
/// threads work, a new user namespace does not (RestrictNamespaces in the audit).
#[test]
fn clone3_gets_enosys_threads_still_work_and_namespaces_cannot_be_created() {
    require_root!();
    let f = fixture();
    let policy = f.policy();
    let clone3 = run(f, &policy, &["clone3"]);
    assert_eq!(
        clone3.1.trim(),
        format!("errno {}", libc::ENOSYS),
        "{clone3:?}"
    );
    let thread = run(f, &policy, &["thread"]);
    assert!(ok(&thread), "a thread through clone: {thread:?}");
    let newuser = run(f, &policy, &["clone-newuser"]);
    assert_eq!(
        newuser.0.signal(),
        Some(libc::SIGSYS),
        "clone(CLONE_NEWUSER) is outside the allow-list: {newuser:?}"
    );
}
