//! The `block` namespace (written by blockd): the node's disks and what is on them.
//!
//! Upstream keeps these types in `runtime`; here `runtime` is init's alone (one writer per
//! namespace, DESIGN.md §2), so blockd's outputs live in `block`. The types, their IDs and their
//! fields are upstream's (`Disks.block.talos.dev`, `DiscoveredVolumes.block.talos.dev`), so
//! `talosctl get disks` and `get discoveredvolumes` read the same.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// The namespace blockd writes.
pub const NAMESPACE: &str = "block";

/// The system volumes init mounts on a node with a disk (`/system/state` and `/var`): the IDs
/// of their `VolumeStatus` and `MountStatus`.
pub const SYSTEM_VOLUMES: [&str; 2] = ["STATE", "EPHEMERAL"];

/// A whole disk (upstream's `Disk`). ID: the kernel's name (`vda`, `sda`, `nvme0n1`). Field
/// names as upstream's (snake_case for this type).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSpec {
    /// `/dev/<name>`.
    pub dev_path: String,
    /// Size in bytes.
    pub size: u64,
    /// Size for people (`2.1 GB`, decimal units as upstream's humanize).
    pub pretty_size: String,
    /// Optimal I/O size in bytes (0: none reported).
    pub io_size: u64,
    /// Logical sector size in bytes.
    pub sector_size: u64,
    /// The kernel says it is read-only.
    pub readonly: bool,
    /// A CD-ROM drive.
    pub cdrom: bool,
    /// Model, as the device reports it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Serial number.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serial: String,
    /// The device's modalias.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub modalias: String,
    /// World-wide identifier.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wwid: String,
    /// The device's path on its bus (`/pci0000:00/0000:00:03.0/virtio1`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bus_path: String,
    /// The subsystem of its device (`/sys/class/block`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_system: String,
    /// How it is attached: `virtio`, `nvme`, `scsi`, `usb`, `mmc`, `loop`…
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transport: String,
    /// A spinning disk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotational: bool,
    /// Disks this one is made of (device mapper, md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secondary_disks: Vec<String>,
}

impl ResourceSpec for DiskSpec {
    const TYPE: &'static str = "Disks.block.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Size", "{.pretty_size}"),
            ("Read Only", "{.readonly}"),
            ("Transport", "{.transport}"),
            ("Rotational", "{.rotational}"),
            ("WWID", "{.wwid}"),
            ("Model", "{.model}"),
            ("Serial", "{.serial}"),
        ])
    }
}

/// A `Disk` resource.
pub type Disk = Resource<DiskSpec>;

/// What a disk or a partition holds, as probed (upstream's `DiscoveredVolume`). ID: the
/// kernel's name of the device (`vda`, `vda1`). Field names as upstream's (camelCase here).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredVolumeSpec {
    /// `/dev/<name>`.
    pub dev_path: String,
    /// `disk` or `partition`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its directory in sysfs (`/sys/devices/...`).
    pub device_path: String,
    /// The disk of a partition (its ID).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// The disk's `/dev` path, for a partition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_dev_path: String,
    /// Size in bytes.
    pub size: u64,
    /// Logical sector size in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sector_size: u64,
    /// Optimal I/O size in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub io_size: u64,
    /// What was found: `xfs`, `ext4`, `vfat`, `swap`, `gpt`; empty for nothing known.
    pub name: String,
    /// The filesystem's (or partition table's) UUID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// The filesystem's label.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// The filesystem's block size.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_size: u64,
    /// The filesystem's own block size (xfs: its sector size; ext4, vfat: as `block_size`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub filesystem_block_size: u64,
    /// The size the filesystem says it has.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub probed_size: u64,
    /// The partition's GUID (uppercase, as upstream).
    #[serde(
        default,
        rename = "partitionUUID",
        skip_serializing_if = "String::is_empty"
    )]
    pub partition_uuid: String,
    /// The partition's type GUID (uppercase).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partition_type: String,
    /// The partition's name in the table.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partition_label: String,
    /// The partition's number (from 1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub partition_index: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl ResourceSpec for DiscoveredVolumeSpec {
    const TYPE: &'static str = "DiscoveredVolumes.block.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Type", "{.type}"),
            ("Size", "{.size}"),
            ("Discovered", "{.name}"),
            ("Label", "{.label}"),
            ("PartitionLabel", "{.partitionLabel}"),
        ])
    }
}

