//! The system volumes blockd prepares (STATE, EPHEMERAL), mounted by init: blockd partitions
//! and formats, but a landlocked process cannot mount, and STATE must be in place before
//! stated starts (it holds stated's durable namespaces, the machine configuration among them).
//!
//! - At boot, as a VM's PID 1 and before stated: the storage modules are loaded and the one
//!   partition labelled STATE (the kernel's `PARTNAME`), if it holds xfs, is mounted at
//!   `/system/state` ([`mount_state_early`]): the configuration of the last boot is back.
//! - `runtime.SystemVolumeMountController`: once blockd says a system volume is `ready`, mounts
//!   it where it belongs (STATE on its first boot: what stated wrote so far is copied onto it,
//!   under the config writer's lock, then the new filesystem is moved over the directory and
//!   stated restarted in place, its landlock rule then naming the new filesystem;
//!   EPHEMERAL at `/var`) and publishes a `MountStatus` for each mounted one. It never mounts
//!   over a mount, and only a partition of this machine's disks that holds xfs.
//!
//! A mounted system volume's partition and the disk that holds it are no daemon's from the
//! moment it is mounted (crate::devices): STATE's before what stated wrote is copied onto it,
//! blockd restarted if it could open them (no fd of it survives), and at boot before any
//! daemon starts.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::block::{MountRequestSpec, MountStatusSpec, VolumeStatusSpec};
use nix::mount::{mount, MsFlags};

use crate::devices::DeviceAccess;

/// A system volume's place.
pub struct SystemMount {
    /// The volume (its partition label).
    pub volume: &'static str,
    /// Where it is mounted.
    pub target: &'static str,
    /// Mount flags (STATE: nosuid, nodev, noexec as upstream's `secure`; EPHEMERAL: none).
    pub flags: MsFlags,
}

/// STATE and EPHEMERAL ([`machinery::resources::block::SYSTEM_VOLUMES`]).
pub fn system_mounts() -> [SystemMount; 2] {
    let [state, ephemeral] = machinery::resources::block::SYSTEM_VOLUMES;
    [
        SystemMount {
            volume: state,
            target: "/system/state",
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        },
        SystemMount {
            volume: ephemeral,
            target: "/var",
            flags: MsFlags::empty(),
        },
    ]
}

/// The modules a VM needs to see its disks, loaded before STATE is looked for (those the image
/// carries; absent ones are skipped).
const DISK_MODULES: &[&str] = &["virtio_pci", "virtio_blk"];

/// The modules a VM needs to mount STATE, loaded only when there is one (on a first boot they
/// load later, beside the daemons' start, with the other boot modules).
const XFS_MODULES: &[&str] = &["crc32c_generic", "xfs"];

/// The kernel name of the one partition whose GPT name is `label` (`Ok(None)`: none).
///
/// # Errors
///
/// More than one partition has that name: which is meant cannot be told.
pub fn partition_by_label(sys_class_block: &Path, label: &str) -> Result<Option<String>, String> {
    let Ok(entries) = std::fs::read_dir(sys_class_block) else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Ok(uevent) = std::fs::read_to_string(e.path().join("uevent")) else {
            continue;
        };
        let mut devname = None;
        let mut partname = None;
        let mut partition = false;
        for line in uevent.lines() {
            match line.split_once('=') {
                Some(("DEVNAME", v)) => devname = Some(v.to_string()),
                Some(("PARTNAME", v)) => partname = Some(v.to_string()),
                Some(("DEVTYPE", "partition")) => partition = true,
                _ => {}
            }
        }
        if partition && partname.as_deref() == Some(label) {
            if let Some(d) = devname {
                found.push(d);
            }
        }
    }
    found.sort();
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => Err(format!(
            "{} partitions are named {label}: {}",
            many.len(),
            many.join(", ")
        )),
    }
}

/// Whether the device at `path` starts with the superblock of a finished xfs (`XFSB`, and
/// `sb_inprogress` clear: mkfs.xfs sets it first and clears it when done).
pub fn holds_xfs(path: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 128];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head[..4] == b"XFSB"
        && head[126] == 0
}

