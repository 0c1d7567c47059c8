//! The node's system volumes, as upstream describes them (`VolumeConfig`), and where each
//! stands (`VolumeStatus`): found by its locator, a CEL expression evaluated over every
//! discovered volume (upstream's `volume` and `disk` variables, fields by their protobuf
//! names), and checked against the filesystem it wants.
//!
//! Only locating is done here: a volume that is not found is `missing`, and one found blank
//! stays `located`, each saying that blockd does not partition or format disks yet. A volume
//! found with another filesystem than the one wanted `failed`: it is never reformatted.

use std::collections::HashMap;

use cel_interpreter::{Context as Cel, Program, Value};
use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::block::{
    pretty_size, CelMatch, DiscoveredVolumeSpec, DiskSpec, FilesystemSpec, PartitionSpec,
    ProvisioningSpec, VolumeConfigSpec, VolumeMountSpec, VolumeStatusSpec, NAMESPACE,
};
use machinery::resources::runtime::{MachineStatusSpec, MACHINE_STATUS_ID};

const MIB: u64 = 1024 * 1024;
/// Linux filesystem data (GPT partition type).
pub const LINUX_DATA: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// The system volumes of a VM node, as upstream's `VolumeConfigController` writes them with a
/// configuration: STATE (100 MiB, xfs, `/system/state`) and EPHEMERAL (at least 2 GiB, grows,
/// xfs, `/var`), partitions of the system disk, found by their partition label.
pub fn system_volumes() -> Vec<(&'static str, VolumeConfigSpec)> {
    let volume = |label: &str, min: u64, max: u64, grow: bool, target: &str| VolumeConfigSpec {
        kind: "partition".into(),
        locator: CelMatch {
            expression: format!("volume.partition_label == \"{label}\""),
        },
        provisioning: ProvisioningSpec {
            wave: -1,
            disk_selector: CelMatch {
                expression: "system_disk".into(),
            },
            partition_spec: PartitionSpec {
                min_size: min,
                max_size: max,
                grow,
                label: label.into(),
                type_uuid: LINUX_DATA.into(),
            },
            filesystem_spec: FilesystemSpec {
                kind: "xfs".into(),
                label: label.into(),
            },
        },
        mount: VolumeMountSpec {
            target_path: target.into(),
        },
    };
    vec![
        (
            "STATE",
            volume("STATE", 100 * MIB, 100 * MIB, false, "/system/state"),
        ),
        (
            "EPHEMERAL",
            volume("EPHEMERAL", 2048 * MIB, 0, true, "/var"),
        ),
    ]
}

/// `block.VolumeConfigController`: the system volumes of a VM (a node in namespaces has none
/// of its own).
pub struct VolumeConfigController;

impl Controller for VolumeConfigController {
    fn name(&self) -> &'static str {
        "block.VolumeConfigController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<MachineStatusSpec>(machinery::resources::runtime::NAMESPACE)
                .with_id(MACHINE_STATUS_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<VolumeConfigSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let vm = ctx
            .get::<MachineStatusSpec>(machinery::resources::runtime::NAMESPACE, MACHINE_STATUS_ID)
            .await?
            .is_some_and(|m| m.spec.mode == "vm");
        let volumes: Vec<Resource<VolumeConfigSpec>> = if vm {
            system_volumes()
                .into_iter()
                .map(|(id, spec)| Resource::new(NAMESPACE, id, spec))
                .collect()
        } else {
            Vec::new()
        };
        ctx.apply_all(volumes).await?;
        Ok(Action::AwaitChange)
    }
}

fn s(v: &str) -> Value {
    Value::String(v.to_string().into())
}

