//! The node's system volumes, as upstream describes them (`VolumeConfig`), and where each
//! stands (`VolumeStatus`): found by its locator, a CEL expression evaluated over every
//! discovered volume (upstream's `volume` and `disk` variables, fields by their protobuf
//! names), and checked against the filesystem it wants.
//!
//! The manager then prepares what is missing, as upstream's volume manager does, on a blank
//! disk only: when no system volume is found at all, the first blank, writable disk big enough
//! gets a GPT with every system partition ([`crate::provision`]); a partition found blank is
//! formatted by mkfs.xfs, a service blockd asks init to run (init alone creates processes),
//! while blockd holds the disk's exclusive lock; a volume is `ready` once its filesystem is
//! there. A volume found with another filesystem than the one wanted `failed`: it is never
//! reformatted, and a disk with anything on it is never partitioned. Mounting is init's
//! (`MountStatus`): a landlocked process cannot mount.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use cel_interpreter::{Context as Cel, Program, Value};
use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::block::{
    pretty_size, CelMatch, DiscoveredVolumeSpec, DiskSpec, FilesystemSpec, PartitionSpec,
    ProvisioningSpec, VolumeConfigSpec, VolumeMountSpec, VolumeStatusSpec, NAMESPACE,
};
use machinery::resources::runtime::{
    MachineStage, MachineStatusSpec, ServicePath, ServiceSpecSpec, ServiceState, ServiceStatusSpec,
    MACHINE_STATUS_ID,
};

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
            st.error_message = "not found".into();
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
                st.error_message = format!("blank: it wants {want}");
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

/// How the manager formats and where it finds the mkfs it asks for.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// mkfs.xfs on the node (the image's `/usr/bin/mkfs.xfs`).
    pub mkfs_xfs: PathBuf,
    /// The uid (and gid) mkfs runs as: a service never runs as a daemon's.
    pub uid: u32,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            mkfs_xfs: PathBuf::from("/usr/bin/mkfs.xfs"),
            uid: 1_990_001_500,
        }
    }
}

/// A format under way (its disk's exclusive lock is held in `locks` until every format on the
/// disk ended).
struct Formatting {
    device: String,
    disk: String,
    /// The service asked.
    spec: ServiceSpecSpec,
}

/// `block.VolumeManagerController`: locates, partitions and formats (see the module's doc).
pub struct VolumeManagerController {
    format: FormatOptions,
    /// Volumes this blockd partitioned, by ID: their device, until discovery sees them.
    provisioned: BTreeMap<String, DiscoveredVolumeSpec>,
    /// Formats under way, by volume ID.
    formatting: BTreeMap<String, Formatting>,
    /// The exclusive locks of the disks being formatted, by disk.
    locks: BTreeMap<String, nix::fcntl::Flock<std::fs::File>>,
    /// Formats that failed, by volume ID: not retried until blockd restarts.
    format_failed: BTreeMap<String, String>,
}

impl VolumeManagerController {
    /// A manager asking for mkfs as `format` says.
    pub fn new(format: FormatOptions) -> Self {
        VolumeManagerController {
            format,
            provisioned: BTreeMap::new(),
            formatting: BTreeMap::new(),
            locks: BTreeMap::new(),
            format_failed: BTreeMap::new(),
        }
    }
}

/// The ID of the mkfs service of a volume (`mkfs-state`).
pub fn mkfs_service_id(volume: &str) -> String {
    format!("mkfs-{}", volume.to_ascii_lowercase())
}

/// How often a volume waiting on something outside the inputs (a device node's permissions,
/// a busy disk) is looked at again.
const RETRY: Duration = Duration::from_secs(1);