/// The source and filesystem of the mount at `target` in `mountinfo` (`/proc/self/mountinfo`
/// text), the last one if several are stacked.
pub fn mounted_at(mountinfo: &str, target: &str) -> Option<(String, String)> {
    mountinfo.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split_whitespace().nth(4)?;
        let mut r = right.split_whitespace();
        let fstype = r.next()?;
        let source = r.next()?;
        (crate::mounts::parse(&format!("x {point}"))
            .first()
            .map(|(_, p)| p.as_str())
            == Some(target))
        .then(|| (source.to_string(), fstype.to_string()))
    })
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

/// The device node of a volume blockd located, if it is one of this machine's partitions:
/// `/dev/<name>` with `<name>` a partition in sysfs, holding xfs.
fn checked_device(location: &str, sys_class_block: &Path) -> Result<PathBuf, String> {
    let name = location
        .strip_prefix("/dev/")
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()))
        .ok_or_else(|| format!("{location:?} is not a device node of /dev"))?;
    if !sys_class_block.join(name).join("partition").exists() {
        return Err(format!("{location} is not a partition"));
    }
    let dev = Path::new("/dev").join(name);
    if !holds_xfs(&dev) {
        return Err(format!("{location} holds no xfs"));
    }
    Ok(dev)
}

fn mount_xfs(dev: &Path, target: &Path, flags: MsFlags) -> Result<(), String> {
    mount(Some(dev), target, Some("xfs"), flags, None::<&str>).map_err(|e| {
        format!(
            "cannot mount {} at {}: {e}",
            dev.display(),
            target.display()
        )
    })
}

/// Loads kernel modules (those already loaded or built in are left alone); failures are
/// debug lines: what needs them reports its own error.
fn load_modules(modules: &[&str]) {
    let index = match crate::kmod::ModuleIndex::for_running_kernel() {
        Ok(index) => index,
        Err(e) => {
            tracing::warn!(error = %e, "no kernel modules index");
            return;
        }
    };
    for m in modules {
        if let Err(e) = index.load(m, &[]) {
            tracing::debug!(module = m, error = %e, "storage module not loaded");
        }
    }
}

/// As a VM's PID 1, before stated starts: loads the storage modules and mounts the partition
/// named STATE at `/system/state` when there is exactly one and it holds xfs. Anything else
/// (no disk, a first boot, a broken STATE) is logged, and the boot goes on with the image's
/// directory (blockd then prepares STATE, and the controller mounts it). EPHEMERAL, when
/// it holds xfs, is mounted at `/var` the same way. What is mounted is protected at once
/// (`devices`): no daemon runs yet, none has to be restarted.
pub fn mount_state_early(devices: &DeviceAccess) {
    mount_early(devices);
    let applied = devices.apply();
    if !applied.failed.is_empty() {
        tracing::error!(failed = ?applied.failed, "cannot protect the system volumes' devices");
    }
}

