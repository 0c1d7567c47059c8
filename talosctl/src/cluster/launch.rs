//! How a node starts: two hidden `talosctl cluster` subcommands that `cluster create` runs,
//! detached, for each node.
//!
//! - `node-supervise` (on the host): leaves talosctl's session and boots the node with
//!   `node-boot`, again each time init ends with the reboot code (`talosctl reboot`); otherwise
//!   it exits with init's status.
//! - `node-boot`: unshares a new PID namespace and starts `node-init` in it — its PID 1 —
//!   writes init's host PID to `<node>/init.pid` and waits for it.
//! - `node-init` (PID 1 of the new PID namespace): enters the node's named network namespace,
//!   unshares mount, UTS and IPC namespaces, mounts the node's overlay (the image read-only
//!   below, the node's own `upper/` above), a small `/dev` and a read-only `/sys`, copies the
//!   machine config in, sets the hostname, pivots into the overlay, asks for SIGKILL when the
//!   supervisor dies, and executes `/usr/bin/init --mode container` — init is PID 1.
//!
//! The overlay exists only in the node's mount namespace: the host's mount table never holds
//! it, and it goes away with the node's last process. `/proc`, `/run` and `/tmp` are mounted by
//! init itself (container mode).

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;

use super::net::NETNS_DIR;

/// init's exit code when it was asked to reboot outside a VM (`init::pid1::REBOOT_EXIT`): the
/// supervisor boots the node again.
pub const REBOOT_EXIT: i32 = 10;
/// Where the node's machine config is copied to, inside the node.
pub const NODE_CONFIG: &str = "/etc/talos/config.yaml";
/// The daemon manifest of the image.
pub const NODE_MANIFEST: &str = "/etc/talos/daemons.yaml";
/// init in the image.
pub const NODE_INIT: &str = "/usr/bin/init";
/// The file, in the node's directory, where the supervisor writes init's host PID.
pub const INIT_PID_FILE: &str = "init.pid";

/// Arguments of the hidden launch subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchArgs {
    /// The node's name, also its hostname.
    #[arg(long)]
    pub hostname: String,
    /// Its named network namespace.
    #[arg(long)]
    pub netns: String,
    /// The image tree (the overlay's lower layer).
    #[arg(long)]
    pub image: PathBuf,
    /// The node's directory: config.yaml, upper/, work/, root/.
    #[arg(long)]
    pub node_dir: PathBuf,
    /// Publish the node's apid on this port of the host's 127.0.0.1 (the supervisor relays it).
    #[arg(long)]
    pub api_port: Option<u16>,
}

impl LaunchArgs {
    fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--hostname".into(),
            self.hostname.clone().into(),
            "--netns".into(),
            self.netns.clone().into(),
            "--image".into(),
            self.image.clone().into(),
            "--node-dir".into(),
            self.node_dir.clone().into(),
        ];
        if let Some(port) = self.api_port {
            args.extend(["--api-port".into(), port.to_string().into()]);
        }
        args
    }

    /// The command that starts the node's supervisor (this same talosctl binary).
    pub fn supervise_command(&self) -> anyhow::Result<Command> {
        let exe = std::env::current_exe().context("cannot find the talosctl binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["cluster", "node-supervise"]).args(self.to_args());
        Ok(cmd)
    }
}

