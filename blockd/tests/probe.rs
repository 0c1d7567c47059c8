//! Probing real filesystems and partition tables made by the real tools (mkfs.xfs, mkfs.ext4,
//! mkfs.vfat, mkswap, sfdisk), checked against what blkid (util-linux) reads from the same
//! bytes; then blockd's controllers on a real loop device with its partitions (root only),
//! against a real stated.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use blockd::probe::{probe, superblock, Found};

const MIB: u64 = 1024 * 1024;

fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

fn tools() -> bool {
    for p in [
        "mkfs.xfs",
        "mkfs.ext4",
        "mkfs.vfat",
        "mkswap",
        "sfdisk",
        "blkid",
    ] {
        if !have(p) {
            testkit::skip(&format!(
                "{p} is not installed (scripts/install-deps.sh: xfsprogs, e2fsprogs, dosfstools, fdisk, util-linux)"
            ));
            return false;
        }
    }
    true
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sparse(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

/// `blkid -p -o export [-O offset] file` as a map.
fn blkid(path: &Path, offset: u64) -> BTreeMap<String, String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export", "-O", &offset.to_string()])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn assert_same_as_blkid(found: &Found, path: &Path, offset: u64) {
    let b = blkid(path, offset);
    let name = match b.get("TYPE").map(String::as_str) {
        Some("ext2" | "ext3" | "ext4") => found.name.clone(),
        Some(t) => t.to_string(),
        None => String::new(),
    };
    assert_eq!(
        found.name,
        name,
        "type of {} at {offset}: blkid {b:?}",
        path.display()
    );
    assert_eq!(Some(&found.uuid), b.get("UUID"), "uuid: blkid {b:?}");
    assert_eq!(
        found.label,
        b.get("LABEL").cloned().unwrap_or_default(),
        "label: blkid {b:?}"
    );
    if let Some(bs) = b.get("BLOCK_SIZE") {
        assert_eq!(
            found.filesystem_block_size.to_string(),
            *bs,
            "block size: blkid {b:?}"
        );
    }
}

fn probe_file(path: &Path) -> Found {
    probe(path, 512).unwrap_or_else(|e| panic!("probe {}: {e}", path.display()))
}

/// `dir/xfs.img`: 320 MiB, xfs labelled STATE by mkfs.xfs.
fn xfs_image(dir: &Path) -> PathBuf {
    let xfs = dir.join("xfs.img");
    sparse(&xfs, 320 * MIB);
    run(Command::new("mkfs.xfs")
        .args(["-q", "-L", "STATE"])
        .arg(&xfs));
    xfs
}

/// An xfs whose mkfs.xfs was stopped half-way keeps `sb_inprogress` set: it is no usable
/// filesystem (the kernel refuses to mount it), and the probe says so; a finished one does not.
#[test]
fn an_xfs_whose_mkfs_did_not_finish_is_incomplete() {
    if !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let xfs = xfs_image(d.path());
    let done = probe_file(&xfs);
    assert_eq!(done.name, "xfs");
    assert!(!done.incomplete, "{done:?}");
    // What mkfs.xfs writes first, before the rest: the flag at byte 126 of the superblock.
    use std::io::{Seek as _, Write as _};
    let mut f = std::fs::OpenOptions::new().write(true).open(&xfs).unwrap();
    f.seek(std::io::SeekFrom::Start(126)).unwrap();
    f.write_all(&[1]).unwrap();
    drop(f);
    let half = probe_file(&xfs);
    assert_eq!(half.name, "xfs");
    assert!(half.incomplete, "{half:?}");
}

#[test]
fn filesystems_read_as_blkid_reads_them() {
    if !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let xfs = xfs_image(d.path());
    let ext4 = d.path().join("ext4.img");
    sparse(&ext4, 64 * MIB);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "data"])
        .arg(&ext4));
    let vfat = d.path().join("vfat.img");
    sparse(&vfat, 64 * MIB);
    run(Command::new("mkfs.vfat")
        .args(["-F", "32", "-n", "EFI"])
        .arg(&vfat));
    let swap = d.path().join("swap.img");
    sparse(&swap, 16 * MIB);
    run(Command::new("mkswap").args(["-L", "sw"]).arg(&swap));
    let blank = d.path().join("blank.img");
    sparse(&blank, 16 * MIB);

    let f = probe_file(&xfs);
    assert_eq!((f.name.as_str(), f.label.as_str()), ("xfs", "STATE"));
    assert_eq!(f.block_size, 4096);
    assert!(
        f.probed_size > 300 * MIB && f.probed_size <= 320 * MIB,
        "{f:?}"
    );
    assert_same_as_blkid(&f, &xfs, 0);

    let f = probe_file(&ext4);
    assert_eq!((f.name.as_str(), f.label.as_str()), ("ext4", "data"));
    assert_eq!(f.probed_size, 64 * MIB);
    assert_same_as_blkid(&f, &ext4, 0);

    let f = probe_file(&vfat);
    assert_eq!((f.name.as_str(), f.label.as_str()), ("vfat", "EFI"));
    assert_same_as_blkid(&f, &vfat, 0);

    let f = probe_file(&swap);
    assert_eq!((f.name.as_str(), f.label.as_str()), ("swap", "sw"));
    assert_eq!(f.probed_size, 16 * MIB);
    assert_same_as_blkid(&f, &swap, 0);

    let f = probe_file(&blank);
    assert_eq!(f, Found::default(), "nothing on a blank device");
    assert!(superblock(&[0u8; 10]).is_none(), "a short read is nothing");
}