fn mount_early(devices: &DeviceAccess) {
    let load = load_modules;
    load(DISK_MODULES);
    let sys = Path::new("/sys/class/block");
    let target = Path::new("/system/state");
    if mounted_at(&mountinfo(), "/system/state").is_some() {
        return;
    }
    // Disks appear as their drivers probe them, and a disk's partitions a little after it: a
    // VM without any disk gets a second, one whose disk has a GPT the time for the kernel to
    // list its partitions (2 s at most).
    let start = std::time::Instant::now();
    let name = loop {
        let waited = start.elapsed();
        match partition_by_label(sys, "STATE") {
            Ok(Some(n)) => break n,
            Ok(None)
                if (waited < std::time::Duration::from_secs(1) && !has_disk(sys))
                    || (waited < std::time::Duration::from_secs(2) && gpt_not_listed_yet(sys)) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(None) => {
                tracing::info!("no STATE partition yet: the configuration lives in memory until blockd prepares one");
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "STATE not mounted");
                return;
            }
        }
    };
    load(XFS_MODULES);
    let dev = Path::new("/dev").join(&name);
    if !holds_xfs(&dev) {
        tracing::warn!(device = %dev.display(), "the STATE partition holds no xfs yet: not mounted");
        return;
    }
    let _ = std::fs::create_dir_all(target);
    match mount_xfs(&dev, target, system_mounts()[0].flags) {
        Ok(()) => {
            devices.claim("STATE", &name);
            tracing::info!(device = %dev.display(), "STATE mounted at /system/state");
        }
        Err(e) => tracing::error!(error = %e, "STATE not mounted"),
    }
    // EPHEMERAL too, so that the daemons find /var (etcd's data) from their start.
    let var = Path::new("/var");
    match partition_by_label(sys, "EPHEMERAL") {
        Ok(Some(name)) if mounted_at(&mountinfo(), "/var").is_none() => {
            let dev = Path::new("/dev").join(&name);
            if !holds_xfs(&dev) {
                tracing::warn!(device = %dev.display(), "the EPHEMERAL partition holds no xfs yet: not mounted");
                return;
            }
            let _ = std::fs::create_dir_all(var);
            match mount_xfs(&dev, var, system_mounts()[1].flags) {
                Ok(()) => {
                    devices.claim("EPHEMERAL", &name);
                    for d in ["lib", "log"] {
                        let _ = std::fs::create_dir_all(var.join(d));
                    }
                    tracing::info!(device = %dev.display(), "EPHEMERAL mounted at /var");
                }
                Err(e) => tracing::error!(error = %e, "EPHEMERAL not mounted"),
            }
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "EPHEMERAL not mounted"),
    }
}

/// After EPHEMERAL was mounted over `/var` while the daemons ran (a first boot): the daemons'
/// directories under it are made again on the new filesystem, and every daemon with a landlock
/// rule under it is restarted in place (a rule names the directory it started with, now
/// hidden under the mount).
async fn adopt_var(
    manifest: &machinery::manifest::Manifest,
    supervisor: &crate::supervisor::Supervisor,
) {
    let var = Path::new("/var");
    for d in &manifest.daemons {
        for dir in d.dirs.iter().filter(|dir| dir.path.starts_with(var)) {
            if let Err(e) = crate::make_dir(&dir.path, &dir.mode, d.uid, dir.group.unwrap_or(d.gid))
            {
                tracing::error!(daemon = %d.name, dir = %dir.path.display(), error = %e, "cannot make the directory on EPHEMERAL");
            }
        }
        if d.landlock.paths.iter().any(|p| p.path.starts_with(var)) {
            tracing::info!(daemon = %d.name, "EPHEMERAL took over /var: restarting it there");
            if let Err(e) = supervisor.restart(&d.name).await {
                tracing::error!(daemon = %d.name, error = %e, "cannot restart it: its files under /var stay out of its reach");
            }
        }
    }
}

/// Whether a disk carries a GPT (its signature at LBA 1, 512-byte sectors) whose partitions
/// the kernel does not list yet.
fn gpt_not_listed_yet(sys_class_block: &Path) -> bool {
    use std::io::{Read as _, Seek as _};
    let Ok(entries) = std::fs::read_dir(sys_class_block) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let sys = e.path();
        if !sys.join("device").exists() || name.starts_with("loop") || name.starts_with("ram") {
            return false; // partitions (no `device` link) and virtual disks
        }
        let mut sig = [0u8; 8];
        let gpt = std::fs::File::open(Path::new("/dev").join(&name))
            .and_then(|mut f| {
                f.seek(std::io::SeekFrom::Start(512))?;
                f.read_exact(&mut sig)
            })
            .is_ok()
            && &sig == b"EFI PART";
        let listed = std::fs::read_dir(&sys).is_ok_and(|d| {
            d.flatten()
                .any(|p| p.file_name().to_string_lossy().starts_with(name.as_str()))
        });
        gpt && !listed
    })
}

fn has_disk(sys_class_block: &Path) -> bool {
    std::fs::read_dir(sys_class_block).is_ok_and(|d| {
        d.flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            !n.starts_with("loop") && !n.starts_with("ram") && !n.starts_with("sr")
        })
    })
}

