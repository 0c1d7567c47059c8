//! Who may open the node's block devices (a VM's init only).
//!
//! blockd lays out the disks: init gives it the block device nodes through its group
//! (`root:<blockd's gid>`, mode 0660, as udev gives them to its `disk` group), so that it needs
//! no capability to read and partition them. But STATE holds the whole machine configuration,
//! every CA key with it, and EPHEMERAL what the daemons keep: once init mounted a system volume,
//! its partition **and the whole disk that holds it** (and, for a mapped device, what it maps)
//! are *protected*: `root:root` 0600, no daemon's group, and no requested service may have a
//! landlock rule that reaches one (a service may hold CAP_DAC_OVERRIDE).
//!
//! - The protected devices are those mounted at a system volume's place (`/proc/self/mountinfo`:
//!   the mount's device numbers, then `/sys/dev/block/MAJ:MIN` for its name and its parent)
//!   and those init claimed while it mounts one ([`DeviceAccess::claim`]: between the mount
//!   and the move of STATE onto its place, the device is mounted elsewhere).
//! - [`DeviceAccess::apply`] sets every node of `/sys/class/block`'s names: protected ones
//!   `root:root` 0600, the others `root:<blockd>` 0660. It never follows a symlink (every node
//!   is opened `O_PATH | O_NOFOLLOW`, checked to be a block device and changed through that
//!   very fd), and skips names that are not plain device names.
//! - [`DeviceAccess::enforce`] applies, then stops (and refuses from then on) every requested
//!   service whose rules reach a protected device, and restarts blockd when a node it could
//!   open was taken from it while it ran: no fd it opened before survives (a mode change does
//!   not close an open file).
//!
//! `runtime.BlockDeviceAccessController` (crate::controllers) enforces at every resync; the
//! mount code (crate::volumes) enforces right when it mounts.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use machinery::resources::runtime::{ServiceState, ServiceStatusSpec, UnitKind};

use crate::supervisor::Supervisor;

/// How deep mapped devices (`slaves/`) are followed.
const MAX_DEPTH: u8 = 4;

/// The node's block device nodes and who may open them.
#[derive(Debug)]
pub struct DeviceAccess {
    /// blockd's name and gid: the nodes that are not protected are its group's, and it is
    /// restarted when one it could open becomes protected. `None`: no blockd; nodes that are
    /// not protected are left as they are.
    pub blockd: Option<(String, u32)>,
    /// `/sys/class/block`: the names of the block devices.
    pub sys_class_block: PathBuf,
    /// `/sys/dev/block`: the block devices by their numbers.
    pub sys_dev_block: PathBuf,
    /// `/dev`.
    pub dev: PathBuf,
    /// `/proc/self/mountinfo`.
    pub mountinfo: PathBuf,
    /// The system volumes' places, with the volume: STATE at `/system/state`, EPHEMERAL at
    /// `/var`.
    pub targets: Vec<(String, PathBuf)>,
    /// Devices init mounts or mounted for a volume, by name: the volume.
    claimed: Mutex<BTreeMap<String, String>>,
    /// Held while nodes change, so that a node taken from blockd is seen taken once.
    applying: Mutex<()>,
}

/// The protected devices at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Protected {
    /// Where their nodes are (`/dev`).
    pub dev: PathBuf,
    /// Their names, each with what it is (`holds STATE`, `is the disk that holds STATE`).
    pub devices: BTreeMap<String, String>,
    /// Their device numbers, to recognise another path to one of them.
    pub numbers: BTreeSet<u64>,
}

impl Protected {
    /// Whether `name` (a node of `/dev`) is protected.
    pub fn contains(&self, name: &str) -> bool {
        self.devices.contains_key(name)
    }

