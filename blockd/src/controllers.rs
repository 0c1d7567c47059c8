//! blockd's controllers:
//! - `block.DisksController`: a `Disk` for every disk sysfs lists (a VM's only: a node in
//!   namespaces shares the host's disks, which are not its to describe);
//! - `block.DiscoveryController`: a `DiscoveredVolume` for every disk and every partition of
//!   its GPT, probed read-only ([`crate::probe`]); a disk blockd may not read (it holds a
//!   mounted system volume) is described from sysfs and from what init mounted.
//!
//! Both read the kernel again every [`RESYNC`] (sysfs, then the disks' first blocks): disks and
//! partitions that appear, change or go are seen within that time. (Upstream reacts to block
//! uevents and to writers closing a device; that is not here yet.)

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::block::{
    pretty_size, DiscoveredVolumeSpec, DiskSpec, MountStatusSpec, NAMESPACE,
};
use machinery::resources::runtime::{MachineStatusSpec, MACHINE_STATUS_ID};

/// How often sysfs and the disks are read again.
pub const RESYNC: Duration = Duration::from_secs(5);

/// Where blockd looks.
#[derive(Clone, Debug)]
pub struct Options {
    /// `/sys/block`.
    pub sys_block: PathBuf,
    /// `/dev`.
    pub dev: PathBuf,
    /// Describe the disks whatever the node's mode (tests, on the host's loop devices); else
    /// only a VM's.
    pub any_mode: bool,
    /// How volumes are formatted.
    pub format: crate::volumes::FormatOptions,
}

/// Every controller of blockd.
///
/// # Errors
///
/// A controller that cannot be registered (a bug).
pub fn registry(options: &Options) -> Result<cosi::runtime::Registry, cosi::runtime::RuntimeError> {
    let mut r = cosi::runtime::Registry::new();
    r.register(DisksController {
        options: options.clone(),
        said: None,
    })?;
    r.register(DiscoveryController {
        options: options.clone(),
        failing: BTreeMap::new(),
    })?;
    r.register(crate::volumes::VolumeConfigController)?;
    r.register(crate::volumes::VolumeManagerController::new(
        options.format.clone(),
    ))?;
    Ok(r)
}

/// `block.DisksController`.
pub struct DisksController {
    options: Options,
    /// The mode last reported as having no disks of its own.
    said: Option<String>,
}

impl Controller for DisksController {
    fn name(&self) -> &'static str {
        "block.DisksController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<MachineStatusSpec>(machinery::resources::runtime::NAMESPACE)
                .with_id(MACHINE_STATUS_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<DiskSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        if !self.options.any_mode {
            let mode = ctx
                .get::<MachineStatusSpec>(
                    machinery::resources::runtime::NAMESPACE,
                    MACHINE_STATUS_ID,
                )
                .await?
                .map(|m| m.spec.mode)
                .unwrap_or_default();
            if mode != "vm" {
                if self.said.as_deref() != Some(mode.as_str()) {
                    tracing::info!(
                        mode = %mode,
                        "not a VM: the node shares the host's disks, none is described"
                    );
                    self.said = Some(mode);
                }
                ctx.apply_all(std::iter::empty::<Resource<DiskSpec>>())
                    .await?;
                return Ok(Action::AwaitChange);
            }
        }
        let sys_block = self.options.sys_block.clone();
        let disks = tokio::task::spawn_blocking(move || crate::sysfs::disks(&sys_block))
            .await
            .map_err(|e| ReconcileError::other(format!("reading sysfs ended: {e}")))?;
        let dev = &self.options.dev;
        ctx.apply_all(disks.into_iter().map(|d| {
            Resource::new(
                NAMESPACE,
                &d.name,
                DiskSpec {
                    dev_path: dev.join(&d.name).to_string_lossy().into_owned(),
                    size: d.size,
                    pretty_size: pretty_size(d.size),
                    io_size: d.io_size,
                    sector_size: d.sector_size,
                    readonly: d.readonly,
                    cdrom: d.cdrom,
                    model: d.model,
                    serial: d.serial,
                    modalias: d.modalias,
                    wwid: d.wwid,
                    bus_path: d.bus_path,
                    sub_system: "/sys/class/block".into(),
                    transport: d.transport,
                    rotational: d.rotational,
                    secondary_disks: d.secondaries,
                },
            )
        }))
        .await?;
        Ok(Action::RequeueAfter(RESYNC))
    }
}