/// Copies every file and directory under `from` into `to` (owners and modes kept, files
/// synced), then syncs `to`.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let meta = e.metadata()?;
        let dest = to.join(e.file_name());
        if meta.is_dir() {
            std::fs::create_dir_all(&dest)?;
            copy_tree(&e.path(), &dest)?;
        } else if meta.is_file() {
            std::fs::copy(e.path(), &dest)?;
            std::fs::File::open(&dest)?.sync_all()?;
        } else {
            continue;
        }
        std::os::unix::fs::chown(&dest, Some(meta.uid()), Some(meta.gid()))?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    }
    std::fs::File::open(to)?.sync_all()
}

/// STATE on its first boot: what stated wrote so far goes onto the new filesystem, which then
/// replaces the directory (a move: stated opens its files by path, and no config write runs
/// meanwhile, the caller holding the config writer's lock).
///
/// # Errors
///
/// What failed, with the staging mount undone.
pub fn adopt_state(
    dev: &Path,
    target: &Path,
    staging: &Path,
    flags: MsFlags,
) -> Result<(), String> {
    stage_state(dev, staging, flags)?;
    finish_state(target, staging)
}

/// The first half of [`adopt_state`]: the new STATE mounted at `staging` (nothing copied yet).
///
/// # Errors
///
/// It cannot be mounted there.
pub fn stage_state(dev: &Path, staging: &Path, flags: MsFlags) -> Result<(), String> {
    std::fs::create_dir_all(staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    mount_xfs(dev, staging, flags)
}

/// The second half of [`adopt_state`]: what `target` holds copied onto the STATE staged at
/// `staging` (unless it holds files already), which is then moved over `target`.
///
/// # Errors
///
/// What failed, with the staging mount undone.
pub fn finish_state(target: &Path, staging: &Path) -> Result<(), String> {
    let done = (|| {
        let meta = std::fs::metadata(target).map_err(|e| format!("{}: {e}", target.display()))?;
        // A STATE that already holds files is one of an earlier boot that was not mounted before
        // stated (found too late): what it holds wins, and what stated wrote since in memory
        // (a configuration fetched again) is left behind, never copied over it.
        let used = std::fs::read_dir(staging)
            .map_err(|e| format!("{}: {e}", staging.display()))?
            .next()
            .is_some();
        if used {
            tracing::warn!(
                "STATE already holds a configuration: it is kept, what this boot wrote before is not"
            );
        } else {
            copy_tree(target, staging).map_err(|e| format!("copying {}: {e}", target.display()))?;
        }
        std::os::unix::fs::chown(staging, Some(meta.uid()), Some(meta.gid()))
            .and_then(|()| {
                std::fs::set_permissions(
                    staging,
                    std::fs::Permissions::from_mode(meta.mode() & 0o7777),
                )
            })
            .map_err(|e| format!("{}: {e}", staging.display()))?;
        mount(
            Some(staging),
            target,
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|e| format!("cannot move STATE onto {}: {e}", target.display()))
    })();
    if done.is_err() {
        let _ = nix::mount::umount(staging);
    }
    done
}

/// `runtime.SystemVolumeMountController` (a VM's init only): see the module's doc.
pub struct SystemVolumeMountController {
    /// The config writer: its lock is held while STATE takes over `/system/state`.
    pub applier: Option<Arc<crate::apply::Applier>>,
    /// The supervisor and the broker's name: stated is restarted once STATE took over its
    /// directory (its landlock rule names the directory it started with, not the new
    /// filesystem's root).
    pub supervisor: Arc<crate::supervisor::Supervisor>,
    /// The broker daemon (`stated`).
    pub broker: String,
    /// The daemons' directories and landlock rules (those under `/var` move to EPHEMERAL).
    pub manifest: Arc<machinery::manifest::Manifest>,
    /// The block devices: a volume's device is protected from its mount on.
    pub devices: Option<Arc<DeviceAccess>>,
    /// Errors already logged, by volume (logged again when they change).
    pub said: std::collections::BTreeMap<String, String>,
}

impl SystemVolumeMountController {
    /// `dev` is mounted for `volume`: it and its disk are no daemon's from now on (blockd
    /// restarted if it could open them, services that reach them stopped).
    async fn protect(&self, volume: &str, dev: &Path) -> Result<(), String> {
        let Some(devices) = &self.devices else {
            return Ok(());
        };
        let name = dev
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        devices
            .protect_mounted(volume, &name, Some(&self.supervisor))
            .await
            .map(drop)
    }

    /// The mount of `dev` was undone: it is protected only if mounted at a volume's place.
    fn unprotect(&self, dev: &Path) {
        if let (Some(devices), Some(name)) = (&self.devices, dev.file_name()) {
            devices.release(&name.to_string_lossy());
        }
    }
}

impl Controller for SystemVolumeMountController {
    fn name(&self) -> &'static str {
        "runtime.SystemVolumeMountController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<VolumeStatusSpec>(
            machinery::resources::block::NAMESPACE,
        )]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<MountStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let sys = Path::new("/sys/class/block");
        let mut out = Vec::new();
        let mut failed = false;
        for m in system_mounts() {
            let mut mounted = mounted_at(&mountinfo(), m.target);
            if mounted.is_none() {
                let status = ctx
                    .get::<VolumeStatusSpec>(machinery::resources::block::NAMESPACE, m.volume)
                    .await?;
                if let Some(st) = status.filter(|s| s.spec.phase == "ready") {
                    let target = Path::new(m.target);
                    // On a first boot nothing loaded xfs yet (EPHEMERAL may be ready before
                    // STATE): mounting would fail with ENODEV.
                    let _ = tokio::task::spawn_blocking(|| load_modules(XFS_MODULES)).await;
                    let result = match checked_device(&st.spec.location, sys) {
                        Err(e) => Err(e),
                        Ok(dev) if m.volume == "STATE" => {
                            let _lock = match &self.applier {
                                Some(a) => Some(a.hold().await),
                                None => None,
                            };
                            let flags = m.flags;
                            let staging = Path::new("/run/init/state-new");
                            let staged = {
                                let dev = dev.clone();
                                tokio::task::spawn_blocking(move || {
                                    stage_state(&dev, staging, flags)
                                })
                                .await
                                .unwrap_or_else(|e| Err(format!("mounting ended: {e}")))
                            };
                            // Protected (blockd restarted) before the configuration is
                            // copied onto it: nothing opened before can read it.
                            let adopted = match staged {
                                Err(e) => Err(e),
                                Ok(()) => match self.protect(m.volume, &dev).await {
                                    Err(e) => {
                                        let _ = nix::mount::umount(staging);
                                        Err(e)
                                    }
                                    Ok(()) => tokio::task::spawn_blocking(move || {
                                        finish_state(Path::new("/system/state"), staging)
                                    })
                                    .await
                                    .unwrap_or_else(|e| Err(format!("mounting ended: {e}"))),
                                },
                            };
                            if adopted.is_err() {
                                self.unprotect(&dev);
                            }
                            if adopted.is_ok() {
                                tracing::info!(daemon = %self.broker, "STATE took over its directory: restarting it there");
                                if let Err(e) = self.supervisor.restart(&self.broker).await {
                                    tracing::error!(daemon = %self.broker, error = %e, "cannot restart it: durable writes fail until it restarts");
                                }
                            }
                            adopted
                        }
                        Ok(dev) => {
                            let _ = std::fs::create_dir_all(target);
                            let mut mounted = mount_xfs(&dev, target, m.flags);
                            if mounted.is_ok() {
                                // Protected before anything is written there.
                                mounted = self.protect(m.volume, &dev).await;
                                if mounted.is_err() {
                                    self.unprotect(&dev);
                                    let _ = nix::mount::umount(target);
                                }
                            }
                            if mounted.is_ok() {
                                for d in ["lib", "log"] {
                                    let _ = std::fs::create_dir_all(target.join(d));
                                }
                            }
                            if mounted.is_ok() && m.target == "/var" {
                                adopt_var(&self.manifest, &self.supervisor).await;
                            }
                            mounted
                        }
                    };
                    match result {
                        Ok(()) => {
                            tracing::info!(volume = m.volume, device = %st.spec.location, target = m.target, "mounted");
                            self.said.remove(m.volume);
                            mounted = mounted_at(&mountinfo(), m.target);
                        }
                        Err(e) => {
                            failed = true;
                            if self.said.get(m.volume) != Some(&e) {
                                tracing::error!(volume = m.volume, error = %e, "not mounted");
                                self.said.insert(m.volume.to_string(), e);
                            }
                        }
                    }
                }
            }
            if let Some((source, filesystem)) = mounted {
                out.push(Resource::new(
                    machinery::resources::runtime::NAMESPACE,
                    m.volume,
                    MountStatusSpec {
                        spec: MountRequestSpec {
                            volume_id: m.volume.into(),
                            requesters: vec!["init".into()],
                        },
                        source,
                        target: m.target.into(),
                        filesystem,
                        read_only: false,
                    },
                ));
            }
        }
        ctx.apply_all(out).await?;
        // A failed mount is tried again (nothing else may change to wake this controller).
        Ok(if failed {
            Action::RequeueAfter(std::time::Duration::from_secs(2))
        } else {
            Action::AwaitChange
        })
    }
}