    /// Why a landlock rule on `path` reaches a protected device (`None`: it does not): the path
    /// is its node or a directory above it, as written or once resolved (a rule holds what its
    /// path resolves to), or it resolves to another node of the same device.
    pub fn reached_by(&self, path: &Path) -> Option<String> {
        if self.devices.is_empty() {
            return None;
        }
        let resolved = std::fs::canonicalize(path).ok();
        for (name, what) in &self.devices {
            let node = self.dev.join(name);
            let covers = |p: &Path| node.starts_with(p);
            if covers(path) || resolved.as_deref().is_some_and(covers) {
                return Some(format!(
                    "path {:?} reaches {}, which {what}: no service may have it",
                    path.to_string_lossy(),
                    node.display()
                ));
            }
        }
        let same_device = std::fs::metadata(path)
            .ok()
            .filter(|m| m.file_type().is_block_device())
            .filter(|m| self.numbers.contains(&m.rdev()));
        same_device.map(|_| {
            format!(
                "path {:?} is a protected device (it holds or contains a system volume): no service may have it",
                path.to_string_lossy()
            )
        })
    }

    /// Every reason a rule of `paths` reaches a protected device.
    pub fn reasons<'a>(&self, paths: impl IntoIterator<Item = &'a Path>) -> Vec<String> {
        paths
            .into_iter()
            .filter_map(|p| self.reached_by(p))
            .collect()
    }
}

/// What [`DeviceAccess::apply`] did.
#[derive(Debug, Default)]
pub struct Applied {
    /// The protected devices it applied.
    pub protected: Protected,
    /// Protected nodes that were blockd's group's until now.
    pub taken_from_blockd: Vec<String>,
    /// Nodes that could not be set, with why.
    pub failed: Vec<String>,
    /// Of those, the protected ones: they may still be open to blockd's group.
    pub unprotected: Vec<String>,
}

/// Whether a name from sysfs is a plain device name (`vda`, `nvme0n1p1`, `dm-0`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-')
}

/// The device numbers (`major:minor`) of every mount at `target` in `mountinfo`
/// (`/proc/self/mountinfo` text), stacked ones included; none for a filesystem without a
/// device (major 0: tmpfs, overlay).
pub fn devices_mounted_at(mountinfo: &str, target: &str) -> Vec<(u32, u32)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let numbers = f.nth(2)?;
            let point = f.nth(1)?;
            let (major, minor) = numbers.split_once(':')?;
            let (major, minor) = (major.parse().ok()?, minor.parse().ok()?);
            let at = crate::mounts::parse(&format!("x {point}"))
                .first()
                .is_some_and(|(_, p)| p == target);
            (at && major != 0).then_some((major, minor))
        })
        .collect()
}

fn device_number(sys_dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(sys_dir.join("dev")).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some(nix::sys::stat::makedev(
        major.parse().ok()?,
        minor.parse().ok()?,
    ))
}

/// Adds the device whose sysfs directory is `dir` (resolved), the disk that holds it when it is
/// a partition, and what it maps (`slaves/`, with their disks), to `out`.
fn add_device(dir: &Path, volume: &str, out: &mut Protected, depth: u8) {
    let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    if !valid_name(&name) {
        tracing::warn!(device = %name, "a mounted system volume's device has an unexpected name: its node is not found");
        return;
    }
    out.devices
        .entry(name)
        .or_insert_with(|| format!("holds {volume}"));
    out.numbers.extend(device_number(dir));
    if dir.join("partition").exists() {
        if let Some(disk) = dir.parent() {
            let name = disk
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if valid_name(&name) {
                out.devices
                    .entry(name)
                    .or_insert_with(|| format!("is the disk that holds {volume}"));
                out.numbers.extend(device_number(disk));
            }
        }
    }
    if depth < MAX_DEPTH {
        if let Ok(slaves) = std::fs::read_dir(dir.join("slaves")) {
            for s in slaves.flatten() {
                if let Ok(d) = std::fs::canonicalize(s.path()) {
                    add_device(&d, volume, out, depth + 1);
                }
            }
        }
    }
}

/// A block device node as it is.
struct Node {
    file: std::fs::File,
    meta: std::fs::Metadata,
}

/// Opens `path` without following a symlink and without opening the device (`O_PATH`):
/// `None` when it is missing or not a block device.
fn open_node(path: &Path) -> std::io::Result<Option<Node>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH | nix::libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    Ok(meta
        .file_type()
        .is_block_device()
        .then_some(Node { file, meta }))
}

