//! blkid, asked of before a disk is written: it detects what blockd's own probe does not know (an
//! MBR, LVM, LUKS, btrfs, ZFS, md RAID, iso9660, squashfs… everything libblkid knows), so no
//! disk that holds something is taken for blank by a list of names written here.
//!
//! It runs as a one-shot service init starts for blockd (`blkid -p -o export DEVICE`): the C
//! library that parses what a disk holds never runs inside blockd (which holds CAP_SYS_ADMIN
//! and writes disks), but in a process of its own with no capability but reading past file
//! modes (CAP_DAC_READ_SEARCH: the device nodes are blockd's group's), landlocked to the one
//! device, read-only, with its own seccomp profile. Its verdict is in its `ServiceStatus`:
//! the exit status (0: something found, 2: nothing) and what it printed (`output`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use machinery::resources::runtime::{
    ServicePath, ServiceSpecSpec, ServiceState, ServiceStatusSpec,
};

/// Where blkid is and whom it runs as.
#[derive(Clone, Debug)]
pub struct BlkidOptions {
    /// blkid on the node (the image's, util-linux's).
    pub binary: PathBuf,
    /// The uid (and gid) it runs as: a service never runs as a daemon's.
    pub uid: u32,
}

impl Default for BlkidOptions {
    fn default() -> Self {
        BlkidOptions {
            binary: PathBuf::from("/usr/bin/blkid"),
            uid: 1_990_001_501,
        }
    }
}

/// The ID of the service probing disk `name` (`blkid-vdb`).
pub fn service_id(name: &str) -> String {
    format!("blkid-{name}")
}

/// The service that probes `device`.
pub fn spec(options: &BlkidOptions, device: &str) -> ServiceSpecSpec {
    let path = |p: &str, access: &str| ServicePath {
        path: p.into(),
        access: access.into(),
    };
    let binary = options.binary.to_string_lossy().into_owned();
    ServiceSpecSpec {
        binary: binary.clone(),
        // Low-level probing of the device itself (no cache, no udev database), every usage.
        args: vec!["-p".into(), "-o".into(), "export".into(), device.into()],
        env: BTreeMap::new(),
        uid: options.uid,
        gid: options.uid,
        capabilities: vec!["CAP_DAC_READ_SEARCH".into()],
        paths: vec![
            path(device, "read-only"),
            path("/sys", "read-only"),
            path(&binary, "exec"),
            path("/usr/lib", "exec"),
            path("/lib64", "exec"),
        ],
        bind_tcp: vec![],
        connect_tcp: vec![],
        seccomp_profile: "blkid".into(),
        restart: false,
    }
}

/// What blkid said of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing it knows (exit 2).
    Nothing,
    /// Something, as blkid names it (`dos`, `LVM2_member`, `crypto_LUKS`…).
    Found(String),
    /// It could not tell (another exit status, a signal, a refused service): the device is
    /// not taken for blank.
    Failed(String),
}

impl Verdict {
    /// What the device holds, said to people; `None` for nothing.
    pub fn holds(&self) -> Option<String> {
        match self {
            Verdict::Nothing => None,
            Verdict::Found(what) => Some(what.clone()),
            Verdict::Failed(why) => Some(format!("what blkid could not tell ({why})")),
        }
    }
}

/// What `blkid -p -o export` printed, said to people: its `PTTYPE` (a partition table) or
/// `TYPE` (a filesystem, a RAID or LVM member, an encrypted volume), with its `USAGE`.
pub fn describe(output: &str) -> String {
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    for line in output.lines() {
        if let Some((k, v)) = line.split_once('=') {
            fields.entry(k.trim()).or_insert(v.trim());
        }
    }
    match (
        fields.get("PTTYPE"),
        fields.get("TYPE"),
        fields.get("USAGE"),
    ) {
        (Some(pt), _, _) => format!("a partition table ({pt})"),
        (None, Some(t), Some(u)) => format!("{t} ({u})"),
        (None, Some(t), None) => (*t).to_string(),
        (None, None, _) if output.contains("ambivalent") => "several signatures".into(),
        _ => "something blkid knows".into(),
    }
}

/// blkid's verdict from its service's status, once its run ended (`None` before).
pub fn verdict(status: &ServiceStatusSpec) -> Option<Verdict> {
    match status.state {
        ServiceState::Finished => Some(Verdict::Found(describe(&status.output))),
        ServiceState::Failed => Some(match status.last_exit.as_str() {
            "exit 2" => Verdict::Nothing,
            // Ambivalent probing result: several signatures on the device.
            "exit 8" => Verdict::Found("several signatures".into()),
            "" => Verdict::Failed(if status.message.is_empty() {
                "the service was not run".into()
            } else {
                status.message.clone()
            }),
            other => Verdict::Failed(other.to_string()),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(state: ServiceState, exit: &str, output: &str) -> ServiceStatusSpec {
        ServiceStatusSpec {
            state,
            last_exit: exit.into(),
            output: output.into(),
            ..ServiceStatusSpec::default()
        }
    }

    #[test]
    fn blkid_s_exit_and_output_make_its_verdict() {
        let mbr = "DEVNAME=/dev/vdb\nPTUUID=5a3e1b2c\nPTTYPE=dos\n";
        assert_eq!(
            verdict(&ended(ServiceState::Finished, "exit 0", mbr)),
            Some(Verdict::Found("a partition table (dos)".into()))
        );
        let lvm = "DEVNAME=/dev/vdb\nUUID=x\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n";
        assert_eq!(
            verdict(&ended(ServiceState::Finished, "exit 0", lvm)),
            Some(Verdict::Found("LVM2_member (raid)".into()))
        );
        assert_eq!(
            verdict(&ended(ServiceState::Failed, "exit 2", "")),
            Some(Verdict::Nothing)
        );
        assert_eq!(
            verdict(&ended(ServiceState::Failed, "exit 8", "")),
            Some(Verdict::Found("several signatures".into()))
        );
        assert!(matches!(
            verdict(&ended(ServiceState::Failed, "signal 9", "")),
            Some(Verdict::Failed(_))
        ));
        assert_eq!(verdict(&ended(ServiceState::Running, "", "")), None);
        let refused = ServiceStatusSpec {
            state: ServiceState::Failed,
            message: "path /dev reaches a protected device".into(),
            ..ServiceStatusSpec::default()
        };
        assert!(verdict(&refused)
            .and_then(|v| v.holds())
            .is_some_and(|h| h.contains("protected")));
    }

    #[test]
    fn the_service_reads_one_device_and_nothing_else() {
        let s = spec(&BlkidOptions::default(), "/dev/vdb");
        assert_eq!(s.args, ["-p", "-o", "export", "/dev/vdb"]);
        assert_eq!(s.capabilities, ["CAP_DAC_READ_SEARCH"]);
        assert!(!s.restart);
        assert!(s
            .paths
            .iter()
            .all(|p| p.access != "read-write" && p.path != "/dev"));
        assert_eq!(service_id("vdb"), "blkid-vdb");
    }
}