/// Unmounts the system volumes (EPHEMERAL first) once every daemon has stopped, before a VM's
/// reboot or power-off.
pub fn unmount_all() {
    for m in system_mounts().iter().rev() {
        if mounted_at(&mountinfo(), m.target).is_some() {
            match nix::mount::umount(m.target) {
                Ok(()) => tracing::info!(target = m.target, "unmounted"),
                Err(e) => tracing::warn!(target = m.target, error = %e, "cannot unmount"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_at_a_target_is_read_from_mountinfo() {
        let info = "22 1 0:21 / / rw - rootfs rootfs rw\n\
                    30 22 253:1 / /system/state rw,nosuid - xfs /dev/vda1 rw\n\
                    31 22 253:2 / /var rw - xfs /dev/vda2 rw\n\
                    32 22 0:5 / /var\\040x rw - tmpfs none rw\n";
        assert_eq!(
            mounted_at(info, "/system/state"),
            Some(("/dev/vda1".into(), "xfs".into()))
        );
        assert_eq!(
            mounted_at(info, "/var"),
            Some(("/dev/vda2".into(), "xfs".into()))
        );
        assert_eq!(
            mounted_at(info, "/var x"),
            Some(("none".into(), "tmpfs".into()))
        );
        assert_eq!(mounted_at(info, "/system"), None);
    }

    #[test]
    fn a_location_must_be_a_partition_node_of_dev() {
        let d = tempfile::tempdir().unwrap();
        for bad in [
            "/etc/passwd",
            "/dev/../etc/x",
            "/dev/",
            "vda1",
            "/dev/vda1/x",
        ] {
            assert!(checked_device(bad, d.path()).is_err(), "{bad}");
        }
        // A disk (no `partition` file in sysfs) is refused too.
        std::fs::create_dir_all(d.path().join("vda")).unwrap();
        let e = checked_device("/dev/vda", d.path()).unwrap_err();
        assert!(e.contains("not a partition"), "{e}");
    }

    #[test]
    fn partitions_are_found_by_their_gpt_name_and_never_guessed() {
        let d = tempfile::tempdir().unwrap();
        let dev = |name: &str, uevent: &str| {
            std::fs::create_dir_all(d.path().join(name)).unwrap();
            std::fs::write(d.path().join(name).join("uevent"), uevent).unwrap();
        };
        dev("vda", "MAJOR=253\nDEVNAME=vda\nDEVTYPE=disk\n");
        dev(
            "vda1",
            "DEVNAME=vda1\nDEVTYPE=partition\nPARTN=1\nPARTNAME=STATE\n",
        );
        dev(
            "vda2",
            "DEVNAME=vda2\nDEVTYPE=partition\nPARTN=2\nPARTNAME=EPHEMERAL\n",
        );
        assert_eq!(
            partition_by_label(d.path(), "STATE"),
            Ok(Some("vda1".into()))
        );
        assert_eq!(partition_by_label(d.path(), "META"), Ok(None));
        dev("vdb1", "DEVNAME=vdb1\nDEVTYPE=partition\nPARTNAME=STATE\n");
        let e = partition_by_label(d.path(), "STATE").unwrap_err();
        assert!(e.contains("2 partitions"), "{e}");
    }
}