/// What a disk blockd may not read holds (init made it root's: it holds a mounted system
/// volume, STATE with every key of the cluster), from what the kernel says without reading it:
/// its partitions in sysfs (number, offset, size, name in the table), each probed on its own
/// device when that one is readable, else named by the filesystem init mounted from it. The
/// disk counts as a GPT when its partitions have names (the kernel's `PARTNAME`).
fn unreadable(
    dev: &std::path::Path,
    info: Option<&crate::sysfs::DiskInfo>,
    sector_size: u64,
    mounted: &BTreeMap<String, String>,
) -> crate::probe::Found {
    let Some(info) = info else {
        return crate::probe::Found::default();
    };
    let partitions: Vec<crate::probe::Partition> = info
        .partitions
        .iter()
        .map(|p| {
            let node = dev.join(&p.name);
            let found = match crate::probe::probe(&node, sector_size) {
                Ok(f) => f,
                Err(_) => crate::probe::Found {
                    name: mounted
                        .get(node.to_string_lossy().as_ref())
                        .cloned()
                        .unwrap_or_default(),
                    ..crate::probe::Found::default()
                },
            };
            crate::probe::Partition {
                index: p.number,
                label: p.label.clone(),
                offset: p.start,
                size: p.size,
                found,
                ..Default::default()
            }
        })
        .collect();
    let gpt = partitions.iter().any(|p| !p.label.is_empty());
    crate::probe::Found {
        name: if gpt { "gpt".into() } else { String::new() },
        // Unreadable: never blank.
        in_use: true,
        partitions,
        ..crate::probe::Found::default()
    }
}

/// `block.DiscoveryController`.
pub struct DiscoveryController {
    options: Options,
    /// Disks whose last probe failed, with the error logged (logged again only when it
    /// changes).
    failing: BTreeMap<String, String>,
}

