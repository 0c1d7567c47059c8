//! `runtime.BlockDeviceAccessController` on a real block device (a loop device, its node made
//! in the test's own /dev): the node is given to blockd's group (root:blockd 0660); blockd's
//! uid can then read and write it, another daemon's uid cannot; a symlink under a device's
//! name is never followed. On a partitioned loop disk, a partition mounted as a system volume
//! and the whole disk are no daemon's (root:root 0600): blockd's uid cannot open them, a
//! resync never hands them back, blockd is restarted so that no fd it held survives, and a
//! requested service that reaches them is stopped.
//!
//! The tests take turns (`SERIAL`): one of them runs init's reaper, which reaps every child of
//! the process (the other tests' `losetup`, `setpriv` among them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use init::devices::DeviceAccess;
use init::supervisor::{Launch, Supervisor};
use machinery::resources::runtime::{ServiceState, UnitKind};

const BLOCKD: u32 = 1_990_000_015;
const NETWORKD: u32 = 1_990_000_011;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether `uid` (with its own gid as its only group) can open `node` for reading and writing.
fn can_open_as(uid: u32, node: &Path) -> bool {
    open_as(uid, node).is_ok()
}

/// Opens `node` for reading and writing as `uid` (its own gid its only group): what dd said
/// when it cannot.
fn open_as(uid: u32, node: &Path) -> Result<(), String> {
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            "dd",
            "count=1",
            "status=none",
            "conv=notrunc",
        ])
        .arg(format!("if={}", node.display()))
        .arg(format!("of={}", node.display()))
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_device_nodes_are_given_to_blockds_group_and_no_one_else() {
    if !testkit::require_root("it attaches a loop device and switches uids")
        || !testkit::require_program("setpriv", "apt-get install util-linux")
    {
        return;
    }
    let _one = SERIAL.lock().await;
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 * 1024 * 1024)
        .unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&img)
        .output()
        .unwrap();
    if !out.status.success() {
        testkit::skip("no loop device could be attached (losetup -f)");
        return;
    }
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(loopdev.clone());
    let name = loopdev.trim_start_matches("/dev/").to_string();

    // The test's /sys/class/block (the loop device and a name that is a symlink in /dev) and
    // /dev (the loop device's node as devtmpfs makes it: root 0600).
    let sys = d.path().join("sys");
    let dev = d.path().join("dev");
    std::fs::create_dir_all(sys.join("evil0")).unwrap();
    std::os::unix::fs::symlink(Path::new("/sys/class/block").join(&name), sys.join(&name)).unwrap();
    std::fs::create_dir(&dev).unwrap();
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mm =
        std::fs::read_to_string(Path::new("/sys/class/block").join(&name).join("dev")).unwrap();
    let (maj, min) = mm.trim().split_once(':').unwrap();
    let node = dev.join(&name);
    assert!(Command::new("mknod")
        .args(["-m", "0600"])
        .arg(&node)
        .args(["b", maj, min])
        .status()
        .unwrap()
        .success());
    let secret = d.path().join("secret");
    std::fs::write(&secret, "key").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&secret, dev.join("evil0")).unwrap();
    // The temp dir itself must be traversable by the other uids.
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(!can_open_as(BLOCKD, &node), "root 0600 before");

    let harness = stated::testing::Harness::start().await;
    let mut runtime = cosi::Runtime::new(harness.client.clone());
    runtime
        .register(init::controllers::BlockDeviceAccessController {
            devices: Arc::new(DeviceAccess::new(
                Some(("blockd".into(), BLOCKD)),
                sys.clone(),
                "/sys/dev/block".into(),
                dev.clone(),
                "/proc/self/mountinfo".into(),
                vec![],
            )),
            supervisor: None,
        })
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move { runtime.run(stopped).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = std::fs::metadata(&node).unwrap();
        if m.gid() == BLOCKD && m.mode() & 0o7777 == 0o660 {
            assert_eq!(m.uid(), 0);
            break;
        }
        assert!(Instant::now() < deadline, "not given to blockd: {m:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let _ = task.await;

    assert!(
        can_open_as(BLOCKD, &node),
        "blockd's uid reads and writes it"
    );
    assert!(!can_open_as(NETWORKD, &node), "another daemon's uid cannot");
    let s = std::fs::metadata(&secret).unwrap();
    assert_eq!(
        (s.uid(), s.gid(), s.mode() & 0o7777),
        (0, 0, 0o600),
        "a symlink under a device's name was followed"
    );
}

/// STATE taking over stated's directory (a loop device with xfs; mounts in the test's own temp
/// directory, undone at the end): a fresh filesystem gets what the directory held; one that
/// already holds files (an earlier boot's, found too late) keeps them, and what this boot
/// wrote in memory is never copied over them.
#[test]
fn state_takes_over_the_directory_and_never_overwrites_an_earlier_boot() {
    if !testkit::require_root("it attaches loop devices and mounts")
        || !testkit::require_program("mkfs.xfs", "apt-get install xfsprogs")
    {
        return;
    }
    let _one = SERIAL.blocking_lock();
    struct Undo(Vec<std::path::PathBuf>, Vec<String>);
    impl Drop for Undo {
        fn drop(&mut self) {
            for m in self.0.iter().rev() {
                let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
            }
            for l in &self.1 {
                let _ = Command::new("losetup").args(["-d", l]).status();
            }
        }
    }
    let d = tempfile::tempdir().unwrap();
    let mut undo = Undo(Vec::new(), Vec::new());
    let mut xfs = |name: &str| {
        let img = d.path().join(format!("{name}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(320 * 1024 * 1024)
            .unwrap();
        assert!(Command::new("mkfs.xfs")
            .args(["-q"])
            .arg(&img)
            .status()
            .unwrap()
            .success());
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        undo.1.push(dev.clone());
        std::path::PathBuf::from(dev)
    };
    let fresh = xfs("fresh");
    let used = xfs("used");
    let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV;
    // An earlier boot's STATE: its configuration on it.
    let prep = d.path().join("prep");
    std::fs::create_dir(&prep).unwrap();
    nix::mount::mount(Some(&used), &prep, Some("xfs"), flags, None::<&str>).unwrap();
    std::fs::write(prep.join("config.ns"), "patched").unwrap();
    nix::mount::umount(&prep).unwrap();

    for (dev, want) in [(&fresh, "fetched again"), (&used, "patched")] {
        let target = d.path().join(format!(
            "state-{}",
            dev.file_name().unwrap().to_string_lossy()
        ));
        let staging = d.path().join("staging");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&target, Some(BLOCKD), Some(BLOCKD)).unwrap();
        std::fs::write(target.join("config.ns"), "fetched again").unwrap();
        init::volumes::adopt_state(dev, &target, &staging, flags).unwrap();
        undo.0.push(target.clone());
        assert_eq!(
            std::fs::read_to_string(target.join("config.ns")).unwrap(),
            want
        );
        let m = std::fs::metadata(&target).unwrap();
        assert_eq!(
            (m.uid(), m.mode() & 0o7777),
            (BLOCKD, 0o700),
            "the directory's owner and mode"
        );
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert_eq!(
            init::volumes::mounted_at(&info, &target.to_string_lossy()).map(|(_, fs)| fs),
            Some("xfs".to_string())
        );
    }
}

/// (uid, gid, mode) of a node.
fn owner(node: &Path) -> (u32, u32, u32) {
    let m = std::fs::metadata(node).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

const PROTECTED: (u32, u32, u32) = (0, 0, 0o600);
const BLOCKDS: (u32, u32, u32) = (0, BLOCKD, 0o660);

/// A unit running `program` as `uid`, landlocked to the system's programs and `rules`.
fn launch(
    program: &str,
    args: &[&str],
    uid: u32,
    rules: &[(&Path, sandbox::PathAccess)],
) -> Launch {
    let rule = |path: &Path, access| sandbox::PathRule {
        path: path.to_path_buf(),
        access,
    };
    let mut paths = vec![
        rule(Path::new("/usr"), sandbox::PathAccess::Exec),
        rule(Path::new("/etc/ld.so.cache"), sandbox::PathAccess::ReadOnly),
    ];
    if Path::new("/lib64").exists() {
        paths.push(rule(Path::new("/lib64"), sandbox::PathAccess::Exec));
    }
    paths.extend(rules.iter().map(|(p, a)| rule(p, *a)));
    Launch {
        program: program.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        policy: sandbox::Policy {
            uid,
            gid: uid,
            supplementary_groups: vec![],
            capabilities: sandbox::CapSet::default(),
            landlock: sandbox::LandlockPolicy {
                paths,
                ..Default::default()
            },
            seccomp: sandbox::SeccompPolicy::Unconfined,
            env: Default::default(),
            fds: Default::default(),
            working_dir: "/".into(),
            umask: 0o077,
        },
        readiness: init::manifest::Readiness::Exec,
        listen: None,
        restart: init::manifest::RestartPolicy {
            backoff_ms: 100,
            max_backoff_ms: 1000,
            reset_after_ms: 10_000,
        },
        restart_always: true,
        stop_timeout: Duration::from_secs(5),
        ready_timeout: Duration::from_secs(10),
        audit: None,
    }
}

/// Waits (20 s at most) until `f` holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The node a process's fd points to, if it is open.
fn fd_target(pid: i32, fd: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
}

/// A partitioned loop disk (GPT: EPHEMERAL, STATE, DATA) whose STATE partition is mounted as
/// STATE: while blockd runs (a stand-in of it, as blockd's uid, holding the whole disk open as
/// a compromised blockd would), the resync protects STATE's partition and the disk and
/// restarts blockd, whose next run cannot open the disk again; a service whose rules reach
/// them is stopped, one beside them runs on. EPHEMERAL mounted next is protected by the mount
/// code's call at once. A fresh controller's resyncs never give them back, and blockd's uid
/// then opens DATA but neither system partition nor the disk (EACCES).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_system_volume_and_its_disk_are_no_daemons_and_blockd_keeps_no_fd() {
    if !testkit::require_root("it attaches a loop device, mounts and switches uids")
        || !testkit::require_program("setpriv", "apt-get install util-linux")
        || !testkit::require_program("sfdisk", "apt-get install fdisk")
        || !testkit::require_program("mkfs.ext4", "apt-get install e2fsprogs")
    {
        return;
    }
    let _one = SERIAL.lock().await;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let img = d.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(48 * 1024 * 1024)
        .unwrap();
    let mut sfdisk = Command::new("sfdisk")
        .args(["-q"])
        .arg(&img)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\nsize=8M, name=EPHEMERAL\nsize=8M, name=STATE\nname=DATA\n")
        .unwrap();
    assert!(sfdisk.wait().unwrap().success());
    let out = Command::new("losetup")
        .args(["-f", "-P", "--show"])
        .arg(&img)
        .output()
        .unwrap();
    if !out.status.success() {
        testkit::skip("no loop device could be attached (losetup -f)");
        return;
    }
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Undone last: the mounts, then the loop device.
    struct Undo(String, Vec<PathBuf>);
    impl Drop for Undo {
        fn drop(&mut self) {
            for m in self.1.iter().rev() {
                let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
            }
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let mut undo = Undo(loopdev.clone(), Vec::new());
    let disk = loopdev.trim_start_matches("/dev/").to_string();
    let part = |n: u32| format!("{disk}p{n}");
    let class = Path::new("/sys/class/block");
    // The kernel lists a loop disk's partitions itself when it reads GPT; otherwise partx
    // tells it about them.
    let listed = || (1..=3).all(|n| class.join(part(n)).exists());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !listed() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !listed() {
        let _ = Command::new("partx").arg("-a").arg(&loopdev).status();
    }
    if !listed() {
        testkit::skip("the loop disk's partitions are not listed (no GPT support, no partx)");
        return;
    }

    // The test's /sys/class/block (links to the kernel's) and /dev (nodes as devtmpfs makes
    // them: root 0600).
    let sys = d.path().join("sys");
    let dev = d.path().join("dev");
    std::fs::create_dir_all(&sys).unwrap();
    std::fs::create_dir(&dev).unwrap();
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o755)).unwrap();
    let names = [disk.clone(), part(1), part(2), part(3)];
    for name in &names {
        std::os::unix::fs::symlink(class.join(name), sys.join(name)).unwrap();
        let mm = std::fs::read_to_string(class.join(name).join("dev")).unwrap();
        let (maj, min) = mm.trim().split_once(':').unwrap();
        assert!(Command::new("mknod")
            .args(["-m", "0600"])
            .arg(dev.join(name))
            .args(["b", maj, min])
            .status()
            .unwrap()
            .success());
    }
    let node = |name: &str| dev.join(name);
    let (whole, ephemeral, state, data) =
        (node(&disk), node(&part(1)), node(&part(2)), node(&part(3)));
    for p in [&ephemeral, &state] {
        assert!(Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(p)
            .status()
            .unwrap()
            .success());
    }
    let targets: Vec<(String, PathBuf)> = [("STATE", "state"), ("EPHEMERAL", "var")]
        .iter()
        .map(|(v, dir)| (v.to_string(), d.path().join(dir)))
        .collect();
    for (_, t) in &targets {
        std::fs::create_dir(t).unwrap();
    }
    let access = |blockd: bool| {
        Arc::new(DeviceAccess::new(
            blockd.then(|| ("blockd".to_string(), BLOCKD)),
            sys.clone(),
            "/sys/dev/block".into(),
            dev.clone(),
            "/proc/self/mountinfo".into(),
            targets.clone(),
        ))
    };
    let devices = access(true);

    // init's reaper and supervisor, and the controller over them.
    let reaper = init::reaper::Reaper::new();
    let reaping = tokio::spawn(reaper.clone().run());
    let sup = Supervisor::new(reaper);
    // A failed test leaves no process behind (one holding the disk would keep it attached).
    struct Kill(Arc<Supervisor>);
    impl Drop for Kill {
        fn drop(&mut self) {
            self.0.begin_shutdown(); // none restarted
            for u in self.0.units() {
                let pid = u.snapshot().pid;
                if pid > 0 {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
    let _kill = Kill(sup.clone());
    let harness = stated::testing::Harness::start().await;
    let start_controller = |devices: Arc<DeviceAccess>| {
        let mut runtime = cosi::Runtime::new(harness.client.clone());
        runtime
            .register(init::controllers::BlockDeviceAccessController {
                devices,
                supervisor: Some(sup.clone()),
            })
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        (
            stop,
            tokio::spawn(async move { runtime.run(stopped).await }),
        )
    };
    let (stop, task) = start_controller(devices.clone());
    until("every node is blockd's", || {
        [&whole, &ephemeral, &state, &data]
            .iter()
            .all(|n| owner(n) == BLOCKDS)
    })
    .await;

    // blockd (as blockd's uid) holds the whole disk open as long as it runs, if it can open
    // it: `sleep 1000` with the disk as fd 3, else `sleep 1001`.
    let script = "if (exec 3<>\"$1\"); then exec /usr/bin/sleep 1000 3<>\"$1\"; else exec /usr/bin/sleep 1001; fi";
    let whole_s = whole.to_string_lossy().into_owned();
    sup.add(
        "blockd",
        UnitKind::Daemon,
        "",
        launch(
            "/bin/sh",
            &["-c", script, "blockd", &whole_s],
            BLOCKD,
            &[(&dev, sandbox::PathAccess::ReadWrite)],
        ),
        vec![],
        true,
    )
    .await;
    // Requested services of blockd's (as mkfs): one with a rule over the whole /dev, one with
    // its own partition only.
    let service_uid = 1_990_001_500;
    for (id, rule) in [("svc-dev", &dev), ("svc-data", &data)] {
        sup.add(
            id,
            UnitKind::Service,
            "blockd",
            launch(
                "/usr/bin/sleep",
                &["1000"],
                service_uid,
                &[(rule, sandbox::PathAccess::ReadWrite)],
            ),
            vec![],
            true,
        )
        .await;
    }
    let blockd = || sup.get("blockd").unwrap().snapshot();
    until("blockd holds the disk open", || {
        let pid = blockd().pid;
        pid > 0 && fd_target(pid, 3).as_deref() == Some(whole.as_path())
    })
    .await;
    let first = blockd();
    until("the services run", || {
        ["svc-dev", "svc-data"]
            .iter()
            .all(|id| sup.get(id).unwrap().snapshot().pid > 0)
    })
    .await;
    let data_svc = sup.get("svc-data").unwrap().snapshot();

    // STATE is mounted (a first boot: blockd runs): the resync protects it and its disk.
    let flags = nix::mount::MsFlags::MS_NOSUID
        | nix::mount::MsFlags::MS_NODEV
        | nix::mount::MsFlags::MS_NOEXEC;
    nix::mount::mount(
        Some(&state),
        &targets[0].1,
        Some("ext4"),
        flags,
        None::<&str>,
    )
    .unwrap();
    undo.1.push(targets[0].1.clone());
    until("STATE's partition and its disk are protected", || {
        owner(&state) == PROTECTED && owner(&whole) == PROTECTED
    })
    .await;
    assert_eq!(owner(&ephemeral), BLOCKDS, "not mounted yet: blockd's");
    assert_eq!(owner(&data), BLOCKDS, "beside them: blockd's");
    // blockd restarted: the process that held the disk is gone, the new one could not open it.
    until("blockd restarted", || {
        let now = blockd();
        now.pid > 0 && now.pid != first.pid && now.state == ServiceState::Running
    })
    .await;
    let second = blockd();
    assert_eq!(second.restarts, first.restarts + 1);
    until("the blockd that held the disk is gone", || {
        !Path::new(&format!("/proc/{}", first.pid)).exists()
    })
    .await;
    until("the new blockd runs its fallback", || {
        std::fs::read(format!("/proc/{}/cmdline", second.pid)).is_ok_and(|c| c.ends_with(b"1001\0"))
    })
    .await;
    assert_eq!(fd_target(second.pid, 3), None, "no fd of the disk");
    // The service that reached the disk was stopped and is refused; the other runs on.
    until("svc-dev stopped", || {
        let s = sup.get("svc-dev").unwrap().snapshot();
        s.state == ServiceState::Failed && s.pid == 0
    })
    .await;
    let refused = sup.get("svc-dev").unwrap().snapshot();
    assert!(
        refused.message.contains("stopped and refused")
            && refused.message.contains(&format!(
                "reaches {}, which is the disk that holds STATE",
                whole.display()
            )),
        "{}",
        refused.message
    );
    let e = sup.start("svc-dev").await.unwrap_err().to_string();
    assert!(e.contains("refused"), "{e}");
    assert_eq!(sup.get("svc-data").unwrap().snapshot().pid, data_svc.pid);

    // What services may not reach, on these real nodes: the node, a directory above it, a
    // symlink to it; a partition beside it is free.
    let protected = devices.protected();
    let alias = d.path().join("alias");
    std::os::unix::fs::symlink(&state, &alias).unwrap();
    for reached in [&state, &whole, &dev, &alias] {
        assert!(
            protected.reached_by(reached).is_some(),
            "{}",
            reached.display()
        );
    }
    assert_eq!(protected.reached_by(&data), None);

    // EPHEMERAL: the mount code protects right after its mount, without a resync, and blockd
    // (that could open it) is restarted before the call returns.
    nix::mount::mount(
        Some(&ephemeral),
        &targets[1].1,
        Some("ext4"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    undo.1.push(targets[1].1.clone());
    let _ = stop.send(());
    let _ = task.await;
    devices
        .protect_mounted("EPHEMERAL", &part(1), Some(&sup))
        .await
        .unwrap();
    assert_eq!(owner(&ephemeral), PROTECTED);
    let third = blockd();
    assert_eq!(third.restarts, second.restarts + 1, "{third:?}");
    assert_ne!(third.pid, second.pid);

    // A fresh controller (no claims: only what mountinfo says) never hands them back, and
    // restarts no one again.
    let (stop, task) = start_controller(access(true));
    tokio::time::sleep(init::controllers::DEVICE_RESYNC * 3).await;
    let _ = stop.send(());
    let _ = task.await;
    for n in [&whole, &state, &ephemeral] {
        assert_eq!(owner(n), PROTECTED, "{}", n.display());
    }
    assert_eq!(owner(&data), BLOCKDS);
    let last = blockd();
    assert_eq!((last.pid, last.restarts), (third.pid, third.restarts));

    // Everything stopped (the reaper too: the checks below run programs), then blockd's uid
    // tries to open each node.
    for id in ["blockd", "svc-dev", "svc-data"] {
        sup.remove(id).await;
    }
    reaping.abort();
    let _ = reaping.await;
    assert_eq!(open_as(BLOCKD, &data), Ok(()), "blockd's uid opens DATA");
    assert!(!can_open_as(NETWORKD, &data), "no other uid does");
    for n in [&whole, &state, &ephemeral] {
        let e = open_as(BLOCKD, n).unwrap_err();
        assert!(e.contains("Permission denied"), "{}: {e}", n.display());
    }
}
