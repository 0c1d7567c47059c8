//! The duties of PID 1: the early filesystems, and what ends the machine (reboot(2) or power
//! off). In container mode (PID 1 of a namespace set) the hardware steps are skipped; in
//! development mode (not PID 1) none of this runs.

use std::path::Path;

use nix::mount::{mount, MsFlags};

/// How init runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// PID 1 of a machine (a VM): mounts, reboot(2).
    Vm,
    /// PID 1 of a set of namespaces: no hardware steps; shutdown ends init.
    Container,
    /// Not PID 1 (tests, development): only the node tree under --root.
    Dev,
}

impl Mode {
    /// The mode when none is given: development unless PID 1; as PID 1, container when the
    /// `container` environment variable is set (as systemd-nspawn, podman and our own
    /// `talosctl cluster create` set it), else VM.
    pub fn detect() -> Mode {
        if std::process::id() != 1 {
            Mode::Dev
        } else if std::env::var_os("container").is_some() {
            Mode::Container
        } else {
            Mode::Vm
        }
    }

    /// `vm`, `container` or `dev`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Vm => "vm",
            Mode::Container => "container",
            Mode::Dev => "dev",
        }
    }
}

/// One early mount: (source, target, fstype, flags, data).
type Early = (
    &'static str,
    &'static str,
    &'static str,
    MsFlags,
    &'static str,
);

fn early_mounts(mode: Mode) -> Vec<Early> {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mut m: Vec<Early> = vec![("proc", "/proc", "proc", nosuid, "")];
    if mode == Mode::Vm {
        m.push(("sysfs", "/sys", "sysfs", nosuid, ""));
        m.push((
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MsFlags::MS_NOSUID,
            "mode=0755",
        ));
    }
    m.push((
        "tmpfs",
        "/run",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        "mode=0755",
    ));
    m.push((
        "tmpfs",
        "/tmp",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        "mode=1777",
    ));
    if mode == Mode::Vm {
        m.push(("cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid, ""));
    }
    m
}

/// Mounts the early filesystems for `mode` (nothing in development mode). A filesystem that is
/// already mounted (EBUSY) is fine; any other failure is reported and the boot goes on.
pub fn mount_early(mode: Mode) {
    if mode == Mode::Dev {
        return;
    }
    for (source, target, fstype, flags, data) in early_mounts(mode) {
        if let Err(e) = std::fs::create_dir_all(target) {
            tracing::warn!(target, error = %e, "cannot create mount point");
        }
        let data = (!data.is_empty()).then_some(data);
        match mount(Some(source), Path::new(target), Some(fstype), flags, data) {
            Ok(()) => tracing::info!(target, fstype, "mounted"),
            Err(nix::errno::Errno::EBUSY) => {}
            Err(e) => tracing::warn!(target, fstype, error = %e, "cannot mount"),
        }
    }
}

/// As a VM's PID 1: ctrl-alt-del sends init SIGINT (an orderly reboot) instead of resetting
/// the machine at once.
pub fn disable_ctrl_alt_del(mode: Mode) {
    if mode == Mode::Vm {
        if let Err(e) = nix::sys::reboot::set_cad_enabled(false) {
            tracing::warn!(error = %e, "cannot route ctrl-alt-del to init");
        }
    }
}

/// What ends the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerAction {
    /// Power off (or, not as a VM's PID 1, exit).
    PowerOff,
    /// Reboot (or, not as a VM's PID 1, exit with [`REBOOT_EXIT`] so a container runner can
    /// start the node again).
    Reboot,
}

/// init's exit code for a reboot request outside a VM.
pub const REBOOT_EXIT: u8 = 10;

/// Ends the machine after every daemon stopped: syncs, then reboot(2) as a VM's PID 1. Returns
/// the exit code to use in the other modes.
pub fn finish(mode: Mode, action: PowerAction) -> u8 {
    if mode != Mode::Vm {
        return match action {
            PowerAction::PowerOff => 0,
            PowerAction::Reboot => REBOOT_EXIT,
        };
    }
    crate::volumes::unmount_all();
    nix::unistd::sync();
    let how = match action {
        PowerAction::PowerOff => nix::sys::reboot::RebootMode::RB_POWER_OFF,
        PowerAction::Reboot => nix::sys::reboot::RebootMode::RB_AUTOBOOT,
    };
    let e = nix::sys::reboot::reboot(how);
    // PID 1 must not exit: the kernel would panic. Nothing is left to do but wait.
    eprintln!("init: reboot(2) failed: {e:?}");
    loop {
        std::thread::park();
    }
}