/// Sets the node to `root:<gid>` and `mode`, through its fd (the node checked is the node
/// changed). The order never opens it wider than either state: a protected node loses its
/// group's rights before its group, a given one gets its group before the rights.
fn set_node(node: &Node, gid: u32, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", node.file.as_raw_fd()));
    let chmod = || std::fs::set_permissions(&by_fd, std::fs::Permissions::from_mode(mode));
    let chown = || std::os::unix::fs::chown(&by_fd, Some(0), Some(gid));
    if mode & 0o070 == 0 {
        chmod()?;
        chown()
    } else {
        chown()?;
        chmod()
    }
}

impl DeviceAccess {
    /// The node's: `/sys/class/block`, `/sys/dev/block`, `/dev`, `/proc/self/mountinfo`, and the
    /// system volumes' places.
    pub fn node(blockd: Option<(String, u32)>) -> DeviceAccess {
        DeviceAccess::new(
            blockd,
            PathBuf::from("/sys/class/block"),
            PathBuf::from("/sys/dev/block"),
            PathBuf::from("/dev"),
            PathBuf::from("/proc/self/mountinfo"),
            crate::volumes::system_mounts()
                .iter()
                .map(|m| (m.volume.to_string(), PathBuf::from(m.target)))
                .collect(),
        )
    }

