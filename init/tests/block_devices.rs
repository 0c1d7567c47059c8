//! `runtime.BlockDeviceAccessController` on a real block device (a loop device, its node made
//! in the test's own /dev): the node is given to blockd's group (root:blockd 0660); blockd's
//! uid can then read and write it, another daemon's uid cannot; a symlink under a device's
//! name is never followed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BLOCKD: u32 = 1_990_000_015;
const NETWORKD: u32 = 1_990_000_011;

/// Whether `uid` (with its own gid as its only group) can open `node` for reading and writing.
fn can_open_as(uid: u32, node: &Path) -> bool {
    Command::new("setpriv")
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
        .status()
        .unwrap()
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_device_nodes_are_given_to_blockds_group_and_no_one_else() {
    if !testkit::require_root("it attaches a loop device and switches uids")
        || !testkit::require_program("setpriv", "apt-get install util-linux")
    {
        return;
    }
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
            gid: BLOCKD,
            sys_class_block: sys.clone(),
            dev: dev.clone(),
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