/// A `DiscoveredVolume` resource.
pub type DiscoveredVolume = Resource<DiscoveredVolumeSpec>;

/// How a volume is provisioned when it is not found (upstream's `ProvisioningSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningSpec {
    /// Volumes of a lower wave are provisioned first (system volumes: -1).
    pub wave: i32,
    /// Which disks may hold it: a CEL expression over `disk` and `system_disk`.
    pub disk_selector: CelMatch,
    /// The partition to create.
    pub partition_spec: PartitionSpec,
    /// The filesystem to make on it.
    pub filesystem_spec: FilesystemSpec,
}

/// A CEL expression (upstream's `DiskSelector`, `LocatorSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CelMatch {
    /// The expression.
    #[serde(rename = "match")]
    pub expression: String,
}

/// A partition to create (upstream's `PartitionSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionSpec {
    /// Smallest size, bytes.
    pub min_size: u64,
    /// Largest size, bytes (0: no limit).
    pub max_size: u64,
    /// Grows to fill the disk.
    pub grow: bool,
    /// GPT partition name.
    pub label: String,
    /// GPT type GUID.
    #[serde(rename = "typeUUID")]
    pub type_uuid: String,
}

/// A filesystem to make (upstream's `FilesystemSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemSpec {
    /// `xfs`, `ext4`, `vfat`, or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its label.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
}

/// Where a volume is mounted (upstream's `MountSpec`, the part used here).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMountSpec {
    /// The mount point.
    pub target_path: String,
}

/// A volume the node wants (upstream's `VolumeConfig`). ID: the volume (`STATE`, `EPHEMERAL`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeConfigSpec {
    /// `partition`, `disk`, `directory`…
    #[serde(rename = "type")]
    pub kind: String,
    /// How to find it: a CEL expression over `volume` (a discovered volume) and `disk`.
    pub locator: CelMatch,
    /// How to make it when it is not found.
    pub provisioning: ProvisioningSpec,
    /// Where it is mounted.
    pub mount: VolumeMountSpec,
}

impl ResourceSpec for VolumeConfigSpec {
    const TYPE: &'static str = "VolumeConfigs.block.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // Sensitive, as upstream's: a volume's encryption keys are part of its configuration.
        ResourceDefinition::new(Self::TYPE, NAMESPACE).sensitive()
    }
}

/// A `VolumeConfig` resource.
pub type VolumeConfig = Resource<VolumeConfigSpec>;

/// Where a volume stands (upstream's `VolumeStatus`). ID: as its `VolumeConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatusSpec {
    /// `waiting`, `failed`, `missing`, `located`, `provisioned`, `prepared`, `ready`, `closed`.
    pub phase: String,
    /// As its config's.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its device (`/dev/vda1`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub location: String,
    /// Its partition number.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub partition_index: u64,
    /// Its disk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_location: String,
    /// Its filesystem's UUID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Its partition's GUID.
    #[serde(
        default,
        rename = "partitionUUID",
        skip_serializing_if = "String::is_empty"
    )]
    pub partition_uuid: String,
    /// Size in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// Size for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pretty_size: String,
    /// The filesystem found on it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filesystem: String,
    /// What went wrong, or what is not done.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,
}

impl ResourceSpec for VolumeStatusSpec {
    const TYPE: &'static str = "VolumeStatuses.block.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Type", "{.type}"),
            ("Phase", "{.phase}"),
            ("Location", "{.location}"),
            ("Size", "{.prettySize}"),
        ])
    }
}

/// A `VolumeStatus` resource.
pub type VolumeStatus = Resource<VolumeStatusSpec>;