/// `node-supervise`: returns the exit code of the node's init.
pub fn supervise(args: &LaunchArgs) -> anyhow::Result<i32> {
    // Out of talosctl's session and process group: a ^C of `cluster create` or the end of
    // the terminal does not reach the node.
    let _ = nix::unistd::setsid();
    // Bound before the node starts: a busy port fails the node's start, loudly.
    if let Some(port) = args.api_port {
        let listener = super::publish::bind(port)?;
        let netns = Path::new(NETNS_DIR).join(&args.netns);
        std::thread::Builder::new()
            .name("api-publish".into())
            .spawn(move || {
                let apid = std::net::SocketAddr::from(([127, 0, 0, 1], super::publish::API_PORT));
                super::publish::relay(listener, netns, apid)
            })
            .context("cannot start the API relay")?;
    }
    let exe = std::env::current_exe().context("cannot find the talosctl binary")?;
    loop {
        let status = Command::new(&exe)
            .args(["cluster", "node-boot"])
            .args(args.to_args())
            .status()
            .context("cannot boot the node")?;
        let code = status.code().unwrap_or(128);
        if code != REBOOT_EXIT {
            eprintln!(
                "talosctl node-supervise: init of {} ended: {status}",
                args.hostname
            );
            return Ok(code);
        }
        eprintln!(
            "talosctl node-supervise: {} reboots (same directory, same overlay)",
            args.hostname
        );
        // A node that reboots at once, again and again, does not spin.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `node-boot`: one boot of the node: a new PID namespace with `node-init` as its PID 1;
/// returns init's exit code.
pub fn boot(args: &LaunchArgs) -> anyhow::Result<i32> {
    // Dies with the supervisor (and so, through node-init's own parent-death signal, the node).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(sys("cannot set the parent-death signal"))?;
    nix::sched::unshare(CloneFlags::CLONE_NEWPID)
        .context("cannot create the node's PID namespace")?;
    let exe = std::env::current_exe().context("cannot find the talosctl binary")?;
    let mut child = Command::new(exe)
        .args(["cluster", "node-init"])
        .args(args.to_args())
        .spawn()
        .context("cannot start the node's PID 1")?;
    let pid_file = args.node_dir.join(INIT_PID_FILE);
    let tmp = args.node_dir.join(format!(".{INIT_PID_FILE}.tmp"));
    std::fs::write(&tmp, format!("{}\n", child.id()))
        .and_then(|()| std::fs::rename(&tmp, &pid_file))
        .with_context(|| format!("cannot write {}", pid_file.display()))?;
    let status = child.wait().context("cannot wait for the node's init")?;
    Ok(status.code().unwrap_or(128))
}

fn sys(what: &str) -> impl FnOnce(nix::errno::Errno) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{what}: {e}")
}

/// `node-init`: prepares the node's namespaces and root, then becomes init. Returns only on
/// failure.
pub fn node_init(args: &LaunchArgs) -> anyhow::Result<()> {
    let netns = Path::new(NETNS_DIR).join(&args.netns);
    let ns = std::fs::File::open(&netns)
        .with_context(|| format!("cannot open the network namespace {}", netns.display()))?;
    nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)
        .map_err(sys("cannot enter the node's network namespace"))?;
    drop(ns);
    nix::sched::unshare(
        CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC,
    )
    .map_err(sys(
        "cannot create the node's mount, UTS and IPC namespaces",
    ))?;
    // Nothing mounted here propagates back to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("cannot make the node's mounts private"))?;

    let root = args.node_dir.join("root");
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        args.image.display(),
        args.node_dir.join("upper").display(),
        args.node_dir.join("work").display()
    );
    mount(
        Some("overlay"),
        &root,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(sys("cannot mount the node's overlay"))?;
    dev(&root.join("dev"))?;
    mount(
        Some("sysfs"),
        &root.join("sys"),
        Some("sysfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(sys("cannot mount /sys"))?;

    let config = std::fs::read(args.node_dir.join("config.yaml"))
        .context("cannot read the node's machine config")?;
    let target = root.join(NODE_CONFIG.trim_start_matches('/'));
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&target)
            .with_context(|| format!("cannot write {}", target.display()))?;
        f.write_all(&config)?;
    }

    nix::unistd::sethostname(&args.hostname).map_err(sys("cannot set the hostname"))?;

    // pivot_root(".", "."): the old root ends up on top of the new one and is detached at
    // once (pivot_root(2), "NOTES").
    nix::unistd::chdir(&root).map_err(sys("cannot enter the node's root"))?;
    nix::unistd::pivot_root(".", ".").map_err(sys("cannot pivot into the node's root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("cannot detach the host's root"))?;
    nix::unistd::chdir("/").map_err(sys("cannot enter /"))?;

    // If the supervisor dies, the node dies with it (and its PID namespace with init).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(sys("cannot set the parent-death signal"))?;
    let err = Command::new(NODE_INIT)
        .args([
            "--mode",
            "container",
            "--config",
            NODE_CONFIG,
            "--manifest",
            NODE_MANIFEST,
        ])
        .env_clear()
        .env("PATH", "/usr/bin")
        .env("container", "talos-rs")
        .env(
            "RUST_LOG",
            std::env::var("TALOS_NODE_LOG").unwrap_or_else(|_| "info".into()),
        )
        .exec();
    Err(anyhow::Error::new(err).context(format!("cannot execute {NODE_INIT} in the node")))
}

/// A minimal `/dev` on a tmpfs: the character devices programs expect and the usual links.
fn dev(dir: &Path) -> anyhow::Result<()> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )
    .map_err(sys("cannot mount /dev"))?;
    for (name, major, minor) in [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ] {
        let path = dir.join(name);
        mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .map_err(|e| anyhow::anyhow!("cannot create /dev/{name}: {e}"))?;
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            &path,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| anyhow::anyhow!("cannot chmod /dev/{name}: {e}"))?;
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dir.join(name))
            .with_context(|| format!("cannot create /dev/{name}"))?;
    }
    for d in ["pts", "shm"] {
        std::fs::create_dir(dir.join(d)).with_context(|| format!("cannot create /dev/{d}"))?;
    }
    Ok(())
}