/// What mkfs.xfs is asked to do for `volume` on `device` (`size` bytes): upstream's options
/// (`-n ftype=1`, the label, `--unsupported` at 300 MiB or less, which xfsprogs requires for
/// such small filesystems); `-f` only with `force`, for an xfs whose own mkfs never finished
/// (otherwise mkfs itself refuses a device that holds a filesystem).
pub fn mkfs_spec(
    format: &FormatOptions,
    label: &str,
    device: &str,
    size: u64,
    force: bool,
) -> ServiceSpecSpec {
    let mut args: Vec<String> = if force { vec!["-f".into()] } else { Vec::new() };
    args.extend(["-n".into(), "ftype=1".into(), "-L".into(), label.into()]);
    if size <= 300 * MIB {
        args.push("--unsupported".into());
    }
    args.push(device.into());
    let path = |p: &str, access: &str| ServicePath {
        path: p.into(),
        access: access.into(),
    };
    ServiceSpecSpec {
        binary: format.mkfs_xfs.to_string_lossy().into_owned(),
        args,
        env: BTreeMap::new(),
        uid: format.uid,
        gid: format.uid,
        capabilities: vec!["CAP_SYS_ADMIN".into(), "CAP_DAC_OVERRIDE".into()],
        paths: vec![
            path(device, "read-write"),
            path("/sys", "read-only"),
            path("/proc", "read-only"),
            path(&format.mkfs_xfs.to_string_lossy(), "exec"),
            path("/usr/lib", "exec"),
            path("/lib64", "exec"),
        ],
        bind_tcp: vec![],
        connect_tcp: vec![],
        seccomp_profile: "mkfs".into(),
        restart: false,
    }
}

/// The first disk a new system layout may go on: writable, not a CD, found blank, big
/// enough for every partition's minimum (with 2 MiB for the GPT and alignment), by name.
fn blank_disk<'a>(
    disks: &'a [DiskSpec],
    volumes: &[DiscoveredVolumeSpec],
    need: u64,
) -> Result<&'a DiskSpec, String> {
    let mut why = Vec::new();
    let mut sorted: Vec<&DiskSpec> = disks.iter().collect();
    sorted.sort_by(|a, b| a.dev_path.cmp(&b.dev_path));
    for d in sorted {
        let whole = volumes
            .iter()
            .find(|v| v.kind == "disk" && v.dev_path == d.dev_path);
        let reason = if d.readonly {
            "read-only".to_string()
        } else if d.cdrom {
            "a CD".to_string()
        } else if d.size < need {
            format!("{} < {} needed", pretty_size(d.size), pretty_size(need))
        } else {
            match whole {
                None => "not probed yet".to_string(),
                Some(v) if !v.name.is_empty() => format!("holds {}", v.name),
                Some(_) => return Ok(d),
            }
        };
        why.push(format!("{}: {reason}", d.dev_path));
    }
    if why.is_empty() {
        Err("no disk".into())
    } else {
        Err(format!(
            "no blank disk for the system volumes ({})",
            why.join("; ")
        ))
    }
}