/// What a mounted volume's mount asked for (upstream's `MountRequestSpec`, as far as a system
/// volume needs it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountRequestSpec {
    /// The volume.
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    /// Who asked for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requesters: Vec<String>,
}

/// A mounted volume (upstream's `MountStatus`). ID: the volume's. Written by init, which mounts
/// (blockd, under landlock, cannot), in init's namespace `runtime` (upstream's too).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountStatusSpec {
    /// What was asked.
    pub spec: MountRequestSpec,
    /// The device (`/dev/vda1`).
    pub source: String,
    /// The mount point.
    pub target: String,
    /// The filesystem type.
    pub filesystem: String,
    /// Mounted read-only.
    #[serde(default)]
    pub read_only: bool,
}

impl ResourceSpec for MountStatusSpec {
    const TYPE: &'static str = "MountStatuses.block.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = crate::resources::runtime::NAMESPACE;

    fn definition() -> ResourceDefinition {
        // `ms` is MachineStatuses' (init's): stated refuses a name of another owner's type.
        ResourceDefinition::new(Self::TYPE, crate::resources::runtime::NAMESPACE)
            .without_aliases(&["ms", "mss"])
            .with_columns(&[
                ("Source", "{.source}"),
                ("Target", "{.target}"),
                ("Filesystem", "{.filesystem}"),
            ])
    }
}

/// A `MountStatus` resource.
pub type MountStatus = Resource<MountStatusSpec>;

/// ID of [`SystemDiskSpec`].
pub const SYSTEM_DISK_ID: &str = "system-disk";

/// The disk the system volumes are on (upstream's `SystemDisks.block.talos.dev`, ID
/// `system-disk`): upstream finds it by its META partition; talos-rs by its STATE partition
/// (no META yet). Absent while the node has no system volumes on a disk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemDiskSpec {
    /// The disk's ID (`vda`).
    #[serde(rename = "diskID")]
    pub disk_id: String,
    /// Its device (`/dev/vda`).
    pub dev_path: String,
}

impl ResourceSpec for SystemDiskSpec {
    const TYPE: &'static str = "SystemDisks.block.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Disk", "{.diskID}"), ("Path", "{.devPath}")])
    }
}

/// `humanize.Bytes` of upstream (decimal units, one decimal under 10): `2.1 GB`, `512 MB`.
pub fn pretty_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if bytes < 10 {
        return format!("{bytes} B");
    }
    #[allow(clippy::cast_precision_loss)] // a size for people
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if v < 10.0 {
        format!("{:.1} {}", v, UNITS[unit])
    } else {
        format!("{:.0} {}", v, UNITS[unit])
    }
}

/// Definitions of the block namespace's types.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![
        DiskSpec::definition(),
        DiscoveredVolumeSpec::definition(),
        VolumeConfigSpec::definition(),
        VolumeStatusSpec::definition(),
        SystemDiskSpec::definition(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_upstream_prints_them() {
        assert_eq!(pretty_size(0), "0 B");
        assert_eq!(pretty_size(2 * 1024 * 1024 * 1024), "2.1 GB");
        assert_eq!(pretty_size(6144 * 1024 * 1024), "6.4 GB");
        assert_eq!(pretty_size(512 * 1000 * 1000), "512 MB");
        assert_eq!(pretty_size(75_000_000), "75 MB");
    }

    #[test]
    fn field_names_are_upstreams() {
        let d = serde_json::to_value(DiskSpec {
            dev_path: "/dev/vda".into(),
            pretty_size: "2.1 GB".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(d["dev_path"], "/dev/vda");
        assert_eq!(d["pretty_size"], "2.1 GB");
        let v = serde_json::to_value(DiscoveredVolumeSpec {
            kind: "partition".into(),
            partition_uuid: "A".into(),
            partition_label: "STATE".into(),
            partition_index: 1,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(v["type"], "partition");
        assert_eq!(v["partitionUUID"], "A");
        assert_eq!(v["partitionLabel"], "STATE");
        assert_eq!(v["partitionIndex"], 1);
    }
}
