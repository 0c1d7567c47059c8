//! The node's block devices as sysfs lists them (`/sys/block/<disk>`, its partitions in
//! `/sys/block/<disk>/<partition>`): read-only files, no device is opened here.

use std::path::{Path, PathBuf};

/// A disk as sysfs describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskInfo {
    /// The kernel's name (`vda`).
    pub name: String,
    /// Its directory under `/sys/devices`.
    pub device_path: String,
    /// Size in bytes.
    pub size: u64,
    /// Logical sector size.
    pub sector_size: u64,
    /// Optimal I/O size (0: none reported).
    pub io_size: u64,
    /// Read-only.
    pub readonly: bool,
    /// A CD-ROM drive (`sr*`).
    pub cdrom: bool,
    /// Rotational.
    pub rotational: bool,
    /// Model.
    pub model: String,
    /// Serial.
    pub serial: String,
    /// Modalias of its device.
    pub modalias: String,
    /// World-wide ID.
    pub wwid: String,
    /// Path of its device on the bus (under `/sys/devices`, without the `block/` part).
    pub bus_path: String,
    /// `virtio`, `nvme`, `scsi`, `usb`, `mmc`, `loop`, `dm`, `md`, or empty.
    pub transport: String,
    /// Disks under a device-mapper or md device (`slaves/`).
    pub secondaries: Vec<String>,
    /// Its partitions: (kernel name, number, sysfs path, size in bytes).
    pub partitions: Vec<PartitionInfo>,
}

/// A partition the kernel knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The kernel's name (`vda1`).
    pub name: String,
    /// Its number (from 1).
    pub number: u64,
    /// Its directory under `/sys/devices`.
    pub device_path: String,
    /// Size in bytes.
    pub size: u64,
    /// Byte offset on the disk.
    pub start: u64,
    /// The partition's name in its table (the kernel's `PARTNAME`: a GPT's), empty without one.
    pub label: String,
}

/// `PARTNAME` of a partition's `uevent`.
fn partname(uevent: &str) -> String {
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("PARTNAME="))
        .unwrap_or_default()
        .to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn read_u64(path: &Path) -> u64 {
    read(path).parse().unwrap_or(0)
}

/// Names of devices that are not disks of the node: RAM disks, compressed RAM, and loop
/// devices with nothing attached.
fn skipped(name: &str, size: u64) -> bool {
    name.starts_with("ram") || name.starts_with("zram") || (name.starts_with("loop") && size == 0)
}

fn transport(name: &str, modalias: &str, device_path: &str) -> &'static str {
    if modalias.starts_with("virtio:") || name.starts_with("vd") {
        "virtio"
    } else if name.starts_with("nvme") {
        "nvme"
    } else if name.starts_with("mmcblk") {
        "mmc"
    } else if name.starts_with("loop") {
        "loop"
    } else if name.starts_with("dm-") {
        "dm"
    } else if name.starts_with("md") {
        "md"
    } else if device_path.contains("/usb") {
        "usb"
    } else if name.starts_with("sd") || name.starts_with("sr") {
        "scsi"
    } else {
        ""
    }
}