impl Controller for VolumeManagerController {
    fn name(&self) -> &'static str {
        "block.VolumeManagerController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<VolumeConfigSpec>(NAMESPACE),
            Input::weak::<DiscoveredVolumeSpec>(NAMESPACE),
            Input::weak::<DiskSpec>(NAMESPACE),
            Input::weak::<ServiceStatusSpec>(machinery::resources::runtime::NAMESPACE),
            Input::weak::<MachineStatusSpec>(machinery::resources::runtime::NAMESPACE)
                .with_id(MACHINE_STATUS_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<VolumeStatusSpec>(),
            Output::exclusive::<ServiceSpecSpec>().in_namespace(NAMESPACE),
        ]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let mut configs = ctx.list::<VolumeConfigSpec>(NAMESPACE).await?;
        // Fixed sizes first, then growing ones (upstream's order), then by ID.
        configs.sort_by(|a, b| {
            (
                a.spec.provisioning.wave,
                a.spec.provisioning.partition_spec.grow,
                &a.metadata.id,
            )
                .cmp(&(
                    b.spec.provisioning.wave,
                    b.spec.provisioning.partition_spec.grow,
                    &b.metadata.id,
                ))
        });
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
        let mut statuses: Vec<(String, VolumeStatusSpec)> = configs
            .iter()
            .map(|c| {
                let mut st = status(&c.spec, &volumes, &disks);
                if st.phase == "missing" {
                    // Partitioned here, not discovered yet: located at what was written.
                    if let Some(v) = self.provisioned.get(&c.metadata.id) {
                        st = status(&c.spec, std::slice::from_ref(v), &disks);
                    }
                } else if st.phase != "waiting" {
                    self.provisioned.remove(&c.metadata.id);
                }
                (c.metadata.id.clone(), st)
            })
            .collect();
        let mut again = false;
        // Disks are written only once the machine is configured (as upstream, which has no
        // system volume to provision in maintenance): a machine booted to be installed is
        // not touched before someone applies a configuration.
        let configured = ctx
            .get::<MachineStatusSpec>(machinery::resources::runtime::NAMESPACE, MACHINE_STATUS_ID)
            .await?
            .is_some_and(|m| m.spec.stage == MachineStage::Running);
        if !configured {
            // A format under way ends with its service (withdrawn below): its lock goes too.
            self.formatting.clear();
            self.release_idle_locks();
            for (_, st) in &mut statuses {
                match st.phase.as_str() {
                    "missing" => {
                        st.error_message =
                            "not found; nothing is written to a disk before the machine is configured".into();
                    }
                    "located" => {
                        st.error_message = format!(
                            "{}; formatted once the machine is configured",
                            st.error_message
                        );
                    }
                    _ => {}
                }
            }
            ctx.apply_all(std::iter::empty::<Resource<ServiceSpecSpec>>())
                .await?;
            ctx.apply_all(
                statuses
                    .into_iter()
                    .map(|(id, st)| Resource::new(NAMESPACE, &id, st)),
            )
            .await?;
            return Ok(Action::AwaitChange);
        }