impl Controller for DiscoveryController {
    fn name(&self) -> &'static str {
        "block.DiscoveryController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<DiskSpec>(NAMESPACE),
            Input::weak::<MountStatusSpec>(machinery::resources::runtime::NAMESPACE),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<DiscoveredVolumeSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let disks: Vec<(String, DiskSpec)> = ctx
            .list::<DiskSpec>(NAMESPACE)
            .await?
            .into_iter()
            .map(|d| (d.metadata.id.clone(), d.spec))
            .collect();
        if disks.is_empty() {
            ctx.apply_all(std::iter::empty::<Resource<DiscoveredVolumeSpec>>())
                .await?;
            return Ok(Action::AwaitChange);
        }
        // What init mounted: the device of a mounted system volume, and the disk that holds
        // it, are no daemon's to read (init makes them root's): described from sysfs instead.
        let mounted: BTreeMap<String, String> = ctx
            .list::<MountStatusSpec>(machinery::resources::runtime::NAMESPACE)
            .await?
            .into_iter()
            .map(|m| (m.spec.source, m.spec.filesystem))
            .collect();
        let sys_block = self.options.sys_block.clone();
        let dev = self.options.dev.clone();
        let probed = tokio::task::spawn_blocking(move || {
            disks
                .into_iter()
                .map(|(id, disk)| {
                    let info = crate::sysfs::disk(&sys_block.join(&id), &id);
                    let found =
                        crate::probe::probe(std::path::Path::new(&disk.dev_path), disk.sector_size);
                    let found = match found {
                        Err(crate::probe::ProbeError::Read { source, .. })
                            if source.kind() == std::io::ErrorKind::PermissionDenied =>
                        {
                            Ok(unreadable(&dev, info.as_ref(), disk.sector_size, &mounted))
                        }
                        other => other,
                    };
                    (id, disk, info, found)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| ReconcileError::other(format!("probing ended: {e}")))?;
        let mut volumes = Vec::new();
        for (id, disk, info, found) in probed {
            let found = match found {
                Ok(f) => {
                    if self.failing.remove(&id).is_some() {
                        tracing::info!(disk = %id, "probed again");
                    }
                    f
                }
                Err(e) => {
                    let msg = cosi::error::Chain(&e).to_string();
                    if self.failing.get(&id) != Some(&msg) {
                        tracing::warn!(disk = %id, error = %msg, "cannot probe");
                        self.failing.insert(id.clone(), msg);
                    }
                    // What was found before stays until a probe succeeds: a busy disk (being
                    // written) has not lost its volumes.
                    for v in ctx.list::<DiscoveredVolumeSpec>(NAMESPACE).await? {
                        if v.metadata.id == id || v.spec.parent == id {
                            volumes.push(Resource::new(NAMESPACE, &v.metadata.id, v.spec));
                        }
                    }
                    continue;
                }
            };
            let info = info.unwrap_or_default();
            let parts: BTreeMap<u64, crate::sysfs::PartitionInfo> = info
                .partitions
                .iter()
                .map(|p| (p.number, p.clone()))
                .collect();
            for p in &found.partitions {
                let kernel = parts.get(&p.index);
                let name = kernel
                    .map(|k| k.name.clone())
                    .unwrap_or_else(|| crate::sysfs::partition_name(&id, p.index));
                volumes.push(Resource::new(
                    NAMESPACE,
                    &name,
                    DiscoveredVolumeSpec {
                        dev_path: self.options.dev.join(&name).to_string_lossy().into_owned(),
                        kind: "partition".into(),
                        device_path: kernel.map(|k| k.device_path.clone()).unwrap_or_default(),
                        parent: id.clone(),
                        parent_dev_path: disk.dev_path.clone(),
                        size: p.size,
                        sector_size: disk.sector_size,
                        io_size: disk.io_size,
                        // An xfs mkfs did not finish is no filesystem yet.
                        name: if p.found.incomplete {
                            String::new()
                        } else {
                            p.found.name.clone()
                        },
                        uuid: p.found.uuid.clone(),
                        label: p.found.label.clone(),
                        block_size: p.found.block_size,
                        filesystem_block_size: p.found.filesystem_block_size,
                        probed_size: p.found.probed_size,
                        partition_uuid: p.uuid.clone(),
                        partition_type: p.type_uuid.clone(),
                        partition_label: p.label.clone(),
                        partition_index: p.index,
                    },
                ));
            }
            volumes.push(Resource::new(
                NAMESPACE,
                &id,
                DiscoveredVolumeSpec {
                    dev_path: disk.dev_path.clone(),
                    kind: "disk".into(),
                    device_path: info.device_path.clone(),
                    size: disk.size,
                    sector_size: disk.sector_size,
                    io_size: disk.io_size,
                    name: if found.incomplete {
                        String::new()
                    } else {
                        found.name
                    },
                    uuid: found.uuid,
                    label: found.label,
                    block_size: found.block_size,
                    filesystem_block_size: found.filesystem_block_size,
                    probed_size: found.probed_size,
                    ..Default::default()
                },
            ));
        }
        ctx.apply_all(volumes).await?;
        Ok(Action::RequeueAfter(RESYNC))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_blockd_may_not_read_is_described_from_sysfs_and_the_mounts() {
        let d = tempfile::tempdir().unwrap();
        let sys = d.path().join("sys");
        let dev = d.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        for (part, n, start, name) in [("vda1", 1, 2048, "STATE"), ("vda2", 2, 206848, "EPHEMERAL")]
        {
            let p = sys.join("vda").join(part);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("partition"), format!("{n}\n")).unwrap();
            std::fs::write(p.join("start"), format!("{start}\n")).unwrap();
            std::fs::write(p.join("size"), "204800\n").unwrap();
            std::fs::write(
                p.join("uevent"),
                format!("DEVNAME={part}\nDEVTYPE=partition\nPARTN={n}\nPARTNAME={name}\n"),
            )
            .unwrap();
        }
        std::fs::write(sys.join("vda").join("size"), "8388608\n").unwrap();
        // EPHEMERAL's device is readable (blank); STATE's is not there to read (init's).
        std::fs::write(dev.join("vda2"), vec![0u8; 128 * 1024]).unwrap();
        let info = crate::sysfs::disk(&sys.join("vda"), "vda");
        let mounted = BTreeMap::from([(
            dev.join("vda1").to_string_lossy().into_owned(),
            "xfs".to_string(),
        )]);
        let found = unreadable(&dev, info.as_ref(), 512, &mounted);
        assert_eq!(found.name, "gpt");
        assert!(found.in_use, "never blank");
        assert_eq!(found.partitions.len(), 2);
        let state = &found.partitions[0];
        assert_eq!((state.index, state.label.as_str()), (1, "STATE"));
        assert_eq!(state.offset, 2048 * 512);
        assert_eq!(state.found.name, "xfs", "from what init mounted");
        assert!(state.found.uuid.is_empty(), "nothing of STATE is read");
        let eph = &found.partitions[1];
        assert_eq!((eph.index, eph.label.as_str()), (2, "EPHEMERAL"));
        assert_eq!(eph.found.name, "", "probed on its own device: blank");
    }
}