    /// One over other places (tests).
    pub fn new(
        blockd: Option<(String, u32)>,
        sys_class_block: PathBuf,
        sys_dev_block: PathBuf,
        dev: PathBuf,
        mountinfo: PathBuf,
        targets: Vec<(String, PathBuf)>,
    ) -> DeviceAccess {
        DeviceAccess {
            blockd,
            sys_class_block,
            sys_dev_block,
            dev,
            mountinfo,
            targets,
            claimed: Mutex::new(BTreeMap::new()),
            applying: Mutex::new(()),
        }
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.claimed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// init mounts `volume` from `/dev/<name>`: the device (and its disk) is protected from now
    /// on, wherever it is mounted meanwhile. Nodes change at the next apply.
    pub fn claim(&self, volume: &str, name: &str) {
        if valid_name(name) {
            self.claims().insert(name.to_string(), volume.to_string());
        } else {
            tracing::warn!(device = %name, "not a device name: not claimed");
        }
    }

    /// The mount of `/dev/<name>` failed: it is protected again only if it is mounted at a
    /// system volume's place.
    pub fn release(&self, name: &str) {
        self.claims().remove(name);
    }

    /// The devices protected now: those mounted at a system volume's place, and those claimed.
    pub fn protected(&self) -> Protected {
        let mut out = Protected {
            dev: self.dev.clone(),
            ..Default::default()
        };
        let mountinfo = std::fs::read_to_string(&self.mountinfo).unwrap_or_else(|e| {
            tracing::warn!(path = %self.mountinfo.display(), error = %e, "cannot read the mounts");
            String::new()
        });
        for (volume, target) in &self.targets {
            for (major, minor) in devices_mounted_at(&mountinfo, &target.to_string_lossy()) {
                match std::fs::canonicalize(self.sys_dev_block.join(format!("{major}:{minor}"))) {
                    Ok(dir) => add_device(&dir, volume, &mut out, 0),
                    Err(e) => tracing::warn!(
                        device = %format_args!("{major}:{minor}"),
                        error = %e,
                        "a mounted system volume's device is not in sysfs"
                    ),
                }
            }
        }
        let claims = self.claims().clone();
        for (name, volume) in claims {
            match std::fs::canonicalize(self.sys_class_block.join(&name)) {
                Ok(dir) => add_device(&dir, &volume, &mut out, 0),
                // Not in sysfs (gone): its node, if any, still is no one's.
                Err(_) => {
                    out.devices.insert(name, format!("holds {volume}"));
                }
            }
        }
        out
    }

    /// Sets every block device node: protected ones `root:root` 0600, the others blockd's
    /// group's (`root:<gid>` 0660; left as they are without a blockd). Only block devices of
    /// names in `/sys/class/block` (and protected ones), never through a symlink.
    pub fn apply(&self) -> Applied {
        let _one = self.applying.lock().unwrap_or_else(|e| e.into_inner());
        let protected = self.protected();
        let mut names: BTreeSet<String> = std::fs::read_dir(&self.sys_class_block)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.extend(protected.devices.keys().cloned());
        let blockd_gid = self.blockd.as_ref().map(|(_, gid)| *gid);
        let mut applied = Applied::default();
        for name in names.into_iter().filter(|n| valid_name(n)) {
            let protect = protected.contains(&name);
            let (gid, mode) = match (protect, blockd_gid) {
                (true, _) => (0, 0o600),
                (false, Some(gid)) => (gid, 0o660),
                (false, None) => continue,
            };
            let path = self.dev.join(&name);
            let mut failed = |e: std::io::Error| {
                let e = format!("{}: {e}", path.display());
                if protect {
                    applied.unprotected.push(e.clone());
                }
                applied.failed.push(e);
            };
            let node = match open_node(&path) {
                Ok(Some(node)) => node,
                Ok(None) => continue,
                Err(e) => {
                    failed(e);
                    continue;
                }
            };
            let m = &node.meta;
            if m.uid() == 0 && m.gid() == gid && m.mode() & 0o7777 == mode {
                continue;
            }
            let was_blockds = blockd_gid.is_some_and(|g| m.gid() == g && m.mode() & 0o060 != 0);
            match set_node(&node, gid, mode) {
                Ok(()) if protect => {
                    let what = protected.devices.get(&name).map_or("", String::as_str);
                    tracing::info!(device = %path.display(), what, "protected: no daemon's group");
                    if was_blockds {
                        applied.taken_from_blockd.push(name);
                    }
                }
                Ok(()) => tracing::debug!(device = %path.display(), "given to blockd"),
                Err(e) => failed(e),
            }
        }
        applied.protected = protected;
        applied
    }

    /// init mounted `volume` from `/dev/<name>` (the mount code, right after the mount and
    /// before anything is written on it): claims it and enforces at once, without waiting for
    /// the next resync.
    ///
    /// # Errors
    ///
    /// A protected node could not be set (it may still be open to blockd's group).
    pub async fn protect_mounted(
        &self,
        volume: &str,
        name: &str,
        supervisor: Option<&Arc<Supervisor>>,
    ) -> Result<Protected, String> {
        self.claim(volume, name);
        let applied = self.enforce(supervisor).await;
        if applied.unprotected.is_empty() {
            Ok(applied.protected)
        } else {
            Err(format!(
                "cannot protect {volume}'s devices: {}",
                applied.unprotected.join("; ")
            ))
        }
    }

    /// Applies ([`DeviceAccess::apply`]), then, with the supervisor: stops and refuses every
    /// requested service whose rules reach a protected device, and restarts blockd if a node
    /// it could open was taken from it while it runs. Returns what was applied (nodes that
    /// could not be set among it).
    pub async fn enforce(&self, supervisor: Option<&Arc<Supervisor>>) -> Applied {
        let applied = self.apply();
        if let Some(sup) = supervisor {
            revoke_services(sup, &applied.protected).await;
            if let Some((blockd, _)) = &self.blockd {
                restart_blockd(sup, blockd, &applied.taken_from_blockd).await;
            }
        }
        applied
    }
}

/// Whether blockd must be restarted once `taken` (nodes it could open) became protected: a
/// process of it may hold one open (it runs, or is being started). A blockd that is not running
/// has no fd, and the next one cannot open them.
pub fn must_restart(taken: &[String], blockd: &ServiceStatusSpec) -> bool {
    !taken.is_empty() && matches!(blockd.state, ServiceState::Starting | ServiceState::Running)
}

/// Restarts blockd when [`must_restart`] says so (as daemons are restarted when EPHEMERAL
/// takes over `/var`): no fd it opened before the nodes were protected survives.
pub async fn restart_blockd(sup: &Supervisor, blockd: &str, taken: &[String]) {
    let Some(unit) = sup.get(blockd) else { return };
    if !must_restart(taken, &unit.snapshot()) {
        return;
    }
    tracing::info!(daemon = %blockd, devices = ?taken, "block devices it could open are protected now: restarting it so that none stays open");
    if let Err(e) = sup.restart(blockd).await {
        tracing::error!(daemon = %blockd, error = %e, "cannot restart it: it may still hold a protected device open");
    }
}

/// Stops every requested service whose landlock rules reach a protected device, and keeps it
/// refused (its status says why).
pub async fn revoke_services(sup: &Arc<Supervisor>, protected: &Protected) {
    if protected.devices.is_empty() {
        return;
    }
    for unit in sup.units() {
        let Some(launch) = &unit.launch else { continue };
        if unit.snapshot().kind != UnitKind::Service {
            continue;
        }
        let why = protected.reasons(
            launch
                .policy
                .landlock
                .paths
                .iter()
                .map(|r| r.path.as_path()),
        );
        if why.is_empty() {
            continue;
        }
        let reason = format!("stopped and refused: {}", why.join("; "));
        tracing::warn!(service = %unit.id, %reason, "a requested service reaches a protected device");
        sup.revoke(&unit.id, reason).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_devices_mounted_at_a_place_are_read_from_mountinfo() {
        let info = "22 1 0:21 / / rw - rootfs rootfs rw\n\
                    30 22 253:3 / /system/state rw,nosuid - xfs /dev/vda3 rw\n\
                    31 22 253:4 / /var rw - xfs /dev/vda4 rw\n\
                    32 31 0:5 / /var rw - tmpfs none rw\n\
                    33 22 7:0 / /var\\040x rw - ext4 /dev/loop0 rw\n";
        assert_eq!(devices_mounted_at(info, "/system/state"), [(253, 3)]);
        // A tmpfs stacked over EPHEMERAL hides it, but it is still mounted.
        assert_eq!(devices_mounted_at(info, "/var"), [(253, 4)]);
        assert_eq!(devices_mounted_at(info, "/var x"), [(7, 0)]);
        assert!(devices_mounted_at(info, "/system").is_empty());
    }

    #[test]
    fn device_names_are_plain() {
        for ok in ["vda", "vda3", "nvme0n1p1", "dm-0", "loop0p2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "-x", "vda 1", "vda\n"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_rule_reaches_a_protected_node_above_at_or_through_it() {
        let p = Protected {
            dev: "/dev".into(),
            devices: [
                (
                    "vda".to_string(),
                    "is the disk that holds STATE".to_string(),
                ),
                ("vda3".to_string(), "holds STATE".to_string()),
            ]
            .into(),
            numbers: BTreeSet::new(),
        };
        for reached in ["/", "/dev", "/dev/vda", "/dev/vda3"] {
            let why = p.reached_by(Path::new(reached));
            assert!(why.is_some(), "{reached}");
        }
        let why = p.reached_by(Path::new("/dev")).unwrap();
        assert!(
            why.contains("/dev/vda, which is the disk that holds STATE"),
            "{why}"
        );
        for free in ["/dev/vda4", "/dev/vdb", "/dev/vda33", "/sys", "/usr/lib"] {
            assert_eq!(p.reached_by(Path::new(free)), None, "{free}");
        }
        // Nothing protected: nothing reached.
        assert_eq!(Protected::default().reached_by(Path::new("/")), None);
    }

    #[test]
    fn blockd_is_restarted_only_when_a_running_blockd_lost_a_node() {
        let taken = vec!["vda3".to_string()];
        let status = |state| ServiceStatusSpec {
            state,
            ..Default::default()
        };
        assert!(must_restart(&taken, &status(ServiceState::Running)));
        assert!(must_restart(&taken, &status(ServiceState::Starting)));
        // Nothing of blockd's taken, or no process of it: nothing to restart (a stopped blockd
        // is not started by it).
        assert!(!must_restart(&[], &status(ServiceState::Running)));
        for state in [
            ServiceState::Waiting,
            ServiceState::Stopped,
            ServiceState::Stopping,
            ServiceState::Failed,
        ] {
            assert!(!must_restart(&taken, &status(state)), "{state:?}");
        }
    }
}