/// A 1 GiB image with a GPT of two partitions, STATE (xfs) and EPHEMERAL (xfs), made as a
/// partitioner and mkfs make them; returns the partitions' (start, size) in bytes.
fn gpt_image(path: &Path) -> Vec<(u64, u64)> {
    sparse(path, 1024 * MIB);
    let mut writer = Command::new("sfdisk")
        .args(["-q", "--label", "gpt"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    writer
        .stdin
        .take()
        .unwrap()
        .write_all(b"size=400MiB, name=STATE\nname=EPHEMERAL\n")
        .unwrap();
    assert!(writer.wait().unwrap().success());
    let table = sfdisk(path);
    let parts: Vec<(u64, u64)> = table
        .partitions
        .iter()
        .map(|p| (p.start * 512, p.size * 512))
        .collect();
    assert_eq!(parts.len(), 2, "{table:?}");
    for (i, (start, size)) in parts.iter().enumerate() {
        let fs = path.with_extension(format!("p{i}"));
        sparse(&fs, *size);
        let label = if i == 0 { "STATE" } else { "EPHEMERAL" };
        run(Command::new("mkfs.xfs").args(["-q", "-L", label]).arg(&fs));
        run(Command::new("dd")
            .arg(format!("if={}", fs.display()))
            .arg(format!("of={}", path.display()))
            .args(["bs=1M", "conv=sparse,notrunc", "status=none"])
            .arg(format!("seek={}", start / MIB)));
        std::fs::remove_file(&fs).unwrap();
    }
    parts
}

#[test]
fn a_gpt_and_the_filesystems_of_its_partitions() {
    if !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    let parts = gpt_image(&img);
    let f = probe_file(&img);
    assert_eq!(f.name, "gpt");
    let b = blkid(&img, 0);
    assert_eq!(b.get("PTTYPE").map(String::as_str), Some("gpt"), "{b:?}");
    assert_eq!(Some(&f.uuid), b.get("PTUUID"), "{b:?}");
    assert_eq!(f.partitions.len(), 2, "{f:?}");
    for (p, (start, size)) in f.partitions.iter().zip(&parts) {
        assert_eq!((p.offset, p.size), (*start, *size), "{p:?}");
        assert_eq!(p.found.name, "xfs");
        assert_same_as_blkid(&p.found, &img, *start);
    }
    assert_eq!(f.partitions[0].label, "STATE");
    assert_eq!(f.partitions[1].label, "EPHEMERAL");
    assert_eq!(f.partitions[0].index, 1);
    // Linux filesystem data, as sfdisk's default type.
    assert_eq!(
        f.partitions[0].type_uuid,
        "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
    );
    let table = sfdisk(&img);
    assert_eq!(table.partitions[1].uuid, f.partitions[1].uuid, "{table:?}");
}

/// A loop device attached to `image` with its partitions scanned; detached on drop.
struct Loop(String);

impl Loop {
    fn attach(image: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show", "-P"])
            .arg(image)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| Loop(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    /// `size` bytes of `image` from `offset` as a loop device of its own.
    fn attach_range(image: &Path, offset: u64, size: u64) -> Option<Loop> {
        let out = Command::new("losetup")
            .args([
                "-f",
                "--show",
                "-o",
                &offset.to_string(),
                "--sizelimit",
                &size.to_string(),
            ])
            .arg(image)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| Loop(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    fn name(&self) -> &str {
        self.0.trim_start_matches("/dev/")
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blockd_describes_a_loop_disk_and_discovers_its_partitions() {
    if !testkit::require_root("it attaches a loop device") || !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    let parts = gpt_image(&img);
    let Some(dev) = Loop::attach(&img) else {
        testkit::skip("no loop device could be attached (losetup -f)");
        return;
    };
    let name = dev.name().to_string();
    // Only this disk: a directory of sysfs links naming it alone (the host's disks are not
    // the test's).
    let sys = d.path().join("sys-block");
    std::fs::create_dir(&sys).unwrap();
    std::os::unix::fs::symlink(Path::new("/sys/block").join(&name), sys.join(&name)).unwrap();

    let harness = stated::testing::Harness::start().await;
    let client = harness.client.clone();
    client
        .define_types(&machinery::resources::block::definitions(), "blockd")
        .await
        .unwrap();
    client
        .define_types(&machinery::resources::runtime::definitions(), "init")
        .await
        .unwrap();
    // As init reports a VM: blockd then wants its system volumes.
    let machine = cosi::Resource::new(
        machinery::resources::runtime::NAMESPACE,
        machinery::resources::runtime::MACHINE_STATUS_ID,
        machinery::resources::runtime::MachineStatusSpec {
            mode: "vm".into(),
            ..Default::default()
        },
    );
    client.create(&machine.to_raw().unwrap(), "").await.unwrap();
    let options = blockd::controllers::Options {
        sys_block: sys.clone(),
        dev: PathBuf::from("/dev"),
        any_mode: true,
        format: blockd::volumes::FormatOptions::default(),
    };
    let runtime = cosi::Runtime::with_registry(
        client.clone(),
        blockd::controllers::registry(&options).unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move { runtime.run(stopped).await.expect("runtime") });

    use machinery::resources::block::{DiscoveredVolumeSpec, DiskSpec, NAMESPACE};
    let deadline = Instant::now() + Duration::from_secs(30);
    let (disk, volumes) = loop {
        let disk = client.get_typed::<DiskSpec>(NAMESPACE, &name).await.ok();
        let volumes: BTreeMap<String, DiscoveredVolumeSpec> = client
            .list_typed::<DiscoveredVolumeSpec>(NAMESPACE)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.metadata.id.clone(), r.spec))
            .collect();
        if let (Some(disk), 3) = (&disk, volumes.len()) {
            break (disk.spec.clone(), volumes);
        }
        assert!(
            Instant::now() < deadline,
            "disk {disk:?}, volumes {volumes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(disk.dev_path, format!("/dev/{name}"));
    assert_eq!(disk.size, 1024 * MIB);
    assert_eq!(disk.transport, "loop");
    assert_eq!(disk.pretty_size, "1.1 GB");
    let whole = &volumes[&name];
    assert_eq!((whole.kind.as_str(), whole.name.as_str()), ("disk", "gpt"));
    let p1 = &volumes[&format!("{name}p1")];
    assert_eq!(p1.kind, "partition");
    assert_eq!(p1.parent, name);
    assert_eq!(p1.name, "xfs");
    assert_eq!(p1.label, "STATE");
    assert_eq!(p1.partition_label, "STATE");
    assert_eq!(p1.partition_index, 1);
    // The kernel's own partition devices (loop partition scanning) exist on some hosts only:
    // where they do, the volume names its sysfs directory.
    if Path::new("/sys/block")
        .join(&name)
        .join(format!("{name}p1"))
        .exists()
    {
        assert!(p1.device_path.starts_with("/sys/devices/"), "{p1:?}");
    } else {
        assert_eq!(p1.device_path, "", "{p1:?}");
    }
    let p2 = &volumes[&format!("{name}p2")];
    assert_eq!((p2.name.as_str(), p2.label.as_str()), ("xfs", "EPHEMERAL"));

    // The system volumes are located on it by their CEL locators, both ready (xfs as wanted).
    use machinery::resources::block::VolumeStatusSpec;
    let status = |id: &'static str| {
        let client = client.clone();
        async move {
            client
                .get_typed::<VolumeStatusSpec>(NAMESPACE, id)
                .await
                .ok()
                .map(|r| r.spec)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, e) = (status("STATE").await, status("EPHEMERAL").await);
        if let (Some(s), Some(e)) = (&s, &e) {
            if s.phase == "ready" && e.phase == "ready" {
                assert_eq!(s.location, format!("/dev/{name}p1"));
                assert_eq!(s.filesystem, "xfs");
                assert_eq!(s.uuid, p1.uuid);
                assert_eq!(e.location, format!("/dev/{name}p2"));
                break;
            }
        }
        assert!(Instant::now() < deadline, "STATE {s:?}, EPHEMERAL {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A partition wiped from outside (its superblock zeroed through the loop device, as a
    // writer would) is seen blank at a later probe; its partition entry stays.
    run(Command::new("dd")
        .args([
            "if=/dev/zero",
            "bs=4096",
            "count=16",
            "conv=notrunc,fsync",
            "status=none",
        ])
        .arg(format!("of={}", dev.0))
        .arg("oflag=seek_bytes")
        .arg(format!("seek={}", parts[1].0)));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p2 = client
            .get_typed::<DiscoveredVolumeSpec>(NAMESPACE, &format!("{name}p2"))
            .await
            .unwrap()
            .spec;
        if p2.name.is_empty() {
            assert_eq!(p2.partition_label, "EPHEMERAL");
            break;
        }
        assert!(Instant::now() < deadline, "still {p2:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // EPHEMERAL is then blank: located, not formatted (the machine is not configured: its
    // stage is not running, and blockd writes no disk before).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let e = status("EPHEMERAL").await;
        if let Some(e) = e.as_ref().filter(|e| e.phase == "located") {
            assert!(
                e.error_message.contains("once the machine is configured"),
                "{e:?}"
            );
            assert_eq!(e.filesystem, "");
            break;
        }
        assert!(Instant::now() < deadline, "EPHEMERAL {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
}

#[test]
fn a_hostile_gpt_header_is_refused_not_read() {
    if !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    gpt_image(&img);
    // The primary header declares 2^32-1 entries (its CRC made right, as an attacker would).
    let mut bytes = std::fs::read(&img).unwrap();
    let h = 512;
    bytes[h + 80..h + 84].copy_from_slice(&u32::MAX.to_le_bytes());
    bytes[h + 16..h + 20].copy_from_slice(&[0; 4]);
    let crc = crc32(&bytes[h..h + 92]);
    bytes[h + 16..h + 20].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&img, &bytes).unwrap();
    match probe(&img, 512) {
        Err(blockd::probe::ProbeError::Unsupported { reason, .. }) => {
            assert!(reason.contains("4294967295 entries"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// CRC-32 (IEEE), as the GPT header's.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The system volumes' partition specs (STATE 100 MiB, EPHEMERAL the rest).
fn system_partitions() -> Vec<machinery::resources::block::PartitionSpec> {
    blockd::volumes::system_volumes()
        .into_iter()
        .map(|(_, v)| v.provisioning.partition_spec)
        .collect()
}

#[test]
fn a_blank_disk_gets_the_system_partitions_as_sfdisk_reads_them() {
    if !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    sparse(&img, 3 * 1024 * MIB);
    let created = blockd::provision::partition_blank_disk(&img, 512, &system_partitions()).unwrap();
    assert_eq!(created.len(), 2, "{created:?}");
    assert_eq!((created[0].index, created[0].label.as_str()), (1, "STATE"));
    assert_eq!(created[0].size, 100 * MIB);
    assert_eq!(created[0].offset % MIB, 0, "aligned");
    assert_eq!(created[1].label, "EPHEMERAL");
    assert!(created[1].size >= 2048 * MIB, "{created:?}");
    // What sfdisk (util-linux) reads from it: a GPT, the same two partitions.
    let table = sfdisk(&img);
    assert_eq!(table.label, "gpt");
    let read: Vec<(&str, u64, u64, &str)> = table
        .partitions
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.start * 512,
                p.size * 512,
                p.kind.as_str(),
            )
        })
        .collect();
    let linux = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
    assert_eq!(
        read,
        [
            ("STATE", created[0].offset, created[0].size, linux),
            ("EPHEMERAL", created[1].offset, created[1].size, linux)
        ],
        "{created:?}"
    );
    let verify = Command::new("sfdisk")
        .arg("--verify")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    // Our own probe reads it back; a second run refuses (not blank any more).
    let f = probe_file(&img);
    assert_eq!(f.name, "gpt");
    assert_eq!(f.partitions.len(), 2);
    let again = blockd::provision::partition_blank_disk(&img, 512, &system_partitions());
    assert!(
        matches!(again, Err(blockd::provision::ProvisionError::NotBlank { ref found, .. }) if found == "gpt"),
        "{again:?}"
    );
}

#[test]
fn a_disk_with_something_on_it_is_never_partitioned() {
    if !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    sparse(&img, 3 * 1024 * MIB);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "data"])
        .arg(&img));
    let before = std::fs::read(&img).unwrap();
    let r = blockd::provision::partition_blank_disk(&img, 512, &system_partitions());
    assert!(
        matches!(r, Err(blockd::provision::ProvisionError::NotBlank { ref found, .. }) if found == "ext4"),
        "{r:?}"
    );
    assert!(std::fs::read(&img).unwrap() == before, "the disk changed");

    // Too small for EPHEMERAL's 2 GiB: refused, and nothing written.
    let small = d.path().join("small.img");
    sparse(&small, 1024 * MIB);
    let r = blockd::provision::partition_blank_disk(&small, 512, &system_partitions());
    assert!(
        matches!(r, Err(blockd::provision::ProvisionError::NoSpace { ref label, .. }) if label == "EPHEMERAL"),
        "{r:?}"
    );
    assert_eq!(probe_file(&small), Found::default(), "nothing written");
}

#[test]
fn a_blank_loop_device_is_partitioned_through_the_device() {
    if !testkit::require_root("it attaches a loop device") || !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    sparse(&img, 3 * 1024 * MIB);
    let Some(dev) = Loop::attach(&img) else {
        testkit::skip("no loop device could be attached (losetup -f)");
        return;
    };
    let created =
        blockd::provision::partition_blank_disk(Path::new(&dev.0), 512, &system_partitions())
            .unwrap();
    assert_eq!(created.len(), 2);
    // Through the device's own table (sfdisk reads the device), and in the backing file.
    for target in [PathBuf::from(&dev.0), img.clone()] {
        let names: Vec<String> = sfdisk(&target)
            .partitions
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["STATE", "EPHEMERAL"], "{}", target.display());
    }
}

/// A partition table as `sfdisk --json` (util-linux) reads it.
#[derive(Debug, serde::Deserialize)]
struct Table {
    label: String,
    #[serde(default)]
    partitions: Vec<TablePartition>,
}

/// One of its partitions (start and size in 512-byte sectors).
#[derive(Debug, serde::Deserialize)]
struct TablePartition {
    start: u64,
    size: u64,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    name: String,
}

/// `sfdisk --json path`.
fn sfdisk(path: &Path) -> Table {
    #[derive(serde::Deserialize)]
    struct Doc {
        partitiontable: Table,
    }
    let out = Command::new("sfdisk")
        .arg("--json")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sfdisk --json {}: {out:?}",
        path.display()
    );
    serde_json::from_slice::<Doc>(&out.stdout)
        .unwrap_or_else(|e| panic!("sfdisk --json {}: {e}", path.display()))
        .partitiontable
}

/// The volume manager on a blank loop disk of a configured VM: nothing written while the
/// machine is not configured; then a GPT with STATE and EPHEMERAL (the kernel re-reads it), and
/// a mkfs.xfs service asked for each. The test runs each requested mkfs as init would (the
/// spec's own binary and arguments; init's sandboxing of it is tested in the VM) and reports it
/// finished: both volumes are then ready, with the UUIDs blkid reads. A second blockd adopts
/// them: nothing is formatted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blank_loop_disk_gets_the_system_volumes_only_once_configured() {
    use machinery::resources::block::{VolumeStatusSpec, NAMESPACE};
    use machinery::resources::runtime::{
        MachineStage, MachineStatusSpec, ServiceSpecSpec, ServiceState, ServiceStatusSpec,
        UnitKind, MACHINE_STATUS_ID, NAMESPACE as RUNTIME,
    };
    if !testkit::require_root("it attaches a loop device") || !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    sparse(&img, 3 * 1024 * MIB);
    let Some(dev) = Loop::attach(&img) else {
        testkit::skip("no loop device could be attached (losetup -f)");
        return;
    };
    let name = dev.name().to_string();
    let sys = d.path().join("sys-block");
    std::fs::create_dir(&sys).unwrap();
    std::os::unix::fs::symlink(Path::new("/sys/block").join(&name), sys.join(&name)).unwrap();
    // The test's own /dev (this host's /dev has no nodes for loop partitions): the nodes of
    // the disk and of the partitions the kernel lists, made as devtmpfs makes them.
    let devdir = d.path().join("dev");
    std::fs::create_dir(&devdir).unwrap();
    let nodes = {
        let devdir = devdir.clone();
        let name = name.clone();
        move || {
            let sysdisk = Path::new("/sys/block").join(&name);
            let mut names = vec![name.clone()];
            for e in std::fs::read_dir(&sysdisk).unwrap().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&name) {
                    names.push(n);
                }
            }
            for n in names {
                let node = devdir.join(&n);
                let sysdev = if n == name {
                    sysdisk.join("dev")
                } else {
                    sysdisk.join(&n).join("dev")
                };
                if node.exists() {
                    continue;
                }
                let Ok(mm) = std::fs::read_to_string(&sysdev) else {
                    continue;
                };
                let (maj, min) = mm.trim().split_once(':').unwrap();
                run(Command::new("mknod").arg(&node).args(["b", maj, min]));
            }
        }
    };
    nodes();

    let harness = stated::testing::Harness::start().await;
    let client = harness.client.clone();
    client
        .define_types(&machinery::resources::block::definitions(), "blockd")
        .await
        .unwrap();
    client
        .define_types(&machinery::resources::runtime::definitions(), "init")
        .await
        .unwrap();
    let machine = |stage| {
        cosi::Resource::new(
            RUNTIME,
            MACHINE_STATUS_ID,
            MachineStatusSpec {
                mode: "vm".into(),
                stage,
                ..Default::default()
            },
        )
        .to_raw()
        .unwrap()
    };
    client
        .create(&machine(MachineStage::Maintenance), "")
        .await
        .unwrap();
    let mkfs = PathBuf::from("/usr/sbin/mkfs.xfs");
    // The configuration names the install disk (upstream's machine.install.disk).
    install_disk(&client, &devdir.join(&name).to_string_lossy()).await;
    let options = blockd::controllers::Options {
        sys_block: sys.clone(),
        dev: devdir.clone(),
        any_mode: true,
        format: blockd::volumes::FormatOptions {
            mkfs_xfs: mkfs.clone(),
            uid: 1_990_001_500,
            blkid: blockd::blkid::BlkidOptions {
                binary: "/usr/sbin/blkid".into(),
                uid: 1_990_001_501,
            },
        },
    };
    let start = |client: cosi::Client| {
        let runtime =
            cosi::Runtime::with_registry(client, blockd::controllers::registry(&options).unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move { runtime.run(stopped).await.expect("runtime") });
        (stop, task)
    };
    let (stop, task) = start(client.clone());
    let statuses = || {
        let client = client.clone();
        async move {
            client
                .list_typed::<VolumeStatusSpec>(NAMESPACE)
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.metadata.id.clone(), r.spec))
                .collect::<BTreeMap<String, VolumeStatusSpec>>()
        }
    };
    let wait = |what: &'static str, ok: fn(&BTreeMap<String, VolumeStatusSpec>) -> bool| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = statuses().await;
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: {s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // In maintenance: missing, said why, and the disk untouched.
    let s = wait("missing in maintenance", |s| {
        s.len() == 2 && s.values().all(|v| v.phase == "missing")
    })
    .await;
    assert!(
        s["STATE"]
            .error_message
            .contains("before the machine is configured"),
        "{s:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let head = std::fs::read(&img).unwrap();
    assert!(
        head[..2 * MIB as usize].iter().all(|&b| b == 0),
        "the disk was written in maintenance"
    );

    // Configured: partitioned, and a mkfs service asked for each volume.
    let current = client
        .get(
            RUNTIME,
            <MachineStatusSpec as cosi::ResourceSpec>::TYPE,
            MACHINE_STATUS_ID,
        )
        .await
        .unwrap();
    let mut running = machine(MachineStage::Running);
    running.metadata.version = current.metadata.version;
    client.update(&running, "", None).await.unwrap();
    // blkid is asked about the disk first; as init, run it and report how it ended.
    let verdict = run_blkid_as_init(&client, &format!("blkid-{name}")).await;
    assert_eq!(verdict, "exit 2", "blkid found nothing on the blank disk");
    wait("partitioned", |s| {
        s.len() == 2 && s.values().all(|v| !v.partition_uuid.is_empty())
    })
    .await;
    // The partitions' devices: the kernel's where it makes them for a loop device (BLKRRPART,
    // asked by blockd); on hosts where it does not, each partition's range of the image as a
    // loop device of its own under the partition's name (what the kernel would give).
    let table = sfdisk(&img);
    let mut part_loops = Vec::new();
    tokio::time::sleep(Duration::from_millis(500)).await;
    if Path::new("/sys/block")
        .join(&name)
        .join(format!("{name}p2"))
        .exists()
    {
        nodes();
    } else {
        for (i, p) in table.partitions.iter().enumerate() {
            let l = Loop::attach_range(&img, p.start * 512, p.size * 512)
                .expect("a loop device for a partition");
            let mm = std::fs::read_to_string(Path::new("/sys/block").join(l.name()).join("dev"))
                .unwrap();
            let (maj, min) = mm.trim().split_once(':').unwrap();
            run(Command::new("mknod")
                .arg(devdir.join(format!("{name}p{}", i + 1)))
                .args(["b", maj, min]));
            part_loops.push(l);
        }
    }
    let s = wait("formatting", |s| {
        s.len() == 2 && s.values().all(|v| v.phase == "prepared")
    })
    .await;
    let part = |i: u32| {
        devdir
            .join(format!("{name}p{i}"))
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(s["STATE"].location, part(1), "{s:?}");
    assert_eq!(s["EPHEMERAL"].location, part(2), "{s:?}");
    let names: Vec<&str> = table.partitions.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["STATE", "EPHEMERAL"]);
    let specs: BTreeMap<String, ServiceSpecSpec> = client
        .list_typed::<ServiceSpecSpec>(NAMESPACE)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.metadata.id.clone(), r.spec))
        .collect();
    assert_eq!(
        specs.keys().collect::<Vec<_>>(),
        ["mkfs-ephemeral", "mkfs-state"]
    );
    let state = &specs["mkfs-state"];
    assert_eq!(state.binary, mkfs.to_string_lossy());
    assert_eq!(
        state.args,
        ["-n", "ftype=1", "-L", "STATE", "--unsupported", &part(1)]
    );
    assert!(!state.args.iter().any(|a| a == "-f"), "never forced");
    assert!(!state.restart && state.seccomp_profile == "mkfs");
    assert!(
        state
            .paths
            .iter()
            .any(|p| p.path == part(1) && p.access == "read-write"),
        "{state:?}"
    );
    assert!(
        !state
            .paths
            .iter()
            .any(|p| p.access == "read-write" && p.path != part(1)),
        "only its partition is writable: {state:?}"
    );
    // blockd dies while mkfs runs (as init shows it, running): another blockd keeps the
    // services asked (withdrawing them would stop mkfs half-way) and waits for their end.
    for id in specs.keys() {
        let st = cosi::Resource::new(
            RUNTIME,
            id,
            ServiceStatusSpec {
                kind: UnitKind::Service,
                requested_by: "blockd".into(),
                state: ServiceState::Running,
                pid: 1,
                ..Default::default()
            },
        );
        client.create(&st.to_raw().unwrap(), "").await.unwrap();
    }
    task.abort();
    let _ = task.await;
    drop(stop);
    let (stop, task) = start(client.clone());
    let s = wait("waiting after a restart", |s| {
        s.len() == 2
            && s.values()
                .all(|v| v.phase == "prepared" && v.error_message.contains("before a restart"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept: Vec<String> = client
        .list_typed::<ServiceSpecSpec>(NAMESPACE)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.metadata.id.clone())
        .collect();
    assert_eq!(kept, ["mkfs-ephemeral", "mkfs-state"], "{s:?}");
    // As init: run each, report it finished.
    for (id, spec) in &specs {
        let out = Command::new(&spec.binary)
            .args(&spec.args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{id}: {out:?}");
        let mut st = cosi::Resource::new(
            RUNTIME,
            id,
            ServiceStatusSpec {
                kind: UnitKind::Service,
                requested_by: "blockd".into(),
                state: ServiceState::Finished,
                last_exit: "exit 0".into(),
                ..Default::default()
            },
        )
        .to_raw()
        .unwrap();
        st.metadata.version = client
            .get(RUNTIME, <ServiceStatusSpec as cosi::ResourceSpec>::TYPE, id)
            .await
            .unwrap()
            .metadata
            .version;
        client.update(&st, "", None).await.unwrap();
    }
    let s = wait("ready", |s| {
        s.len() == 2 && s.values().all(|v| v.phase == "ready")
    })
    .await;
    for (p, id) in table.partitions.iter().zip(["STATE", "EPHEMERAL"]) {
        let b = blkid(&img, p.start * 512);
        assert_eq!(b["TYPE"], "xfs", "{b:?}");
        assert_eq!(b["LABEL"], id, "{b:?}");
        assert_eq!(b["UUID"], s[id].uuid, "{b:?} vs {s:?}");
    }
    // The services are withdrawn once done.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client
        .list_typed::<ServiceSpecSpec>(NAMESPACE)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "mkfs specs left behind");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    task.await.unwrap();

    // Another blockd (a restart): the same volumes, ready, nothing asked to be formatted.
    let (stop, task) = start(client.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = wait("ready again", |s| {
        s.len() == 2 && s.values().all(|v| v.phase == "ready")
    })
    .await;
    assert_eq!(again["STATE"].uuid, s["STATE"].uuid);
    assert_eq!(again["EPHEMERAL"].uuid, s["EPHEMERAL"].uuid);
    assert!(client
        .list_typed::<ServiceSpecSpec>(NAMESPACE)
        .await
        .unwrap()
        .is_empty());
    let _ = stop.send(());
    task.await.unwrap();
}

/// `config-redacted/MachineConfigs/v1alpha1` naming `disk` as the install disk.
async fn install_disk(client: &cosi::Client, disk: &str) {
    use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
    let text = format!(
        "version: v1alpha1\nmachine:\n  type: controlplane\n  install:\n    disk: {disk}\n"
    );
    let r = cosi::Resource::new(REDACTED_NAMESPACE, ACTIVE_ID, MachineConfigSpec(text));
    client.create(&r.to_raw().unwrap(), "").await.unwrap();
}

/// As init: waits for blockd's blkid service `id`, runs the real blkid with its arguments and
/// reports the run's end in its status (what it printed, how it exited). Returns `exit N`.
async fn run_blkid_as_init(client: &cosi::Client, id: &str) -> String {
    use machinery::resources::block::NAMESPACE;
    use machinery::resources::runtime::{
        ServiceSpecSpec, ServiceState, ServiceStatusSpec, UnitKind, NAMESPACE as RUNTIME,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let spec = loop {
        if let Ok(r) = client.get_typed::<ServiceSpecSpec>(NAMESPACE, id).await {
            break r.spec;
        }
        assert!(Instant::now() < deadline, "blkid was never asked ({id})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(spec.binary, "/usr/sbin/blkid");
    assert_eq!(spec.capabilities, ["CAP_DAC_READ_SEARCH"]);
    assert!(!spec.restart && spec.seccomp_profile == "blkid");
    let out = Command::new(&spec.binary)
        .args(&spec.args)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    let exit = format!("exit {code}");
    let st = cosi::Resource::new(
        RUNTIME,
        id,
        ServiceStatusSpec {
            kind: UnitKind::Service,
            requested_by: "blockd".into(),
            state: if code == 0 {
                ServiceState::Finished
            } else {
                ServiceState::Failed
            },
            last_exit: exit.clone(),
            output: String::from_utf8_lossy(&out.stdout).into_owned(),
            ..Default::default()
        },
    );
    client.create(&st.to_raw().unwrap(), "").await.unwrap();
    // blockd withdraws it once it read the verdict; as init, the status goes with it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .get_typed::<ServiceSpecSpec>(NAMESPACE, id)
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "{id} was never withdrawn");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client
        .destroy(
            RUNTIME,
            <ServiceStatusSpec as cosi::ResourceSpec>::TYPE,
            id,
            "",
        )
        .await
        .unwrap();
    exit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_with_an_mbr_and_data_is_never_written_and_only_the_install_disk_is() {
    use machinery::resources::block::{VolumeStatusSpec, NAMESPACE};
    use machinery::resources::runtime::{
        MachineStage, MachineStatusSpec, ServiceSpecSpec, MACHINE_STATUS_ID, NAMESPACE as RUNTIME,
    };
    if !testkit::require_root("it attaches loop devices") || !tools() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    // A: blank. B: an MBR with one partition and data in it (what blockd's own probe does not
    // read: no GPT, no filesystem it knows).
    let a_img = d.path().join("a.img");
    let b_img = d.path().join("b.img");
    sparse(&a_img, 3 * 1024 * MIB);
    sparse(&b_img, 3 * 1024 * MIB);
    let mut sf = Command::new("sfdisk")
        .args(["-q", "--label", "dos"])
        .arg(&b_img)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    sf.stdin
        .take()
        .unwrap()
        .write_all(b"start=2048, type=83\n")
        .unwrap();
    assert!(sf.wait().unwrap().success());
    {
        use std::io::{Seek as _, SeekFrom};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&b_img)
            .unwrap();
        f.seek(SeekFrom::Start(5 * MIB)).unwrap();
        f.write_all(&[0xA5; 4096]).unwrap();
    }
    let b_before = std::fs::read(&b_img).unwrap();
    let (Some(a), Some(b)) = (Loop::attach(&a_img), Loop::attach(&b_img)) else {
        testkit::skip("no loop device could be attached (losetup -f)");
        return;
    };
    let sys = d.path().join("sys-block");
    let devdir = d.path().join("dev");
    std::fs::create_dir(&sys).unwrap();
    std::fs::create_dir(&devdir).unwrap();
    for l in [&a, &b] {
        let name = l.name();
        std::os::unix::fs::symlink(Path::new("/sys/block").join(name), sys.join(name)).unwrap();
        let mm = std::fs::read_to_string(Path::new("/sys/block").join(name).join("dev")).unwrap();
        let (maj, min) = mm.trim().split_once(':').unwrap();
        run(Command::new("mknod")
            .arg(devdir.join(name))
            .args(["b", maj, min]));
    }
    let dev = |l: &Loop| devdir.join(l.name()).to_string_lossy().into_owned();

    let harness = stated::testing::Harness::start().await;
    let client = harness.client.clone();
    for defs in [
        machinery::resources::block::definitions(),
        machinery::resources::runtime::definitions(),
    ] {
        client.define_types(&defs, "test").await.unwrap();
    }
    let machine = cosi::Resource::new(
        RUNTIME,
        MACHINE_STATUS_ID,
        MachineStatusSpec {
            mode: "vm".into(),
            stage: MachineStage::Running,
            ..Default::default()
        },
    );
    client.create(&machine.to_raw().unwrap(), "").await.unwrap();
    // The configuration names B.
    install_disk(&client, &dev(&b)).await;
    let options = blockd::controllers::Options {
        sys_block: sys.clone(),
        dev: devdir.clone(),
        any_mode: true,
        format: blockd::volumes::FormatOptions {
            mkfs_xfs: "/usr/sbin/mkfs.xfs".into(),
            uid: 1_990_001_500,
            blkid: blockd::blkid::BlkidOptions {
                binary: "/usr/sbin/blkid".into(),
                uid: 1_990_001_501,
            },
        },
    };
    let runtime = cosi::Runtime::with_registry(
        client.clone(),
        blockd::controllers::registry(&options).unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move { runtime.run(stopped).await.expect("runtime") });

    // blkid (real, run as init would) finds B's MBR: B is passed over, said why, and A, blank
    // but not named by the configuration, is not taken either.
    let exit = run_blkid_as_init(&client, &format!("blkid-{}", b.name())).await;
    assert_eq!(exit, "exit 0", "blkid finds the MBR");
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        let s = client
            .get_typed::<VolumeStatusSpec>(NAMESPACE, "STATE")
            .await;
        if let Some(s) = s
            .ok()
            .filter(|s| s.spec.error_message.contains("a partition table (dos)"))
        {
            break s.spec;
        }
        assert!(
            Instant::now() < deadline,
            "never said why B was passed over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(state.phase, "missing", "{state:?}");
    assert!(
        state.error_message.contains(&dev(&b))
            && state.error_message.contains("machine.install.disk"),
        "{state:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        std::fs::read(&b_img).unwrap() == b_before,
        "the disk with an MBR and data was written"
    );
    assert!(
        std::fs::read(&a_img).unwrap()[..2 * MIB as usize]
            .iter()
            .all(|&x| x == 0),
        "a disk the configuration does not name was written"
    );
    assert!(client
        .list_typed::<ServiceSpecSpec>(NAMESPACE)
        .await
        .unwrap()
        .iter()
        .all(|s| !s.metadata.id.starts_with("mkfs-")));

    // Named instead: A is asked about, found blank by blkid, and partitioned; B stays as it was.
    let current = client
        .get(
            machinery::resources::config::REDACTED_NAMESPACE,
            <machinery::resources::config::MachineConfigSpec as cosi::ResourceSpec>::TYPE,
            machinery::resources::config::ACTIVE_ID,
        )
        .await
        .unwrap();
    let mut named_a = cosi::Resource::new(
        machinery::resources::config::REDACTED_NAMESPACE,
        machinery::resources::config::ACTIVE_ID,
        machinery::resources::config::MachineConfigSpec(format!(
            "version: v1alpha1\nmachine:\n  type: controlplane\n  install:\n    disk: {}\n",
            dev(&a)
        )),
    )
    .to_raw()
    .unwrap();
    named_a.metadata.version = current.metadata.version;
    client.update(&named_a, "", None).await.unwrap();
    let exit = run_blkid_as_init(&client, &format!("blkid-{}", a.name())).await;
    assert_eq!(exit, "exit 2", "blkid finds nothing on A");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client
        .get_typed::<VolumeStatusSpec>(NAMESPACE, "STATE")
        .await
        .is_ok_and(|s| s.spec.parent_location == dev(&a))
    {
        assert!(Instant::now() < deadline, "A was never partitioned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let table = sfdisk(&a_img);
    let names: Vec<&str> = table.partitions.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["STATE", "EPHEMERAL"]);
    assert!(std::fs::read(&b_img).unwrap() == b_before);
    // The system disk is A (what the Disks API's `system_disk` says).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sd = client
            .get_typed::<machinery::resources::block::SystemDiskSpec>(
                NAMESPACE,
                machinery::resources::block::SYSTEM_DISK_ID,
            )
            .await;
        if let Ok(sd) = sd {
            assert_eq!(sd.spec.dev_path, dev(&a));
            assert_eq!(sd.spec.disk_id, a.name());
            break;
        }
        assert!(Instant::now() < deadline, "no SystemDisk");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    task.await.unwrap();
}
