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
    ProvisioningSpec, SystemDiskSpec, VolumeConfigSpec, VolumeMountSpec, VolumeStatusSpec,
    NAMESPACE, SYSTEM_DISK_ID,
};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
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
    /// blkid, asked before a disk is written.
    pub blkid: crate::blkid::BlkidOptions,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            mkfs_xfs: PathBuf::from("/usr/bin/mkfs.xfs"),
            uid: 1_990_001_500,
            blkid: crate::blkid::BlkidOptions::default(),
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
    /// blkid's verdicts on candidate system disks, by device, with the disk's size then.
    blkid: BTreeMap<String, (u64, crate::blkid::Verdict)>,
    /// The disk blkid was asked about (its device and size), until its verdict.
    asking: Option<(String, u64)>,
    /// Why no system disk was chosen, as last logged.
    said: String,
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
            blkid: BTreeMap::new(),
            asking: None,
            said: String::new(),
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

/// The disk the machine's configuration names for the system (upstream's install disk):
/// `machine.install.diskSelector` (it wins, as upstream's), else `machine.install.disk`.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum InstallDisk {
    /// `machine.install.disk`.
    Disk(String),
    /// `machine.install.diskSelector`.
    Selector(machinery::config::v1alpha1::InstallDiskSelector),
    /// Neither (or no configuration): no disk is written.
    #[default]
    Unset,
}

impl InstallDisk {
    /// What the configuration text `config` names.
    pub fn of(config: Option<&str>) -> Self {
        let Some(config) = config.and_then(|t| machinery::config::Config::from_yaml(t).ok()) else {
            return InstallDisk::Unset;
        };
        let install = config
            .v1alpha1
            .as_ref()
            .and_then(|v| v.machine.as_ref())
            .and_then(|m| m.install.as_ref());
        match install {
            Some(i) if i.disk_selector.is_some() => {
                InstallDisk::Selector(i.disk_selector.clone().unwrap_or_default())
            }
            Some(i) if i.disk.as_deref().is_some_and(|d| !d.is_empty()) => {
                InstallDisk::Disk(i.disk.clone().unwrap_or_default())
            }
            _ => InstallDisk::Unset,
        }
    }

    /// Whether `disk` is one it names (`Err`: the selector cannot be evaluated).
    fn names(&self, disk: &DiskSpec) -> Result<bool, String> {
        match self {
            InstallDisk::Disk(d) => Ok(*d == disk.dev_path),
            InstallDisk::Selector(s) => s.matches(disk),
            InstallDisk::Unset => Ok(false),
        }
    }

    /// How it is named, for people.
    fn said(&self) -> &'static str {
        match self {
            InstallDisk::Disk(_) => "machine.install.disk",
            InstallDisk::Selector(_) => "machine.install.diskSelector",
            InstallDisk::Unset => "no install disk",
        }
    }
}