/// Every disk under `sys_block` (`/sys/block`), by name, with its partitions.
pub fn disks(sys_block: &Path) -> Vec<DiskInfo> {
    let Ok(entries) = std::fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut out: Vec<DiskInfo> = entries
        .flatten()
        .filter_map(|e| disk(&e.path(), &e.file_name().to_string_lossy()))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One disk's description; none for a device that is not one of the node's disks.
pub fn disk(dir: &Path, name: &str) -> Option<DiskInfo> {
    // `size` counts 512-byte sectors whatever the device's sector size.
    let size = read_u64(&dir.join("size")).saturating_mul(512);
    if skipped(name, size) {
        return None;
    }
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let device_path = real.to_string_lossy().into_owned();
    let dev = dir.join("device");
    let first = |names: &[PathBuf]| {
        names
            .iter()
            .map(|p| read(p))
            .find(|s| !s.is_empty())
            .unwrap_or_default()
    };
    let modalias = read(&dev.join("modalias"));
    let bus_path = device_path
        .strip_prefix("/sys/devices")
        .and_then(|p| p.rsplit_once("/block/").map(|(bus, _)| bus.to_string()))
        .unwrap_or_default();
    let secondaries = std::fs::read_dir(dir.join("slaves"))
        .map(|rd| {
            let mut v: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    let mut partitions: Vec<PartitionInfo> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("partition").is_file())
                .map(|e| PartitionInfo {
                    name: e.file_name().to_string_lossy().into_owned(),
                    number: read_u64(&e.path().join("partition")),
                    device_path: std::fs::canonicalize(e.path())
                        .unwrap_or_else(|_| e.path())
                        .to_string_lossy()
                        .into_owned(),
                    size: read_u64(&e.path().join("size")).saturating_mul(512),
                    start: read_u64(&e.path().join("start")).saturating_mul(512),
                    label: partname(&read(&e.path().join("uevent"))),
                })
                .collect()
        })
        .unwrap_or_default();
    partitions.sort_by_key(|p| p.number);
    Some(DiskInfo {
        name: name.to_string(),
        size,
        sector_size: read_u64(&dir.join("queue/logical_block_size")).max(512),
        io_size: read_u64(&dir.join("queue/optimal_io_size")),
        readonly: read(&dir.join("ro")) == "1",
        cdrom: name.starts_with("sr"),
        rotational: read(&dir.join("queue/rotational")) == "1",
        model: first(&[dev.join("model")]),
        serial: first(&[dir.join("serial"), dev.join("serial")]),
        wwid: first(&[dir.join("wwid"), dev.join("wwid")]),
        transport: transport(name, &modalias, &device_path).to_string(),
        modalias,
        bus_path,
        device_path,
        secondaries,
        partitions,
    })
}

/// The kernel's name of partition `number` of `disk` (`vda` 1 → `vda1`; `nvme0n1` 1 →
/// `nvme0n1p1`: a `p` after a name ending in a digit).
pub fn partition_name(disk: &str, number: u64) -> String {
    if disk.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{disk}p{number}")
    } else {
        format!("{disk}{number}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_follow_the_kernel() {
        assert_eq!(partition_name("vda", 2), "vda2");
        assert_eq!(partition_name("nvme0n1", 1), "nvme0n1p1");
        assert_eq!(partition_name("loop7", 3), "loop7p3");
    }

    #[test]
    fn a_disk_is_read_from_its_sysfs_files() {
        let d = tempfile::tempdir().unwrap();
        let vda = d.path().join("vda");
        std::fs::create_dir_all(vda.join("queue")).unwrap();
        std::fs::create_dir_all(vda.join("device")).unwrap();
        std::fs::create_dir_all(vda.join("vda1")).unwrap();
        std::fs::write(vda.join("size"), "4194304\n").unwrap();
        std::fs::write(vda.join("ro"), "0\n").unwrap();
        std::fs::write(vda.join("serial"), "abc\n").unwrap();
        std::fs::write(vda.join("queue/logical_block_size"), "512\n").unwrap();
        std::fs::write(vda.join("queue/rotational"), "1\n").unwrap();
        std::fs::write(vda.join("device/modalias"), "virtio:d00000002v00001AF4\n").unwrap();
        std::fs::write(vda.join("vda1/partition"), "1\n").unwrap();
        std::fs::write(vda.join("vda1/size"), "2048\n").unwrap();
        std::fs::write(vda.join("vda1/start"), "2048\n").unwrap();
        std::fs::write(
            vda.join("vda1/uevent"),
            "MAJOR=254\nMINOR=1\nDEVNAME=vda1\nDEVTYPE=partition\nPARTN=1\nPARTNAME=STATE\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("ram0")).unwrap();
        std::fs::write(d.path().join("ram0/size"), "8192\n").unwrap();
        let disks = disks(d.path());
        assert_eq!(disks.len(), 1, "{disks:?}");
        let v = &disks[0];
        assert_eq!(v.name, "vda");
        assert_eq!(v.size, 2 * 1024 * 1024 * 1024);
        assert_eq!(v.sector_size, 512);
        assert_eq!(v.serial, "abc");
        assert_eq!(v.transport, "virtio");
        assert!(v.rotational && !v.readonly && !v.cdrom);
        assert_eq!(v.partitions.len(), 1);
        assert_eq!(v.partitions[0].name, "vda1");
        assert_eq!(v.partitions[0].number, 1);
        assert_eq!(v.partitions[0].size, 1024 * 1024);
        assert_eq!(v.partitions[0].start, 1024 * 1024);
        assert_eq!(v.partitions[0].label, "STATE");
    }
}