        // Nothing of the system layout anywhere: partition a blank disk for all of it.
        let wanted: Vec<usize> = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.spec.provisioning.partition_spec.label.is_empty())
            .map(|(i, _)| i)
            .collect();
        if !wanted.is_empty() && wanted.iter().all(|&i| statuses[i].1.phase == "missing") {
            let need: u64 = wanted
                .iter()
                .map(|&i| configs[i].spec.provisioning.partition_spec.min_size)
                .sum::<u64>()
                + 2 * MIB;
            match blank_disk(&disks, &volumes, need) {
                Ok(disk) => {
                    let specs: Vec<PartitionSpec> = wanted
                        .iter()
                        .map(|&i| configs[i].spec.provisioning.partition_spec.clone())
                        .collect();
                    let path = PathBuf::from(&disk.dev_path);
                    let sector = disk.sector_size;
                    let written = tokio::task::spawn_blocking(move || {
                        crate::provision::partition_blank_disk(&path, sector, &specs)
                    })
                    .await
                    .map_err(|e| ReconcileError::other(format!("partitioning ended: {e}")))?;
                    match written {
                        Ok(created) => {
                            tracing::info!(disk = %disk.dev_path, partitions = created.len(), "partitioned for the system volumes");
                            let name = disk.dev_path.rsplit('/').next().unwrap_or_default();
                            for c in created {
                                let Some(&i) = wanted.iter().find(|&&i| {
                                    configs[i].spec.provisioning.partition_spec.label == c.label
                                }) else {
                                    continue;
                                };
                                let dir = std::path::Path::new(&disk.dev_path)
                                    .parent()
                                    .map(PathBuf::from)
                                    .unwrap_or_default();
                                let part = crate::sysfs::partition_name(name, u64::from(c.index));
                                let v = DiscoveredVolumeSpec {
                                    dev_path: dir.join(&part).to_string_lossy().into_owned(),
                                    kind: "partition".into(),
                                    parent: name.to_string(),
                                    parent_dev_path: disk.dev_path.clone(),
                                    size: c.size,
                                    sector_size: disk.sector_size,
                                    partition_label: c.label.clone(),
                                    partition_type: LINUX_DATA.into(),
                                    partition_index: u64::from(c.index),
                                    ..Default::default()
                                };
                                let id = configs[i].metadata.id.clone();
                                statuses[i].1 =
                                    status(&configs[i].spec, std::slice::from_ref(&v), &disks);
                                statuses[i].1.phase = "provisioned".into();
                                self.provisioned.insert(id, v);
                            }
                            again = true;
                        }
                        Err(e) => {
                            tracing::warn!(disk = %disk.dev_path, error = %e, "cannot partition");
                            for &i in &wanted {
                                statuses[i].1.phase = "failed".into();
                                statuses[i].1.error_message = format!("partitioning: {e}");
                            }
                        }
                    }
                }
                Err(why) => {
                    for &i in &wanted {
                        statuses[i].1.error_message = format!("not found; {why}");
                    }
                }
            }
        }

        // Blank partitions of ours: formatted by the mkfs service, under the disk's lock.
        let services: BTreeMap<String, ServiceStatusSpec> = ctx
            .list::<ServiceStatusSpec>(machinery::resources::runtime::NAMESPACE)
            .await?
            .into_iter()
            .map(|r| (r.metadata.id, r.spec))
            .collect();
        let asked: BTreeMap<String, ServiceSpecSpec> = ctx
            .list::<ServiceSpecSpec>(NAMESPACE)
            .await?
            .into_iter()
            .map(|r| (r.metadata.id, r.spec))
            .collect();
        let mut mkfs = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let id = &c.metadata.id;
            let st = &mut statuses[i].1;
            let fs = &c.spec.provisioning.filesystem_spec;
            if !matches!(st.phase.as_str(), "located" | "provisioned") || fs.kind != "xfs" {
                self.formatting.remove(id);
                continue;
            }
            if let Some(e) = self.format_failed.get(id) {
                st.phase = "failed".into();
                st.error_message = e.clone();
                continue;
            }
            let service = mkfs_service_id(id);
            let mut just_formatted = false;
            if let Some(f) = self.formatting.get(id).filter(|f| f.device == st.location) {
                let run = services.get(&service);
                match run.map(|r| r.state) {
                    Some(ServiceState::Finished) | Some(ServiceState::Failed) => {
                        let done = run.cloned().unwrap_or_default();
                        let device = f.device.clone();
                        self.formatting.remove(id);
                        if done.state == ServiceState::Failed {
                            let e = format!(
                                "mkfs.xfs failed ({}{}): see `talosctl logs {service}`",
                                done.last_exit,
                                if done.message.is_empty() {
                                    String::new()
                                } else {
                                    format!(", {}", done.message)
                                }
                            );
                            tracing::warn!(volume = %id, %device, error = %e, "cannot format");
                            self.format_failed.insert(id.clone(), e.clone());
                            st.phase = "failed".into();
                            st.error_message = e;
                            continue;
                        }
                        // Probed below, under the lock again (released with the entry).
                        just_formatted = true;
                    }
                    _ => {
                        st.phase = "prepared".into();
                        st.error_message = format!("formatting {} (xfs, {service})", f.device);
                        mkfs.push(Resource::new(NAMESPACE, &service, f.spec.clone()));
                        continue;
                    }
                }
            } else if services.get(&service).is_some_and(|r| {
                matches!(
                    r.state,
                    ServiceState::Waiting
                        | ServiceState::Starting
                        | ServiceState::Running
                        | ServiceState::Stopping
                )
            }) {
                // A format a previous life of blockd asked for (killed meanwhile, its lock
                // gone with it): the spec is kept (withdrawing it would stop mkfs half-way)
                // and its end awaited; the probe after it decides.
                st.phase = "prepared".into();
                st.error_message = format!("waiting for {service} (asked before a restart)");
                let asked = asked.get(&service).cloned().unwrap_or_else(|| {
                    mkfs_spec(&self.format, &fs.label, &st.location, st.size, false)
                });
                mkfs.push(Resource::new(NAMESPACE, &service, asked));
                again = true;
                continue;
            }
            // Probe under the disk's exclusive lock: blank → format; the wanted filesystem
            // (just formatted, or discovery not caught up) → ready.
            let device = st.location.clone();
            let disk = st.parent_location.clone();
            let sector = disks
                .iter()
                .find(|d| d.dev_path == disk)
                .map_or(512, |d| d.sector_size);
            self.release_idle_locks();
            let held = self.locks.contains_key(&disk);
            let probed =
                tokio::task::spawn_blocking(move || lock_and_probe(&disk, &device, sector, held))
                    .await
                    .map_err(|e| ReconcileError::other(format!("probing ended: {e}")))?;
            match probed {
                Err(e) => {
                    st.error_message = format!("{}: {e}", st.location);
                    again = true;
                }
                Ok((found, _)) if just_formatted && (found.name != fs.kind || found.incomplete) => {
                    st.phase = "failed".into();
                    st.error_message = format!(
                        "mkfs.xfs ended well but {} holds {:?}: see `talosctl logs {service}`",
                        st.location, found.name
                    );
                    self.format_failed
                        .insert(id.clone(), st.error_message.clone());
                }
                Ok((found, lock))
                    if found.name.is_empty() || (found.incomplete && found.name == fs.kind) =>
                {
                    // An xfs whose mkfs was stopped half-way (a reboot during the first
                    // format) is made again, forced: nothing was ever stored on it.
                    let force = found.incomplete;
                    tracing::info!(volume = %id, device = %st.location, force, "formatting (xfs)");
                    st.phase = "prepared".into();
                    st.error_message = format!("formatting {} (xfs, {service})", st.location);
                    let spec = mkfs_spec(&self.format, &fs.label, &st.location, st.size, force);
                    mkfs.push(Resource::new(NAMESPACE, &service, spec.clone()));
                    if let Some(lock) = lock {
                        self.locks.insert(st.parent_location.clone(), lock);
                    }
                    self.formatting.insert(
                        id.clone(),
                        Formatting {
                            device: st.location.clone(),
                            disk: st.parent_location.clone(),
                            spec,
                        },
                    );
                }
                Ok((found, _)) if found.name == fs.kind => {
                    st.phase = "ready".into();
                    st.error_message.clear();
                    st.filesystem = found.name;
                    st.uuid = found.uuid;
                }
                Ok((found, _)) => {
                    st.phase = "failed".into();
                    st.error_message = format!(
                        "filesystem type mismatch: {} holds {}, the volume wants {} (it is never \
                         reformatted)",
                        st.location, found.name, fs.kind
                    );
                }
            }
        }
        self.release_idle_locks();
        ctx.apply_all(mkfs).await?;
        ctx.apply_all(
            statuses
                .into_iter()
                .map(|(id, st)| Resource::new(NAMESPACE, &id, st)),
        )
        .await?;
        Ok(if again {
            Action::RequeueAfter(RETRY)
        } else {
            Action::AwaitChange
        })
    }
}

impl VolumeManagerController {
    /// Drops the lock of every disk no format runs on any more.
    fn release_idle_locks(&mut self) {
        let busy: std::collections::BTreeSet<&String> =
            self.formatting.values().map(|f| &f.disk).collect();
        self.locks.retain(|disk, _| busy.contains(disk));
    }
}

/// Takes `disk`'s exclusive lock (as every writer of it does) unless this blockd already
/// `held` it, and probes `device`, one of its partitions, under it.
fn lock_and_probe(
    disk: &str,
    device: &str,
    sector_size: u64,
    held: bool,
) -> Result<
    (
        crate::probe::Found,
        Option<nix::fcntl::Flock<std::fs::File>>,
    ),
    String,
> {
    let lock = if held {
        None
    } else {
        let file = std::fs::File::open(disk).map_err(|e| format!("cannot open {disk}: {e}"))?;
        Some(
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
                .map_err(|(_, e)| format!("cannot lock {disk}: {e}"))?,
        )
    };
    let found = crate::probe::probe(std::path::Path::new(device), sector_size)
        .map_err(|e| cosi::error::Chain(&e).to_string())?;
    Ok((found, lock))
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
        assert!(st.error_message.contains("blank"), "{st:?}");

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