/// Where the choice of the system disk stands.
#[derive(Debug, PartialEq)]
enum Choice<'a> {
    /// This disk, found blank by every probe.
    Disk(&'a DiskSpec),
    /// blkid must be asked about this disk first (the first candidate it has not answered).
    AskBlkid(&'a DiskSpec),
    /// None: why.
    None(String),
}

/// The disk a new system layout goes on, as upstream chooses its install disk: the disks the
/// configuration names (`install`), in ID order, the first that is writable, not a CD, big
/// enough for every partition's minimum (`need`) and on which nothing is found: by blockd's
/// probe (`volumes`: no partition table or filesystem it knows; `in_use`: no data in the first
/// or last MiB) and by blkid (`blkid`). Never a disk the configuration does not name, and
/// never a disk with anything on it: each one passed over is said, with why.
fn choose_system_disk<'a>(
    install: &InstallDisk,
    disks: &'a [DiskSpec],
    volumes: &[DiscoveredVolumeSpec],
    need: u64,
    in_use: &BTreeMap<String, Result<bool, String>>,
    blkid: &BTreeMap<String, crate::blkid::Verdict>,
) -> Choice<'a> {
    if *install == InstallDisk::Unset {
        return Choice::None(
            "the configuration names no install disk (machine.install.disk or diskSelector): \
             no disk is written"
                .into(),
        );
    }
    let mut sorted: Vec<&DiskSpec> = disks.iter().collect();
    sorted.sort_by(|a, b| a.dev_path.cmp(&b.dev_path));
    let mut why = Vec::new();
    for d in sorted {
        match install.names(d) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return Choice::None(format!("{}: {e}", install.said())),
        }
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
            match (whole, in_use.get(&d.dev_path), blkid.get(&d.dev_path)) {
                (None, _, _) => "not probed yet".to_string(),
                (Some(v), _, _) if !v.name.is_empty() => format!("holds {}", v.name),
                (_, Some(Err(e)), _) => format!("cannot be read ({e})"),
                (_, None, _) => "not probed yet".to_string(),
                (_, Some(Ok(true)), Some(v)) => format!(
                    "holds {}",
                    v.holds()
                        .unwrap_or_else(|| crate::probe::IN_USE.to_string())
                ),
                (_, Some(Ok(_)), None) => return Choice::AskBlkid(d),
                (_, Some(Ok(false)), Some(v)) => match v.holds() {
                    None => return Choice::Disk(d),
                    Some(what) => format!("holds {what}"),
                },
            }
        };
        why.push(format!("{}: {reason}", d.dev_path));
    }
    if why.is_empty() {
        Choice::None(format!("{} names no disk of this machine", install.said()))
    } else {
        Choice::None(format!(
            "no disk for the system volumes ({}: {}; nothing is ever written over a disk that \
             holds anything)",
            install.said(),
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
            Input::weak::<MachineConfigSpec>(REDACTED_NAMESPACE).with_id(ACTIVE_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<VolumeStatusSpec>(),
            Output::exclusive::<ServiceSpecSpec>().in_namespace(NAMESPACE),
            Output::exclusive::<SystemDiskSpec>(),
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
            self.apply_system_disk(ctx, &configs, &statuses, &disks)
                .await?;
            ctx.apply_all(
                statuses
                    .into_iter()
                    .map(|(id, st)| Resource::new(NAMESPACE, &id, st)),
            )
            .await?;
            return Ok(Action::AwaitChange);
        }
        let services: BTreeMap<String, ServiceStatusSpec> = ctx
            .list::<ServiceStatusSpec>(machinery::resources::runtime::NAMESPACE)
            .await?
            .into_iter()
            .map(|r| (r.metadata.id, r.spec))
            .collect();
        // The services asked this cycle: mkfs for blank partitions, blkid for a disk.
        let mut asked_now: Vec<Resource<ServiceSpecSpec>> = Vec::new();

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
            let install = InstallDisk::of(
                ctx.get::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
                    .await?
                    .map(|c| c.spec.0)
                    .as_deref(),
            );
            let in_use = in_use_of(&install, &disks, &volumes).await?;
            let verdicts: BTreeMap<String, crate::blkid::Verdict> = self
                .blkid
                .iter()
                .filter(|(dev, (size, _))| {
                    disks.iter().any(|d| d.dev_path == **dev && d.size == *size)
                })
                .map(|(dev, (_, v))| (dev.clone(), v.clone()))
                .collect();
            match choose_system_disk(&install, &disks, &volumes, need, &in_use, &verdicts) {
                Choice::AskBlkid(disk) => {
                    asked_now.extend(self.ask_blkid(disk, &services));
                    for &i in &wanted {
                        statuses[i].1.error_message = format!(
                            "not found; asking blkid what {} ({}) holds before anything is \
                             written to it",
                            disk.dev_path,
                            install.said()
                        );
                    }
                    again = true;
                }
                Choice::Disk(disk) => {
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
                Choice::None(why) => {
                    if self.said != why {
                        tracing::info!(reason = %why, "the system volumes are not written to any disk");
                        self.said.clone_from(&why);
                    }
                    for &i in &wanted {
                        statuses[i].1.error_message = format!("not found; {why}");
                    }
                }
            }
        }

        // Blank partitions of ours: formatted by the mkfs service, under the disk's lock.
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
        mkfs.extend(asked_now);
        ctx.apply_all(mkfs).await?;
        self.apply_system_disk(ctx, &configs, &statuses, &disks)
            .await?;
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
    /// Asks blkid about `disk` (its service's spec to apply) unless its verdict came, which is
    /// then kept; `None` while a status of an earlier run of that service is still there
    /// (withdrawn first, so that no earlier verdict is taken for this one).
    fn ask_blkid(
        &mut self,
        disk: &DiskSpec,
        services: &BTreeMap<String, ServiceStatusSpec>,
    ) -> Option<Resource<ServiceSpecSpec>> {
        let name = disk.dev_path.rsplit('/').next().unwrap_or_default();
        let id = crate::blkid::service_id(name);
        let status = services.get(&id);
        let this = Some((disk.dev_path.clone(), disk.size));
        if self.asking != this {
            if status.is_some() {
                // A run of before (another size of the disk, a blockd of before): withdrawn.
                return None;
            }
            self.asking = this;
        } else if let Some(v) = status.and_then(crate::blkid::verdict) {
            tracing::info!(disk = %disk.dev_path, verdict = ?v, "blkid answered");
            self.blkid.insert(disk.dev_path.clone(), (disk.size, v));
            self.asking = None;
            return None;
        }
        Some(Resource::new(
            NAMESPACE,
            &id,
            crate::blkid::spec(&self.format.blkid, &disk.dev_path),
        ))
    }

    /// `SystemDisks/system-disk`: the disk STATE is on, once located.
    async fn apply_system_disk(
        &self,
        ctx: &mut Context,
        configs: &[Resource<VolumeConfigSpec>],
        statuses: &[(String, VolumeStatusSpec)],
        disks: &[DiskSpec],
    ) -> Result<(), ReconcileError> {
        let state = configs
            .iter()
            .zip(statuses)
            .find(|(c, _)| c.metadata.id == "STATE")
            .map(|(_, (_, st))| st)
            .filter(|st| !st.parent_location.is_empty());
        let disk = state.and_then(|st| disks.iter().find(|d| d.dev_path == st.parent_location));
        ctx.apply_all(disk.map(|d| {
            Resource::new(
                NAMESPACE,
                SYSTEM_DISK_ID,
                SystemDiskSpec {
                    disk_id: d
                        .dev_path
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                    dev_path: d.dev_path.clone(),
                },
            )
        }))
        .await?;
        Ok(())
    }

    /// Drops the lock of every disk no format runs on any more.
    fn release_idle_locks(&mut self) {
        let busy: std::collections::BTreeSet<&String> =
            self.formatting.values().map(|f| &f.disk).collect();
        self.locks.retain(|disk, _| busy.contains(disk));
    }
}

/// Whether each disk `install` names, on which blockd's probe found nothing it knows, holds data
/// in its first or last MiB (read now, off the async workers).
async fn in_use_of(
    install: &InstallDisk,
    disks: &[DiskSpec],
    volumes: &[DiscoveredVolumeSpec],
) -> Result<BTreeMap<String, Result<bool, String>>, ReconcileError> {
    let candidates: Vec<(String, u64)> = disks
        .iter()
        .filter(|d| install.names(d).unwrap_or(false))
        .filter(|d| {
            volumes
                .iter()
                .any(|v| v.kind == "disk" && v.dev_path == d.dev_path && v.name.is_empty())
        })
        .map(|d| (d.dev_path.clone(), d.sector_size))
        .collect();
    tokio::task::spawn_blocking(move || {
        candidates
            .into_iter()
            .map(|(dev, sector)| {
                let r = crate::probe::probe(std::path::Path::new(&dev), sector)
                    .map(|f| f.in_use || !f.name.is_empty())
                    .map_err(|e| cosi::error::Chain(&e).to_string());
                (dev, r)
            })
            .collect()
    })
    .await
    .map_err(|e| ReconcileError::other(format!("probing ended: {e}")))
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
        match std::fs::File::open(disk) {
            Ok(file) => Some(
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
                    .map_err(|(_, e)| format!("cannot lock {disk}: {e}"))?,
            ),
            // The disk holds a mounted system volume (init made it root's, STATE's keys are
            // on it): its layout cannot change while it is mounted; the partition alone is
            // probed (and formatted) without the disk's lock.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => None,
            Err(e) => return Err(format!("cannot open {disk}: {e}")),
        }
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

    #[test]
    fn the_system_disk_is_the_first_blank_one_the_configuration_names() {
        use crate::blkid::Verdict;
        let disk = |name: &str, size: u64| DiskSpec {
            dev_path: format!("/dev/{name}"),
            size,
            transport: "virtio".into(),
            ..DiskSpec::default()
        };
        let whole = |name: &str, holds: &str| DiscoveredVolumeSpec {
            dev_path: format!("/dev/{name}"),
            kind: "disk".into(),
            name: holds.into(),
            ..Default::default()
        };
        let gb = 1_000_000_000;
        let disks = [disk("vda", 8 * gb), disk("vdb", 8 * gb), disk("vdc", gb)];
        let volumes = [whole("vda", ""), whole("vdb", ""), whole("vdc", "")];
        let need = 3 * gb;
        let mut in_use = BTreeMap::new();
        in_use.insert("/dev/vda".to_string(), Ok(true));
        in_use.insert("/dev/vdb".to_string(), Ok(false));
        let mut blkid = BTreeMap::new();
        let sel = InstallDisk::Selector(machinery::config::v1alpha1::InstallDiskSelector {
            size: Some(">= 1GB".into()),
            ..Default::default()
        });
        // Nothing is chosen by name order alone: without an install disk, no disk.
        let none = choose_system_disk(&InstallDisk::Unset, &disks, &volumes, need, &in_use, &blkid);
        assert!(
            matches!(none, Choice::None(ref w) if w.contains("names no install disk")),
            "{none:?}"
        );
        // vda holds data: blkid is asked to name it first, then it is passed over.
        assert_eq!(
            choose_system_disk(&sel, &disks, &volumes, need, &in_use, &blkid),
            Choice::AskBlkid(&disks[0])
        );
        blkid.insert(
            "/dev/vda".to_string(),
            Verdict::Found("a partition table (dos)".into()),
        );
        assert_eq!(
            choose_system_disk(&sel, &disks, &volumes, need, &in_use, &blkid),
            Choice::AskBlkid(&disks[1])
        );
        blkid.insert("/dev/vdb".to_string(), Verdict::Nothing);
        assert_eq!(
            choose_system_disk(&sel, &disks, &volumes, need, &in_use, &blkid),
            Choice::Disk(&disks[1])
        );
        // blkid finds what blockd's probe does not: then vdb too is passed over, each said why.
        blkid.insert(
            "/dev/vdb".to_string(),
            Verdict::Found("LVM2_member (raid)".into()),
        );
        let c = choose_system_disk(&sel, &disks, &volumes, need, &in_use, &blkid);
        let Choice::None(why) = c else {
            panic!("{c:?}")
        };
        assert!(
            why.contains("/dev/vda: holds a partition table (dos)"),
            "{why}"
        );
        assert!(why.contains("/dev/vdb: holds LVM2_member (raid)"), "{why}");
        assert!(why.contains("/dev/vdc: 1.0 GB < 3.0 GB needed"), "{why}");
        // The disk named is the only one considered.
        let named = InstallDisk::Disk("/dev/vdc".into());
        let c = choose_system_disk(&named, &disks, &volumes, need, &in_use, &blkid);
        assert!(
            matches!(c, Choice::None(ref w) if w.contains("/dev/vdc") && !w.contains("vda")),
            "{c:?}"
        );
        let nowhere = InstallDisk::Disk("/dev/sdz".into());
        let c = choose_system_disk(&nowhere, &disks, &volumes, need, &in_use, &blkid);
        assert!(
            matches!(c, Choice::None(ref w) if w.contains("names no disk")),
            "{c:?}"
        );
    }
}