/// The `volume` variable of a locator: a discovered volume's fields by their protobuf names.
pub fn volume_value(v: &DiscoveredVolumeSpec) -> Value {
    let m: HashMap<String, Value> = [
        ("dev_path", s(&v.dev_path)),
        ("type", s(&v.kind)),
        ("device_path", s(&v.device_path)),
        ("parent", s(&v.parent)),
        ("parent_dev_path", s(&v.parent_dev_path)),
        ("size", Value::UInt(v.size)),
        ("sector_size", Value::UInt(v.sector_size)),
        ("io_size", Value::UInt(v.io_size)),
        ("name", s(&v.name)),
        ("uuid", s(&v.uuid)),
        ("label", s(&v.label)),
        ("block_size", Value::UInt(v.block_size)),
        (
            "filesystem_block_size",
            Value::UInt(v.filesystem_block_size),
        ),
        ("probed_size", Value::UInt(v.probed_size)),
        ("partition_uuid", s(&v.partition_uuid)),
        ("partition_type", s(&v.partition_type)),
        ("partition_label", s(&v.partition_label)),
        ("partition_index", Value::UInt(v.partition_index)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    m.into()
}

/// The `disk` variable: a disk's fields by their protobuf names.
pub fn disk_value(d: &DiskSpec) -> Value {
    let m: HashMap<String, Value> = [
        ("dev_path", s(&d.dev_path)),
        ("size", Value::UInt(d.size)),
        ("io_size", Value::UInt(d.io_size)),
        ("sector_size", Value::UInt(d.sector_size)),
        ("readonly", Value::Bool(d.readonly)),
        ("cdrom", Value::Bool(d.cdrom)),
        ("model", s(&d.model)),
        ("serial", s(&d.serial)),
        ("modalias", s(&d.modalias)),
        ("wwid", s(&d.wwid)),
        ("bus_path", s(&d.bus_path)),
        ("sub_system", s(&d.sub_system)),
        ("transport", s(&d.transport)),
        ("rotational", Value::Bool(d.rotational)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    m.into()
}

/// Whether `program` holds for `volume` on `disk` (`Err`: the expression failed on it).
pub fn matches(
    program: &Program,
    volume: &DiscoveredVolumeSpec,
    disk: Option<&DiskSpec>,
) -> Result<bool, String> {
    let mut cel = Cel::default();
    cel.add_variable_from_value("volume", volume_value(volume));
    cel.add_variable_from_value(
        "disk",
        disk.map_or_else(
            || Value::Map(HashMap::<String, Value>::new().into()),
            disk_value,
        ),
    );
    cel.add_variable_from_value("system_disk", Value::Bool(false));
    for (name, v) in [
        ("KiB", 1u64 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
        ("kB", 1000),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
        ("TB", 1_000_000_000_000),
    ] {
        cel.add_variable_from_value(name, Value::UInt(v));
    }
    match program.execute(&cel) {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("the locator gave {other:?}, not a boolean")),
        Err(e) => Err(e.to_string()),
    }
}

/// Where `config` stands among the discovered volumes and disks.
pub fn status(
    config: &VolumeConfigSpec,
    volumes: &[DiscoveredVolumeSpec],
    disks: &[DiskSpec],
) -> VolumeStatusSpec {
    let mut st = VolumeStatusSpec {
        kind: config.kind.clone(),
        ..Default::default()
    };
    let program = match Program::compile(&config.locator.expression) {
        Ok(p) => p,
        Err(e) => {
            st.phase = "failed".into();
            st.error_message = format!(
                "the locator {:?} does not parse: {e}",
                config.locator.expression
            );
            return st;
        }
    };
    if volumes.is_empty() {
        st.phase = "waiting".into();
        st.error_message = "no volume discovered yet".into();
        return st;
    }
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for v in volumes {
        let disk = disks.iter().find(|d| {
            d.dev_path == v.parent_dev_path || (v.parent.is_empty() && d.dev_path == v.dev_path)
        });
        match matches(&program, v, disk) {
            Ok(true) => found.push(v),
            Ok(false) => {}
            Err(e) => errors.push(format!("{}: {e}", v.dev_path)),
        }
    }
    match found.as_slice() {
        [] if !errors.is_empty() => {
            st.phase = "failed".into();
            st.error_message = format!("the locator failed: {}", errors.join("; "));
        }
        [] => {
            st.phase = "missing".into();
            st.error_message =
                "not found, and blockd does not partition or format disks yet".into();
        }
        [v] => {
            st.location = v.dev_path.clone();
            st.parent_location = v.parent_dev_path.clone();
            st.partition_index = v.partition_index;
            st.uuid = v.uuid.clone();
            st.partition_uuid = v.partition_uuid.clone();
            st.size = v.size;
            st.pretty_size = pretty_size(v.size);
            st.filesystem = v.name.clone();
            let want = &config.provisioning.filesystem_spec.kind;
            if v.name.is_empty() {
                st.phase = "located".into();
                st.error_message =
                    format!("blank: it wants {want}, and blockd does not format volumes yet");
            } else if &v.name == want || want == "none" {
                st.phase = "ready".into();
            } else {
                st.phase = "failed".into();
                st.error_message = format!(
                    "filesystem type mismatch: {} holds {}, the volume wants {want} (it is never \
                     reformatted)",
                    v.dev_path, v.name
                );
            }
        }
        many => {
            st.phase = "failed".into();
            st.error_message = format!(
                "{} volumes match the locator: {}",
                many.len(),
                many.iter()
                    .map(|v| v.dev_path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    st
}

/// `block.VolumeManagerController` (locating only, as said above).
pub struct VolumeManagerController;

impl Controller for VolumeManagerController {
    fn name(&self) -> &'static str {
        "block.VolumeManagerController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<VolumeConfigSpec>(NAMESPACE),
            Input::weak::<DiscoveredVolumeSpec>(NAMESPACE),
            Input::weak::<DiskSpec>(NAMESPACE),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<VolumeStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let configs = ctx.list::<VolumeConfigSpec>(NAMESPACE).await?;
        let volumes: Vec<DiscoveredVolumeSpec> = ctx
            .list::<DiscoveredVolumeSpec>(NAMESPACE)
            .await?
            .into_iter()
            .map(|r| r.spec)
            .collect();
        let disks: Vec<DiskSpec> = ctx
            .list::<DiskSpec>(NAMESPACE)
            .await?
            .into_iter()
            .map(|r| r.spec)
            .collect();
        let statuses: Vec<Resource<VolumeStatusSpec>> = configs
            .iter()
            .map(|c| Resource::new(NAMESPACE, &c.metadata.id, status(&c.spec, &volumes, &disks)))
            .collect();
        ctx.apply_all(statuses).await?;
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(dev: &str, label: &str, fs: &str) -> DiscoveredVolumeSpec {
        DiscoveredVolumeSpec {
            dev_path: dev.into(),
            kind: "partition".into(),
            parent: "vda".into(),
            parent_dev_path: "/dev/vda".into(),
            size: 100 * MIB,
            name: fs.into(),
            partition_label: label.into(),
            partition_index: 1,
            ..Default::default()
        }
    }

    #[test]
    fn system_volumes_are_located_by_label_and_never_taken_with_another_filesystem() {
        let vols = system_volumes();
        let state = &vols[0].1;
        let eph = &vols[1].1;
        let disk = DiskSpec {
            dev_path: "/dev/vda".into(),
            ..Default::default()
        };
        let found = vec![
            part("/dev/vda1", "STATE", "xfs"),
            part("/dev/vda2", "EPHEMERAL", ""),
        ];
        let st = status(state, &found, std::slice::from_ref(&disk));
        assert_eq!(
            (st.phase.as_str(), st.location.as_str()),
            ("ready", "/dev/vda1")
        );
        let st = status(eph, &found, std::slice::from_ref(&disk));
        assert_eq!(st.phase, "located");
        assert!(st.error_message.contains("does not format"), "{st:?}");

        let ext4 = vec![part("/dev/vda1", "STATE", "ext4")];
        let st = status(state, &ext4, &[]);
        assert_eq!(st.phase, "failed");
        assert!(st.error_message.contains("never reformatted"), "{st:?}");

        let st = status(state, &[part("/dev/vda3", "OTHER", "xfs")], &[]);
        assert_eq!(st.phase, "missing");
        assert_eq!(status(state, &[], &[]).phase, "waiting");

        let two = vec![
            part("/dev/vda1", "STATE", "xfs"),
            part("/dev/vdb1", "STATE", "xfs"),
        ];
        let st = status(state, &two, &[]);
        assert_eq!(st.phase, "failed");
        assert!(st.error_message.contains("2 volumes"), "{st:?}");
    }

    #[test]
    fn locators_are_cel_over_upstreams_fields() {
        let v = part("/dev/vda1", "STATE", "xfs");
        let disk = DiskSpec {
            dev_path: "/dev/vda".into(),
            transport: "virtio".into(),
            ..Default::default()
        };
        let yes = |e: &str| matches(&Program::compile(e).unwrap(), &v, Some(&disk));
        assert_eq!(
            yes("volume.size >= 100u * MiB && volume.name == 'xfs'"),
            Ok(true)
        );
        assert_eq!(yes("disk.transport == 'virtio' && !system_disk"), Ok(true));
        assert_eq!(yes("volume.partition_index == 2u"), Ok(false));
        assert!(yes("volume.nope == 1").is_err());
        assert!(yes("volume.size").is_err(), "not a boolean");
        let mut bad = system_volumes().remove(0).1;
        bad.locator.expression = "volume.((".into();
        let st = status(&bad, &[v], &[]);
        assert_eq!(st.phase, "failed");
        assert!(st.error_message.contains("does not parse"), "{st:?}");
    }
}
