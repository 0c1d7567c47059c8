//! `talosctl cluster create|show|destroy`: local clusters of talos-rs nodes in Linux
//! namespaces on this host (DESIGN.md §6, container mode).
//!
//! A cluster is a network namespace holding a bridge and a real dnsmasq (the nodes' DHCP
//! server), and per node a named network namespace with a veth into the bridge, new PID,
//! mount, UTS and IPC namespaces, an overlay of the image tree with the node's own writable
//! layer, and init as PID 1 in container mode with the node's generated machine config
//! ([`launch`]). Nothing is created in the host's network namespace.
//!
//! Everything lives under the cluster's state directory (`~/.talos/clusters/<name>`, or
//! `--state <dir>/<name>`), whose `cluster.json` ([`record`]) journals each object as it is
//! made; `destroy` removes them in reverse — after a failed or interrupted create too.
//! `create` checks everything it can first (name, counts, network, image, tools, the configs
//! with their patches) and creates nothing when a check fails; when a later step fails it
//! removes what it made before returning the error.

pub mod genconfig;
pub mod launch;
pub mod net;
pub mod publish;
pub mod record;
pub mod uids;
pub mod vm;

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cosi::ResourceSpec as _;
use machinery::config::{apply_patches, Config, Patch, ValidationMode};
use machinery::resources::block::{MountStatusSpec, SYSTEM_VOLUMES};
use machinery::resources::network::AddressStatusSpec;
use machinery::secrets::Bundle;

use self::launch::LaunchArgs;
use self::record::{Cluster, Node, Object, Proc, Provisioner, Role};
use crate::talosconfig::{self, TalosConfig};

/// The default cluster name (as upstream).
pub const DEFAULT_NAME: &str = "talos-default";

/// Environment variable for tests: fail `cluster create` at this step (`dnsmasq`,
/// `node-netns:<n>`, `node-launch:<n>`, `wait`; `<n>` counts nodes from 1).
pub const FAIL_AT_ENV: &str = "TALOSCTL_CLUSTER_FAIL_AT";
/// With [`FAIL_AT_ENV`]: `exit` ends the process there at once, as a crash or `kill -9`
/// would, leaving everything made so far for `cluster destroy`; otherwise the step returns an
/// error and create cleans up.
pub const FAIL_MODE_ENV: &str = "TALOSCTL_CLUSTER_FAIL_MODE";

/// The `cluster` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create a local cluster: nodes in namespaces on this host or VMs under qemu, on a private bridge.
    #[command(long_about = CREATE_LONG_ABOUT, after_long_help = CREATE_EXAMPLES)]
    Create(CreateArgs),
    /// Show a local cluster's nodes: name, role, IP, state, init's host PID, network namespace.
    Show(ShowArgs),
    /// Stop a local cluster's nodes and remove everything its create made.
    Destroy(DestroyArgs),
    /// (internal) A node's supervisor on the host.
    #[command(hide = true)]
    NodeSupervise(LaunchArgs),
    /// (internal) One boot of a node: its PID namespace.
    #[command(hide = true)]
    NodeBoot(LaunchArgs),
    /// (internal) A node's PID 1 until it becomes init.
    #[command(hide = true)]
    NodeInit(LaunchArgs),
    /// (internal) A VM node's supervisor on the host: its configuration server, its API
    /// relay and qemu.
    #[command(hide = true)]
    NodeVm(vm::VmArgs),
}

const CREATE_LONG_ABOUT: &str = "\
Create a local cluster of talos-rs nodes on this host (root only): in Linux namespaces, or VMs.

The cluster gets a private network: a bridge inside a network namespace of its own, with a
dnsmasq DHCP server, and each node a named network namespace (the node's name) with a veth into
the bridge. Each node runs init as PID 1 of new PID, mount, UTS and IPC namespaces, on an overlay
of the node image (rootfs/build.sh) with a writable layer of its own, and gets its address by
DHCP. The host's own interfaces, routes and files are not touched.

Everything is checked before anything is made (a bad --config-patch creates nothing); a failure
later removes what was made. The state goes to ~/.talos/clusters/<name> (see --state), and a
context named after the cluster is merged into the talosconfig, so that `talosctl -n <node> …`
reaches the nodes. Each node's apid is published on the host's 127.0.0.1 (a port of the
kernel's choosing, in `cluster show`), and the context holds the OS CA, an os:admin client
certificate and the first control plane's published endpoint (`talosctl version`).

With --provisioner qemu the nodes are VMs instead: Debian's stock kernel and the image's
initramfs (rootfs/kernel.sh && rootfs/build.sh make both) under qemu, each with a tap in the
cluster's bridge, a sparse raw disk (--disk) and its serial console in <node dir>/console.log.
A VM gets its machine config over HTTP from its supervisor (talos.config= on its kernel command
line, served to that node only) and is reached through apid only. TCG by default (--accel kvm
where the host's KVM works); a VM boots to ready in about ten seconds under TCG. Once
configured, a VM's blank disk gets STATE (its configuration, kept across reboots) and EPHEMERAL
(/var), formatted xfs (`get volumestatuses`, `get mountstatuses`); --disk is at least 2200 MiB.";

const CREATE_EXAMPLES: &str = "\
Examples:
  talosctl cluster create
  talosctl cluster create --name demo --controlplanes 1 --workers 2
  talosctl cluster create --name demo --config-patch @patch.yaml --cidr 10.6.0.0/24
  talosctl cluster create --name vms --provisioner qemu --workers 0 --memory 1024
  talosctl -n demo-worker-1 get addresses
  talosctl cluster destroy --name demo";

/// Which cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct Which {
    /// The cluster's name.
    #[arg(long, default_value = DEFAULT_NAME)]
    pub name: String,
    /// The directory of cluster state directories [default: ~/.talos/clusters].
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

impl Which {
    /// The state root and the cluster's directory.
    pub fn dirs(&self) -> anyhow::Result<(PathBuf, PathBuf)> {
        let root = match &self.state {
            Some(s) => s.clone(),
            None => talosconfig::talos_home()?.join("clusters"),
        };
        let dir = root.join(&self.name);
        Ok((root, dir))
    }
}

/// Arguments of `cluster create`.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    which: Which,
    /// Control plane nodes.
    #[arg(long, default_value_t = 1)]
    controlplanes: u32,
    /// Worker nodes.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// The cluster's IPv4 network; the bridge takes its first address, the nodes the next ones
    /// [default: the first free 10.5.N.0/24 among the clusters in the state directory].
    #[arg(long, value_name = "CIDR")]
    cidr: Option<String>,
    /// A patch for every node's machine config: a file (`@file` or a path) or inline YAML/JSON;
    /// strategic merge or JSON 6902, as `talosctl machineconfig patch`. Repeatable.
    #[arg(long, value_name = "PATCH", allow_hyphen_values = true)]
    config_patch: Vec<String>,
    /// A patch for the control plane nodes only.
    #[arg(long, value_name = "PATCH", allow_hyphen_values = true)]
    config_patch_control_plane: Vec<String>,
    /// A patch for the workers only.
    #[arg(long, value_name = "PATCH", allow_hyphen_values = true)]
    config_patch_worker: Vec<String>,
    /// The node image tree [default: $TALOS_IMAGE, else target/rootfs/tree beside talosctl].
    #[arg(long, value_name = "DIR")]
    image: Option<PathBuf>,
    /// How long to wait for every node's daemons and address (a VM's: and its system volumes,
    /// formatted on a first boot), in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    wait_timeout: u64,
    /// How the nodes run: in Linux namespaces on this host's kernel, or as VMs under qemu.
    #[arg(long, value_enum, default_value_t = Provisioner::Container)]
    provisioner: Provisioner,
    /// qemu: memory of each VM, MiB.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    memory: u32,
    /// qemu: virtual CPUs of each VM.
    #[arg(long, default_value_t = 2)]
    cpus: u32,
    /// qemu: the size of each VM's disk (a sparse raw image), MiB.
    #[arg(long, default_value_t = 6144, value_name = "MIB")]
    disk: u64,
    /// qemu: the accelerator (kvm hangs guest kernels on some hosts).
    #[arg(long, value_enum, default_value_t = vm::Accel::Tcg)]
    accel: vm::Accel,
    /// qemu: the kernel [default: vmlinuz beside the image tree, from rootfs/kernel.sh].
    #[arg(long, value_name = "FILE")]
    vmlinuz_path: Option<PathBuf>,
    /// qemu: the initramfs [default: initramfs.cpio.gz beside the image tree].
    #[arg(long, value_name = "FILE")]
    initrd_path: Option<PathBuf>,
    /// The control plane endpoint's host: `cluster.controlPlane.endpoint` is
    /// `https://HOST:6443` [default: the first control plane's address]. A name (such as
    /// `k8s.example.com`) is answered by the cluster's dnsmasq, the nodes' name server (by
    /// DHCP), with the first control plane's address, and is in the control planes' certSANs.
    #[arg(long, value_name = "HOST")]
    endpoint: Option<String>,
}

/// `--endpoint`: an IP address, or a DNS name (letters, digits, `-`, dots; no scheme, no
/// port): `Ok(Some(name))` for a name dnsmasq must answer.
fn endpoint_host(host: &str) -> anyhow::Result<Option<String>> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(None);
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if host.len() > 253 || !host.split('.').all(label_ok) {
        anyhow::bail!(
            "--endpoint {host:?} is neither an IP address nor a DNS name (give the host only: \
             `k8s.example.com`, not `https://k8s.example.com:6443`)"
        );
    }
    Ok(Some(host.to_ascii_lowercase()))
}

/// Arguments of `cluster show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    which: Which,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = ShowFormat::Table)]
    output: ShowFormat,
}

/// `cluster show` formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShowFormat {
    /// Aligned columns.
    Table,
    /// One JSON document.
    Json,
}

/// Arguments of `cluster destroy`.
#[derive(Debug, clap::Args)]
pub struct DestroyArgs {
    #[command(flatten)]
    which: Which,
}

/// Runs a `cluster` subcommand. `talosconfig` is the talosconfig file to merge contexts into.
pub fn run(cmd: &Command, talosconfig: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        Command::Create(args) => create(args, talosconfig, out),
        Command::Show(args) => show(args, out),
        Command::Destroy(args) => destroy(args, out),
        Command::NodeSupervise(args) => {
            let code = launch::supervise(args)?;
            std::process::exit(code)
        }
        Command::NodeBoot(args) => {
            let code = launch::boot(args)?;
            std::process::exit(code)
        }
        Command::NodeInit(args) => launch::node_init(args),
        Command::NodeVm(args) => {
            let code = vm::supervise(args)?;
            std::process::exit(code)
        }
    }
}

/// Progress lines on standard error, with the time since the start.
struct Progress(Instant);

impl Progress {
    fn say(&self, msg: impl std::fmt::Display) {
        eprintln!("[{:>6.2}s] {msg}", self.0.elapsed().as_secs_f64());
    }
}

fn require_root() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("local clusters need root (namespaces, mounts, network links)");
    }
    Ok(())
}

/// A cluster name: a DNS label short enough for node names and hostnames.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        anyhow::bail!(
            "cluster name {name:?}: use 1 to 32 lowercase letters, digits and '-', \
             starting with a letter and not ending with '-'"
        );
    }
    Ok(())
}

/// Characters the overlay mount options cannot carry in a path.
fn check_path(path: &Path) -> anyhow::Result<()> {
    let s = path.to_string_lossy();
    if s.contains([',', ':', '\\', '\n']) || !path.is_absolute() {
        anyhow::bail!(
            "{}: the state and image paths must be absolute, without ',', ':' or '\\'",
            path.display()
        );
    }
    Ok(())
}

/// The node image: `--image`, `$TALOS_IMAGE`, or `target/rootfs/tree` of the workspace this
/// talosctl was built in.
fn image_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("TALOS_IMAGE").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("cannot find the talosctl binary")?;
    // target/<profile>/talosctl → target/rootfs/tree
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(2)
        .take(2)
        .map(|d| d.join("rootfs/tree"))
        .chain([PathBuf::from("target/rootfs/tree")])
        .collect();
    candidates
        .iter()
        .find(|p| p.join("usr/bin/init").exists())
        .cloned()
        .with_context(|| {
            format!(
                "no node image (looked in {}): build it with rootfs/build.sh, or give --image",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// The first 10.5.N.0/24 no cluster under `root` uses.
fn default_cidr(root: &Path) -> anyhow::Result<String> {
    let mut used = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            if let Ok(c) = Cluster::load(&e.path()) {
                used.push(c.cidr);
            }
        }
    }
    (0..=255)
        .map(|n| format!("10.5.{n}.0/24"))
        .find(|c| !used.contains(c))
        .context("every 10.5.N.0/24 is taken: give --cidr")
}

/// A `--config-patch` value: `@file`, a file path, or inline text.
fn load_patch(arg: &str) -> anyhow::Result<Patch> {
    let (text, origin) = match arg.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("cannot read patch {path}"))?,
            format!("patch {arg}"),
        ),
        None if !arg.contains('\n') && Path::new(arg).is_file() => (
            std::fs::read_to_string(arg).with_context(|| format!("cannot read patch {arg}"))?,
            format!("patch {arg}"),
        ),
        None => (arg.to_string(), "inline patch".to_string()),
    };
    Patch::parse(&text).with_context(|| format!("invalid {origin}"))
}

/// The failure-injection hook of the tests ([`FAIL_AT_ENV`]).
fn hook(step: &str) -> anyhow::Result<()> {
    if std::env::var(FAIL_AT_ENV).ok().as_deref() != Some(step) {
        return Ok(());
    }
    if std::env::var(FAIL_MODE_ENV).ok().as_deref() == Some("exit") {
        eprintln!("talosctl: {FAIL_AT_ENV}={step}: exiting at once, as a crash would");
        std::process::exit(3);
    }
    anyhow::bail!("injected failure at step {step} ({FAIL_AT_ENV})")
}

/// A node to create, with its machine config.
struct Planned {
    node: Node,
    config: String,
}

/// Checks everything and works out the cluster: nothing is created here.
/// What `create` plans before it makes anything: the cluster record, each node with its
/// config, the clusters' root directory, the image, and the cluster's secrets.
type Plan = (Cluster, Vec<Planned>, PathBuf, PathBuf, Bundle);

fn plan(args: &CreateArgs) -> anyhow::Result<Plan> {
    require_root()?;
    let which = &args.which;
    check_name(&which.name)?;
    if args.controlplanes == 0 {
        anyhow::bail!("--controlplanes: a cluster needs at least one control plane node");
    }
    let total = args.controlplanes + args.workers;
    if total > 200 {
        anyhow::bail!("{total} nodes: at most 200 per cluster");
    }
    let (root, _) = which.dirs()?;
    let root = std::path::absolute(&root).context("cannot resolve the state directory")?;
    let dir = root.join(&which.name);
    check_path(&dir)?;
    if dir.symlink_metadata().is_ok() {
        anyhow::bail!(
            "cluster {:?} exists ({}): `talosctl cluster destroy --name {}` first",
            which.name,
            dir.display(),
            which.name
        );
    }
    let image = std::path::absolute(image_dir(args.image.as_deref())?)
        .context("cannot resolve the image path")?;
    check_path(&image)?;
    for f in ["usr/bin/init", "etc/talos/daemons.yaml"] {
        if !image.join(f).is_file() {
            anyhow::bail!(
                "{} is not a node image: no /{f} (build it with rootfs/build.sh)",
                image.display()
            );
        }
    }
    let qemu = args.provisioner == Provisioner::Qemu;
    // Daemons of a VM run under the VM's own kernel: the host's users are not theirs.
    if !qemu {
        check_uids(&image)?;
    }
    if qemu {
        if args.memory < 512 {
            anyhow::bail!("--memory {}: a VM node needs at least 512 MiB", args.memory);
        }
        if !(1..=64).contains(&args.cpus) {
            anyhow::bail!("--cpus {}: 1 to 64", args.cpus);
        }
        if args.disk < 2200 {
            anyhow::bail!(
                "--disk {}: a VM's disk needs at least 2200 MiB (STATE 100 MiB and EPHEMERAL \
                 2 GiB at least)",
                args.disk
            );
        }
        for f in [&vm_files(args, &image).0, &vm_files(args, &image).1] {
            if !f.is_file() {
                anyhow::bail!(
                    "{} does not exist: fetch the kernel and build the image with \
                     `rootfs/kernel.sh && rootfs/build.sh`, or give --vmlinuz-path/--initrd-path",
                    f.display()
                );
            }
        }
        if args.accel == vm::Accel::Kvm && !Path::new("/dev/kvm").exists() {
            anyhow::bail!("--accel kvm: this host has no /dev/kvm (use tcg)");
        }
    }
    let cidr = match &args.cidr {
        Some(c) => c.clone(),
        None => default_cidr(&root)?,
    };
    let (network, prefix) = net::parse_cidr(&cidr)?;
    let gateway = net::host(network, prefix, 1).context("the network has no room")?;
    if net::host(network, prefix, 1 + total).is_none() {
        anyhow::bail!("--cidr {cidr}: too small for the bridge and {total} nodes");
    }
    let tools: &[&str] = if qemu {
        &["ip", "dnsmasq", "nsenter", "setpriv", "qemu-system-x86_64"]
    } else {
        &["ip", "dnsmasq", "nsenter"]
    };
    for tool in tools.iter().copied() {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            anyhow::bail!(
                "{tool} is not installed (scripts/install-deps.sh --run installs iproute2, \
                 dnsmasq-base and util-linux; --run --vm also qemu-system-x86)"
            );
        }
    }

    let patches = |list: &[String]| -> anyhow::Result<Vec<Patch>> {
        list.iter().map(|p| load_patch(p)).collect()
    };
    let common = patches(&args.config_patch)?;
    let cp_patches = patches(&args.config_patch_control_plane)?;
    let worker_patches = patches(&args.config_patch_worker)?;

    let netns = format!("{}-net", which.name);
    let mut names = vec![netns.clone()];
    let mut nodes = Vec::new();
    let secrets = genconfig::secrets()?;
    let first_cp = net::host(network, prefix, 2).context("the network has no room")?;
    let endpoint_name = args
        .endpoint
        .as_deref()
        .map(endpoint_host)
        .transpose()?
        .flatten();
    let endpoint = match (&args.endpoint, &endpoint_name) {
        (Some(_), Some(name)) => format!("https://{name}:6443"),
        (Some(ip), None) => match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("https://[{v6}]:6443"),
            _ => format!("https://{ip}:6443"),
        },
        (None, _) => format!("https://{first_cp}:6443"),
    };
    let roles = (1..=args.controlplanes)
        .map(|i| (Role::Controlplane, i))
        .chain((1..=args.workers).map(|i| (Role::Worker, i)));
    for (index, (role, i)) in roles.enumerate() {
        let n = u32::try_from(index).unwrap_or(u32::MAX) + 1;
        let name = format!("{}-{}-{i}", which.name, role.as_str());
        let ip = net::host(network, prefix, 1 + n).context("the network has no room")?;
        let node = Node {
            name: name.clone(),
            role,
            ip: ip.to_string(),
            prefix,
            mac: format!("02:74:72:73:{:02x}:{:02x}", n >> 8, n & 0xff),
            netns: if qemu { netns.clone() } else { name.clone() },
            veth: format!(
                "{}-{}{i}",
                if qemu { "tap" } else { "veth" },
                if role == Role::Controlplane { 'c' } else { 'w' }
            ),
            dir: dir.join("nodes").join(&name),
            supervisor: None,
            init: None,
            api_port: None,
            disk: qemu.then(|| dir.join("nodes").join(&name).join("disk.raw")),
        };
        // A control plane's certificates name the endpoint's name: the workers' trustd and the
        // other control planes reach it by that name.
        let sans: Vec<String> = match role {
            Role::Controlplane => endpoint_name.iter().cloned().collect(),
            Role::Worker => Vec::new(),
        };
        let base = genconfig::node_config(&secrets, &which.name, &name, role, &endpoint, &sans)?;
        let base = if qemu {
            genconfig::for_vm(&base)?
        } else {
            base
        };
        let mut all: Vec<Patch> = common.clone();
        all.extend(
            match role {
                Role::Controlplane => &cp_patches,
                Role::Worker => &worker_patches,
            }
            .iter()
            .cloned(),
        );
        let config = if all.is_empty() {
            base
        } else {
            apply_patches(&base, &all)
                .with_context(|| format!("cannot apply the config patches to {name}"))?
        };
        let parsed = Config::from_yaml(&config).map_err(|e| invalid_config(&name, &e))?;
        parsed
            .validate(if qemu {
                ValidationMode::Metal
            } else {
                ValidationMode::Container
            })
            .map_err(|e| invalid_config(&name, &e))?;
        if !qemu {
            names.push(node.netns.clone());
        }
        nodes.push(Planned { node, config });
    }
    for n in &names {
        if net::netns_exists(n) {
            anyhow::bail!(
                "a network namespace {n:?} exists already (another cluster, or a leftover: \
                 `ip netns del {n}`)"
            );
        }
    }
    let cluster = Cluster {
        name: which.name.clone(),
        provisioner: args.provisioner,
        dir: dir.clone(),
        cidr,
        gateway: gateway.to_string(),
        netns,
        bridge: "br0".into(),
        nodes: nodes.iter().map(|p| p.node.clone()).collect(),
        dnsmasq: None,
        endpoint_name,
        objects: Vec::new(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    Ok((cluster, nodes, root, image, secrets))
}

/// A VM's kernel and initramfs: given, or beside the image tree (`target/rootfs/`).
fn vm_files(args: &CreateArgs, image: &Path) -> (PathBuf, PathBuf) {
    let beside = image.parent().unwrap_or(image);
    (
        args.vmlinuz_path
            .clone()
            .unwrap_or_else(|| beside.join("vmlinuz")),
        args.initrd_path
            .clone()
            .unwrap_or_else(|| beside.join("initramfs.cpio.gz")),
    )
}

/// Refuses an image whose daemons would run under a uid the host has (DESIGN.md §5).
fn check_uids(image: &Path) -> anyhow::Result<()> {
    let path = image.join("etc/talos/daemons.yaml");
    let paths = machinery::manifest::Paths {
        root: "/".into(),
        bin: "/usr/bin".into(),
    };
    let manifest = machinery::manifest::Manifest::load(&path, &paths)
        .with_context(|| format!("the image's daemon manifest {}", path.display()))?;
    let found = uids::conflicts(&manifest.uids(), Path::new("/etc"), Path::new("/proc"));
    if !found.is_empty() {
        anyhow::bail!(
            "the node's daemons would share uids with this host, which would let the host's \
             users read and signal them:\n  * {}",
            found.join("\n  * ")
        );
    }
    Ok(())
}

fn invalid_config(node: &str, errors: &machinery::config::ConfigErrors) -> anyhow::Error {
    anyhow::anyhow!(
        "the machine config of {node} is not valid (check --config-patch):\n  * {}",
        errors
            .errors()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n  * ")
    )
}

/// `cluster create`.
fn create(args: &CreateArgs, talosconfig: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let progress = Progress(Instant::now());
    let (mut cluster, planned, root, image, secrets) = plan(args)?;
    // The talosconfig must be readable before anything is made.
    TalosConfig::load(talosconfig)?;
    progress.say(format_args!(
        "creating cluster {:?} ({}): {} control plane(s), {} worker(s), network {}, state {}",
        cluster.name,
        cluster.provisioner.as_str(),
        args.controlplanes,
        args.workers,
        cluster.cidr,
        cluster.dir.display()
    ));
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    std::fs::create_dir(&cluster.dir)
        .with_context(|| format!("cannot create {}", cluster.dir.display()))?;
    let dir = cluster.dir.clone();
    let result = (|| {
        cluster.record(Object::Dir { path: dir.clone() })?;
        build(
            &mut cluster,
            &planned,
            &secrets,
            &image,
            talosconfig,
            args,
            &progress,
        )
    })();
    match result {
        Ok(()) => {
            let rows = table_rows(&cluster, false);
            crate::services::table(out, &rows)?;
            Ok(())
        }
        Err(e) => {
            progress.say(format_args!(
                "create failed: {}; removing what was made",
                cosi::error::Chain(e.as_ref())
            ));
            if let Err(d) = remove_all(&mut cluster, &progress) {
                progress.say(format_args!(
                    "cleanup incomplete ({}): run `talosctl cluster destroy --name {}`",
                    cosi::error::Chain(d.as_ref()),
                    cluster.name
                ));
            }
            Err(e)
        }
    }
}

/// The creation steps after the checks; every object is journaled before it is made.
fn build(
    cluster: &mut Cluster,
    planned: &[Planned],
    secrets: &Bundle,
    image: &Path,
    talosconfig: &Path,
    args: &CreateArgs,
    progress: &Progress,
) -> anyhow::Result<()> {
    let qemu = cluster.provisioner == Provisioner::Qemu;
    let lower = cluster.dir.join("image");
    let (kernel, initrd) = (
        cluster.dir.join("vmlinuz"),
        cluster.dir.join("initramfs.cpio.gz"),
    );
    if qemu {
        // The kernel and initramfs of this cluster (a rebuild of the image does not change a
        // running cluster's reboots), and the manifest, for the node states.
        let (k, i) = vm_files(args, image);
        std::fs::copy(&k, &kernel).with_context(|| format!("cannot copy {}", k.display()))?;
        std::fs::copy(&i, &initrd).with_context(|| format!("cannot copy {}", i.display()))?;
        let manifest = lower.join(launch::NODE_MANIFEST.trim_start_matches('/'));
        if let Some(d) = manifest.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::copy(
            image.join(launch::NODE_MANIFEST.trim_start_matches('/')),
            &manifest,
        )
        .context("cannot copy the image's daemon manifest")?;
        progress.say(format_args!(
            "copied the kernel {} and initramfs {}",
            k.display(),
            i.display()
        ));
    } else {
        copy_tree(image, &lower)
            .with_context(|| format!("cannot copy the image to {}", lower.display()))?;
        progress.say(format_args!("copied the image {}", image.display()));
    }

    let (network, prefix) = net::parse_cidr(&cluster.cidr)?;
    let gateway: Ipv4Addr = cluster.gateway.parse()?;
    claim_netns(&cluster.netns)?;
    cluster.record(Object::Netns {
        name: cluster.netns.clone(),
    })?;
    net::netns_add(&cluster.netns)?;
    cluster.record(Object::Link {
        netns: cluster.netns.clone(),
        name: cluster.bridge.clone(),
    })?;
    net::bridge_add(&cluster.netns, &cluster.bridge, gateway, prefix)?;
    progress.say(format_args!(
        "network namespace {}: bridge {} {}/{prefix}",
        cluster.netns, cluster.bridge, cluster.gateway
    ));

    hook("dnsmasq")?;
    let dnsmasq = start_dnsmasq(cluster, network, prefix)?;
    cluster.dnsmasq = Some(dnsmasq.clone());
    cluster.record(Object::Process {
        proc: dnsmasq.clone(),
    })?;
    progress.say(format_args!(
        "dnsmasq (pid {}): DHCP on {}, a static lease per node",
        dnsmasq.pid, cluster.bridge
    ));

    for (i, p) in planned.iter().enumerate() {
        let n = i + 1;
        let node = &p.node;
        if qemu {
            launch_vm(
                cluster,
                node,
                &p.config,
                (&kernel, &initrd),
                args,
                n,
                progress,
            )?;
            continue;
        }
        for d in ["upper", "work", "root"] {
            std::fs::create_dir_all(node.dir.join(d))
                .with_context(|| format!("cannot create {}", node.dir.join(d).display()))?;
        }
        crate::files::write_private(&node.dir.join("config.yaml"), p.config.as_bytes())?;
        hook(&format!("node-netns:{n}"))?;
        claim_netns(&node.netns)?;
        cluster.record(Object::Netns {
            name: node.netns.clone(),
        })?;
        net::netns_add(&node.netns)?;
        cluster.record(Object::Link {
            netns: cluster.netns.clone(),
            name: node.veth.clone(),
        })?;
        net::veth_add(
            &cluster.netns,
            &cluster.bridge,
            &node.veth,
            &node.netns,
            &node.mac,
        )?;
        hook(&format!("node-launch:{n}"))?;
        cluster.record(Object::Node {
            name: node.name.clone(),
        })?;
        let port = publish::free_port()?;
        let (supervisor, init) = launch_node(node, &lower, port)?;
        if let Some(n) = cluster.node_mut(&node.name) {
            n.supervisor = Some(supervisor);
            n.init = Some(init.clone());
            n.api_port = Some(port);
        }
        cluster.save()?;
        progress.say(format_args!(
            "{}: network namespace {}, eth0 {} via {}, init pid {}, API on 127.0.0.1:{port}",
            node.name, node.netns, node.mac, node.veth, init.pid
        ));
    }

    // The first control plane's apid, published on the host, is the endpoint; its OS CA and
    // an os:admin client certificate the credentials (as `gen config` writes them). The
    // cluster keeps a copy: its VM nodes' states are read through apid.
    let first = cluster
        .nodes
        .iter()
        .find(|n| n.role == Role::Controlplane)
        .context("the cluster has no control plane")?;
    let client = secrets.client_certificate(
        &["os:admin".to_string()],
        std::time::SystemTime::now(),
        crate::gen::CLIENT_CERT_TTL,
    )?;
    let ca = secrets.os_ca_crt();
    let mut own = TalosConfig::default();
    own.merge(
        &cluster.name,
        talosconfig::Context {
            ca: ca.clone(),
            crt: client.crt.clone(),
            key: client.key.clone(),
            ..Default::default()
        },
    );
    own.save(&cluster.dir.join(OWN_TALOSCONFIG))?;

    hook("wait")?;
    progress.say(if cluster.nodes.iter().any(Node::is_vm) {
        "waiting for every node's daemons, DHCP address and system volumes"
    } else {
        "waiting for every node's daemons and DHCP address"
    });
    let started = Instant::now();
    let timeout = Duration::from_secs(args.wait_timeout);
    wait_ready(cluster, timeout, progress)?;

    let mut tc = TalosConfig::load(talosconfig)?;
    let existed = talosconfig.exists();
    wait_api(
        cluster,
        &ca,
        &client,
        timeout.saturating_sub(started.elapsed()),
        progress,
    )?;
    let context = talosconfig::Context {
        endpoints: first
            .api_port
            .map(|p| format!("127.0.0.1:{p}"))
            .into_iter()
            .collect(),
        nodes: vec![first.ip.clone()],
        ca,
        crt: client.crt,
        key: client.key,
        local_cluster: Some(cluster.dir.clone()),
        ..Default::default()
    };
    let name = tc.merge(&cluster.name, context);
    cluster.record(Object::Context {
        talosconfig: talosconfig.to_path_buf(),
        name: name.clone(),
        created_file: !existed,
    })?;
    tc.save(talosconfig)?;
    progress.say(format_args!(
        "talosconfig {}: context {name:?} is current",
        talosconfig.display()
    ));
    Ok(())
}

/// Refuses a network namespace name that appeared since the checks (another cluster being
/// created at the same time): it must not enter the journal, or destroy would remove it.
fn claim_netns(name: &str) -> anyhow::Result<()> {
    if net::netns_exists(name) {
        anyhow::bail!("the network namespace {name:?} appeared meanwhile: not touching it");
    }
    Ok(())
}

/// Starts dnsmasq in the cluster's network namespace: DHCP (a static lease per node by MAC),
/// and DNS only for an endpoint by name; its pid, lease and log files in the cluster directory.
fn start_dnsmasq(cluster: &Cluster, network: Ipv4Addr, prefix: u8) -> anyhow::Result<Proc> {
    let dir = &cluster.dir;
    let log = dir.join("dnsmasq.log");
    let pid_file = dir.join("dnsmasq.pid");
    let mut cmd = Process::new("nsenter");
    cmd.arg(format!("--net={}/{}", net::NETNS_DIR, cluster.netns))
        .arg("--")
        .arg("dnsmasq")
        .args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--bind-interfaces",
            "--dhcp-authoritative",
            "--log-dhcp",
            "--user=root",
            "--group=root",
        ])
        .arg(format!("--interface={}", cluster.bridge))
        .arg(format!(
            "--dhcp-range={network},static,{},1h",
            net::netmask(prefix)
        ))
        .arg(format!(
            "--dhcp-leasefile={}",
            dir.join("dnsmasq.leases").display()
        ))
        .arg(format!("--pid-file={}", pid_file.display()))
        .arg(format!("--log-facility={}", log.display()));
    for n in &cluster.nodes {
        cmd.arg(format!("--dhcp-host={},{},{}", n.mac, n.ip, n.name));
    }
    match (&cluster.endpoint_name, cluster.nodes.first()) {
        // The endpoint by name: dnsmasq answers it (and nothing else: no upstream server, not
        // this host's /etc/hosts) and is the nodes' name server by DHCP.
        (Some(name), Some(cp)) => {
            cmd.args(["--port=53", "--no-resolv", "--no-hosts"])
                .arg(format!("--host-record={name},{}", cp.ip))
                .arg(format!(
                    "--dhcp-option=option:dns-server,{}",
                    cluster.gateway
                ));
        }
        _ => {
            cmd.arg("--port=0");
        }
    }
    let console = std::fs::File::create(dir.join("dnsmasq.out"))?;
    use std::os::unix::process::CommandExt as _;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .process_group(0)
        .spawn()
        .context("cannot start dnsmasq (apt-get install dnsmasq-base)")?;
    let pid = i32::try_from(child.id()).context("pid")?;
    let proc = Proc::of(pid, "dnsmasq").context("dnsmasq ended at once")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(dir.join("dnsmasq.out")).unwrap_or_default();
            anyhow::bail!("dnsmasq exited ({status}): {}", text.trim());
        }
        if pid_file.exists() {
            return Ok(proc);
        }
        if Instant::now() > deadline {
            anyhow::bail!("dnsmasq did not start within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes a VM node: its directory, config, disk and tap, and starts its supervisor (detached);
/// records qemu as the node's init once it runs.
fn launch_vm(
    cluster: &mut Cluster,
    node: &Node,
    config: &str,
    (kernel, initrd): (&Path, &Path),
    args: &CreateArgs,
    n: usize,
    progress: &Progress,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&node.dir)
        .with_context(|| format!("cannot create {}", node.dir.display()))?;
    let config_file = node.dir.join("config.yaml");
    crate::files::write_private(&config_file, config.as_bytes())?;
    let disk = node.disk.clone().context("a VM node without a disk")?;
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(args.disk * 1024 * 1024))
        .with_context(|| format!("cannot create the disk {}", disk.display()))?;
    hook(&format!("node-netns:{n}"))?;
    cluster.record(Object::Link {
        netns: cluster.netns.clone(),
        name: node.veth.clone(),
    })?;
    net::tap_add(&cluster.netns, &cluster.bridge, &node.veth)?;
    hook(&format!("node-launch:{n}"))?;
    cluster.record(Object::Node {
        name: node.name.clone(),
    })?;
    let api_port = publish::free_port()?;
    let spec = vm::VmSpec {
        name: node.name.clone(),
        netns: cluster.netns.clone(),
        tap: node.veth.clone(),
        mac: node.mac.clone(),
        ip: node.ip.parse().context("the node's address")?,
        gateway: cluster.gateway.parse().context("the gateway's address")?,
        kernel: kernel.to_path_buf(),
        initrd: initrd.to_path_buf(),
        disk,
        memory_mib: args.memory,
        cpus: args.cpus,
        accel: args.accel,
        config: config_file,
        console: node.console(),
        api_port,
    };
    let spec_file = node.dir.join(vm::SPEC_FILE);
    std::fs::write(&spec_file, serde_json::to_vec_pretty(&spec)?)
        .with_context(|| format!("cannot write {}", spec_file.display()))?;
    let log = node.dir.join("supervisor.log");
    let out =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = vm::supervise_command(&spec_file)?
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("cannot start the VM's supervisor")?;
    let pid = i32::try_from(child.id()).context("pid")?;
    let supervisor = Proc::of(pid, &format!("supervisor of {}", node.name))
        .with_context(|| format!("the supervisor of {} ended at once", node.name))?;
    let qemu = wait_started(
        &mut child,
        &node.dir.join(vm::PID_FILE),
        &format!("qemu of {}", node.name),
        &log,
    )?;
    let qemu_pid = qemu.pid;
    if let Some(n) = cluster.node_mut(&node.name) {
        n.supervisor = Some(supervisor);
        n.init = Some(qemu);
        n.api_port = Some(api_port);
    }
    cluster.save()?;
    progress.say(format_args!(
        "{}: VM (qemu pid {qemu_pid}, {} MiB, {} CPU(s), {}), {} on {}, API on 127.0.0.1:{api_port}, console {}",
        node.name,
        args.memory,
        args.cpus,
        match args.accel {
            vm::Accel::Tcg => "tcg",
            vm::Accel::Kvm => "kvm",
        },
        node.mac,
        node.veth,
        node.console().display()
    ));
    Ok(())
}

/// Starts a node's supervisor (detached) and returns it and init, once init's PID is known.
fn launch_node(node: &Node, image: &Path, api_port: u16) -> anyhow::Result<(Proc, Proc)> {
    let args = LaunchArgs {
        hostname: node.name.clone(),
        netns: node.netns.clone(),
        image: image.to_path_buf(),
        node_dir: node.dir.clone(),
        api_port: Some(api_port),
    };
    let console = std::fs::File::create(node.console())
        .with_context(|| format!("cannot create {}", node.console().display()))?;
    let mut child = args
        .supervise_command()?
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("cannot start the node's supervisor")?;
    let pid = i32::try_from(child.id()).context("pid")?;
    let supervisor = Proc::of(pid, &format!("supervisor of {}", node.name))
        .with_context(|| format!("the supervisor of {} ended at once", node.name))?;
    let init = wait_started(
        &mut child,
        &node.dir.join(launch::INIT_PID_FILE),
        &format!("init of {}", node.name),
        &node.console(),
    )?;
    Ok((supervisor, init))
}

/// Waits up to 10 s for the process a node's supervisor (`child`) started and wrote to
/// `pid_file` (init, or a VM's qemu); fails with the tail of `log` if the supervisor ends first.
fn wait_started(
    child: &mut std::process::Child,
    pid_file: &Path,
    what: &str,
    log: &Path,
) -> anyhow::Result<Proc> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(pid_file) {
            if let Ok(pid) = text.trim().parse::<i32>() {
                if let Some(p) = Proc::of(pid, what) {
                    return Ok(p);
                }
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!("{what} did not start ({status}):\n{}", tail(log, 20));
        }
        if Instant::now() > deadline {
            anyhow::bail!("{what} did not start within 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Copies a directory tree: directories, files, symlinks, with modes and owners.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = from.symlink_metadata()?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
    } else if ft.is_dir() {
        std::fs::create_dir(to)?;
        let mut entries: Vec<_> = std::fs::read_dir(from)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
        std::fs::set_permissions(to, meta.permissions())?;
    } else if ft.is_file() {
        std::fs::copy(from, to)?;
    } else {
        return Ok(());
    }
    std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()))
}

/// What a node is doing, as seen from the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// init is not running.
    Stopped,
    /// init runs; not every daemon is ready yet.
    Booting,
    /// init runs; the node has no DHCP address yet, or (a VM) its system volumes are not
    /// mounted yet or a daemon is not ready.
    Running,
    /// Every daemon is ready and the node has its address (a VM: and its system volumes).
    Ready,
}

impl NodeState {
    fn as_str(self) -> &'static str {
        match self {
            NodeState::Stopped => "stopped",
            NodeState::Booting => "booting",
            NodeState::Running => "running",
            NodeState::Ready => "ready",
        }
    }
}

/// The names of the daemons of a manifest.
fn manifest_daemons(text: &str) -> Vec<String> {
    serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("daemons")?.as_sequence().map(|s| {
                s.iter()
                    .filter_map(|d| d.get("name")?.as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// The cluster's own talosconfig, in its directory: the credentials `create` made, with which
/// the states of VM nodes are read through their apid.
pub const OWN_TALOSCONFIG: &str = "talosconfig";

/// The node's state: init alive, every daemon of the manifest healthy, its address observed.
pub async fn node_state(cluster: &Cluster, node: &Node) -> NodeState {
    if node.is_vm() {
        return vm_state(cluster, node).await;
    }
    let (Some(init_sock), Some(state_sock)) = (
        node.path_in_node(crate::services::DEFAULT_INIT_SOCKET),
        node.path_in_node(crate::DEFAULT_SOCKET),
    ) else {
        return NodeState::Stopped;
    };
    let daemons = manifest_daemons(
        &std::fs::read_to_string(
            cluster
                .dir
                .join("image")
                .join(launch::NODE_MANIFEST.trim_start_matches('/')),
        )
        .unwrap_or_default(),
    );
    let Ok(mut client) = crate::services::connect(&init_sock) else {
        return NodeState::Booting;
    };
    let list = tokio::time::timeout(
        Duration::from_secs(2),
        client.list(proto::init::ListRequest {}),
    )
    .await;
    let Ok(Ok(list)) = list else {
        return NodeState::Booting;
    };
    let services = list.into_inner().services;
    let all_healthy = !daemons.is_empty()
        && daemons.iter().all(|d| {
            services
                .iter()
                .any(|s| &s.id == d && s.healthy && s.pid != 0)
        });
    if !all_healthy {
        return NodeState::Booting;
    }
    let Ok(state) = cosi::Client::new(&state_sock) else {
        return NodeState::Running;
    };
    let id = format!("eth0/{}/{}", node.ip, node.prefix);
    match tokio::time::timeout(
        Duration::from_secs(2),
        state.get("network", AddressStatusSpec::TYPE, &id),
    )
    .await
    {
        Ok(Ok(_)) => NodeState::Ready,
        _ => NodeState::Running,
    }
}

/// A VM node's state, through its published apid: qemu runs (booting); apid answers over the
/// node's own address (so the node has its DHCP address), its system volumes are mounted and
/// every daemon of the manifest is healthy (ready), or not yet (running).
async fn vm_state(cluster: &Cluster, node: &Node) -> NodeState {
    if node.current_init().is_none() {
        return NodeState::Stopped;
    }
    let Some(port) = node.api_port else {
        return NodeState::Booting;
    };
    let Ok(tc) = TalosConfig::load(&cluster.dir.join(OWN_TALOSCONFIG)) else {
        return NodeState::Booting;
    };
    let Some(ctx) = tc.contexts.get(&cluster.name) else {
        return NodeState::Booting;
    };
    let Ok(config) = crate::api::client_config(&cluster.name, &ctx.ca, &ctx.crt, &ctx.key) else {
        return NodeState::Booting;
    };
    let daemons = manifest_daemons(
        &std::fs::read_to_string(
            cluster
                .dir
                .join("image")
                .join(launch::NODE_MANIFEST.trim_start_matches('/')),
        )
        .unwrap_or_default(),
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(channel) = machinery::tls::channel(
        addr,
        "127.0.0.1",
        std::sync::Arc::new(config),
        Duration::from_secs(2),
    ) else {
        return NodeState::Booting;
    };
    // Its system volumes first (every VM `create` makes has a disk of at least 2200 MiB for
    // them): on a first boot init mounts EPHEMERAL once blockd formatted it, after every daemon
    // was ready, and restarts the daemons that keep files under /var before it publishes the
    // mount. Read in this order, "mounted, then every daemon healthy" cannot see a daemon about
    // to restart (a CI run saw k8sd restarted just after `create`).
    let state = cosi::Client::over(channel.clone(), format!("the Talos API of {}", node.name));
    for volume in SYSTEM_VOLUMES {
        let mounted = tokio::time::timeout(
            Duration::from_secs(3),
            state.get(
                machinery::resources::runtime::NAMESPACE,
                MountStatusSpec::TYPE,
                volume,
            ),
        )
        .await;
        match mounted {
            Ok(Ok(_)) => {}
            // apid answers: the node runs, its volume is not mounted yet.
            Ok(Err(e)) if e.kind() == cosi::ErrorKind::NotFound => return NodeState::Running,
            _ => return NodeState::Booting,
        }
    }
    let mut api = proto::machine::machine_service_client::MachineServiceClient::new(channel);
    let Ok(Ok(list)) = tokio::time::timeout(Duration::from_secs(3), api.service_list(())).await
    else {
        return NodeState::Booting;
    };
    let services: Vec<proto::machine::ServiceInfo> = list
        .into_inner()
        .messages
        .into_iter()
        .flat_map(|m| m.services)
        .collect();
    let healthy = |d: &String| {
        services
            .iter()
            .any(|s| &s.id == d && s.health.as_ref().is_some_and(|h| h.healthy))
    };
    if !daemons.is_empty() && daemons.iter().all(healthy) {
        NodeState::Ready
    } else {
        NodeState::Running
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Waits until every node's apid answers Version through its published port with the
/// talosconfig's credentials (`client`): what `talosctl version` will do. A worker's apid
/// answers once the first control plane's trustd signed its certificate.
fn wait_api(
    cluster: &Cluster,
    ca: &str,
    client: &machinery::secrets::CertAndKey,
    timeout: Duration,
    progress: &Progress,
) -> anyhow::Result<()> {
    let config = std::sync::Arc::new(crate::api::client_config(
        &cluster.name,
        ca,
        &client.crt,
        &client.key,
    )?);
    let rt = runtime()?;
    let deadline = Instant::now() + timeout;
    for n in &cluster.nodes {
        let Some(port) = n.api_port else { continue };
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let last = loop {
            let attempt = rt.block_on(async {
                let channel = machinery::tls::channel(
                    addr,
                    "127.0.0.1",
                    config.clone(),
                    Duration::from_secs(2),
                )?;
                let mut api =
                    proto::machine::machine_service_client::MachineServiceClient::new(channel);
                anyhow::Ok(
                    match tokio::time::timeout(Duration::from_secs(5), api.version(())).await {
                        Ok(Ok(_)) => None,
                        Ok(Err(status)) => Some(status.to_string()),
                        Err(_) => Some("no answer within 5 s".to_string()),
                    },
                )
            })?;
            let Some(err) = attempt else { break None };
            if Instant::now() > deadline {
                break Some(err);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if let Some(err) = last {
            anyhow::bail!(
                "{}: apid does not answer on 127.0.0.1:{port} ({err})\nthe console of {} ({}):\n{}",
                n.name,
                n.name,
                n.console().display(),
                tail(&n.console(), 15)
            );
        }
        progress.say(format_args!("{}: apid answers on 127.0.0.1:{port}", n.name));
    }
    Ok(())
}

/// Waits until every node is ready; fails early when a node's init ends.
fn wait_ready(cluster: &Cluster, timeout: Duration, progress: &Progress) -> anyhow::Result<()> {
    let rt = runtime()?;
    let deadline = Instant::now() + timeout;
    let mut states: Vec<NodeState> = vec![NodeState::Booting; cluster.nodes.len()];
    loop {
        for (i, node) in cluster.nodes.iter().enumerate() {
            if states[i] == NodeState::Ready {
                continue;
            }
            let s = rt.block_on(node_state(cluster, node));
            if s == NodeState::Stopped {
                anyhow::bail!(
                    "{}: init ended; its console ({}):\n{}",
                    node.name,
                    node.console().display(),
                    tail(&node.console(), 30)
                );
            }
            if s != states[i] {
                progress.say(format_args!("{}: {}", node.name, s.as_str()));
                states[i] = s;
            }
        }
        if states.iter().all(|s| *s == NodeState::Ready) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let waiting: Vec<&Node> = cluster
                .nodes
                .iter()
                .zip(&states)
                .filter(|(_, s)| **s != NodeState::Ready)
                .map(|(n, _)| n)
                .collect();
            let mut msg = format!(
                "nodes not ready after {} s: {}",
                timeout.as_secs(),
                waiting
                    .iter()
                    .zip(states.iter().filter(|s| **s != NodeState::Ready))
                    .map(|(n, s)| format!("{} {}", n.name, s.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Some(n) = waiting.first() {
                msg.push_str(&format!(
                    "\nthe console of {} ({}):\n{}",
                    n.name,
                    n.console().display(),
                    tail(&n.console(), 15)
                ));
            }
            anyhow::bail!(msg);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The rows of the node table; `details` adds init's PID and the namespace.
fn table_rows(cluster: &Cluster, details: bool) -> Vec<Vec<String>> {
    let rt = runtime().ok();
    let mut header = vec!["NAME", "ROLE", "IP", "API", "STATE"];
    if details {
        header.extend(["INIT PID", "NETNS"]);
    }
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for n in &cluster.nodes {
        let state = rt
            .as_ref()
            .map(|rt| rt.block_on(node_state(cluster, n)))
            .unwrap_or(NodeState::Stopped);
        let mut row = vec![
            n.name.clone(),
            n.role.as_str().to_string(),
            n.ip.clone(),
            n.api_port
                .map(|p| format!("127.0.0.1:{p}"))
                .unwrap_or_else(|| "-".into()),
            state.as_str().to_string(),
        ];
        if details {
            row.push(
                n.current_init()
                    .map(|p| p.pid.to_string())
                    .unwrap_or_else(|| "-".into()),
            );
            row.push(n.netns.clone());
        }
        rows.push(row);
    }
    rows
}

/// `cluster show`.
fn show(args: &ShowArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let (_, dir) = args.which.dirs()?;
    if !dir.exists() {
        anyhow::bail!(
            "no cluster {:?} ({} does not exist)",
            args.which.name,
            dir.display()
        );
    }
    let cluster = Cluster::load(&dir)?;
    match args.output {
        ShowFormat::Table => {
            writeln!(
                out,
                "cluster {} — network {} on {} in netns {}, dnsmasq pid {}, state {}\n",
                cluster.name,
                cluster.cidr,
                cluster.bridge,
                cluster.netns,
                cluster
                    .dnsmasq
                    .as_ref()
                    .filter(|p| p.alive())
                    .map(|p| p.pid.to_string())
                    .unwrap_or_else(|| "-".into()),
                cluster.dir.display()
            )?;
            crate::services::table(out, &table_rows(&cluster, true))?;
        }
        ShowFormat::Json => {
            let rt = runtime()?;
            let nodes: Vec<serde_json::Value> = cluster
                .nodes
                .iter()
                .map(|n| {
                    let alive = |p: &Option<Proc>| p.as_ref().filter(|p| p.alive()).map(|p| p.pid);
                    serde_json::json!({
                        "name": n.name,
                        "role": n.role.as_str(),
                        "ip": n.ip,
                        "prefix": n.prefix,
                        "mac": n.mac,
                        "api": n.api_port.map(|p| format!("127.0.0.1:{p}")),
                        "state": rt.block_on(node_state(&cluster, n)).as_str(),
                        "initPid": alive(&n.current_init()),
                        "supervisorPid": alive(&n.supervisor),
                        "netns": n.netns,
                        "dir": n.dir,
                    })
                })
                .collect();
            let doc = serde_json::json!({
                "name": cluster.name,
                "dir": cluster.dir,
                "cidr": cluster.cidr,
                "gateway": cluster.gateway,
                "netns": cluster.netns,
                "bridge": cluster.bridge,
                "dnsmasqPid": cluster.dnsmasq.as_ref().filter(|p| p.alive()).map(|p| p.pid),
                "nodes": nodes,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
    }
    Ok(())
}

/// `cluster destroy`.
fn destroy(args: &DestroyArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    require_root()?;
    let progress = Progress(Instant::now());
    let (_, dir) = args.which.dirs()?;
    if !dir.exists() {
        anyhow::bail!(
            "no cluster {:?} ({} does not exist)",
            args.which.name,
            dir.display()
        );
    }
    let mut cluster = Cluster::load(&dir).with_context(|| {
        format!(
            "{} has no cluster record: not removing a directory talosctl did not make",
            dir.display()
        )
    })?;
    progress.say(format_args!("destroying cluster {:?}", cluster.name));
    remove_all(&mut cluster, &progress)?;
    writeln!(out, "destroyed cluster {}", cluster.name)?;
    Ok(())
}

/// Stops a group of nodes together: SIGTERM to every init (each stops its daemons in reverse
/// dependency order), SIGKILL to those still running after a grace period; then their
/// supervisors.
fn stop_nodes(nodes: &[&Node], progress: &Progress) {
    let started = Instant::now();
    let inits: Vec<(&Node, Proc)> = nodes
        .iter()
        .filter_map(|n| Some((*n, n.current_init()?)))
        .collect();
    for (_, init) in &inits {
        init.signal(nix::sys::signal::Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for (node, init) in &inits {
        let left = deadline.saturating_duration_since(Instant::now());
        if !init.wait_gone(left) {
            progress.say(format_args!(
                "{}: init did not stop in 30 s: killing it",
                node.name
            ));
            init.signal(nix::sys::signal::Signal::SIGKILL);
            init.wait_gone(Duration::from_secs(5));
        }
    }
    for node in nodes {
        if let Some(sup) = node.supervisor.as_ref().filter(|p| p.alive()) {
            if !sup.wait_gone(Duration::from_secs(5)) {
                sup.signal(nix::sys::signal::Signal::SIGKILL);
                sup.wait_gone(Duration::from_secs(5));
            }
        }
        progress.say(format_args!(
            "{}: stopped ({:.2} s)",
            node.name,
            started.elapsed().as_secs_f64()
        ));
    }
}

/// Removes everything the journal holds, nodes first (workers, then control planes), then every other object in reverse order of creation. Objects that could not be
/// removed stay in the record (and the directory stays), so that destroy can run again.
fn remove_all(cluster: &mut Cluster, progress: &Progress) -> anyhow::Result<()> {
    // Workers first, then control planes; the nodes of one role stop together.
    for role in [Role::Worker, Role::Controlplane] {
        let group: Vec<Node> = cluster
            .nodes
            .iter()
            .filter(|n| n.role == role)
            .filter(|n| {
                cluster.objects.contains(&Object::Node {
                    name: n.name.clone(),
                })
            })
            .cloned()
            .collect();
        if group.is_empty() {
            continue;
        }
        stop_nodes(&group.iter().collect::<Vec<_>>(), progress);
        cluster.objects.retain(
            |o| !matches!(o, Object::Node { name } if group.iter().any(|n| &n.name == name)),
        );
        let _ = cluster.save();
    }
    let mut errors = Vec::new();
    let objects = cluster.objects.clone();
    for object in objects.iter().rev() {
        let result = match object {
            Object::Node { name } => {
                if let Some(n) = cluster.node(name).cloned() {
                    stop_nodes(&[&n], progress);
                }
                Ok(())
            }
            Object::Process { proc } => {
                proc.signal(nix::sys::signal::Signal::SIGTERM);
                if !proc.wait_gone(Duration::from_secs(5)) {
                    proc.signal(nix::sys::signal::Signal::SIGKILL);
                    proc.wait_gone(Duration::from_secs(5));
                }
                progress.say(format_args!("stopped {} (pid {})", proc.what, proc.pid));
                Ok(())
            }
            Object::Link { netns, name } => net::link_del(netns, name),
            Object::Netns { name } => net::netns_del(name).map(|()| {
                progress.say(format_args!("removed network namespace {name}"));
            }),
            Object::Context {
                talosconfig,
                name,
                created_file,
            } => remove_context(talosconfig, name, *created_file, &cluster.dir).map(|()| {
                progress.say(format_args!(
                    "removed context {name:?} from {}",
                    talosconfig.display()
                ));
            }),
            Object::Dir { path } => {
                if errors.is_empty() {
                    match std::fs::remove_dir_all(path) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            Err(anyhow::Error::new(e)
                                .context(format!("cannot remove {}", path.display())))
                        }
                        _ => {
                            progress.say(format_args!("removed {}", path.display()));
                            Ok(())
                        }
                    }
                } else {
                    Err(anyhow::anyhow!(
                        "kept {} (and its record) because of the errors above",
                        path.display()
                    ))
                }
            }
        };
        match result {
            Ok(()) => {
                cluster.objects.retain(|o| o != object);
                if !matches!(object, Object::Dir { .. }) {
                    let _ = cluster.save();
                }
            }
            Err(e) => {
                progress.say(format_args!("{}", cosi::error::Chain(e.as_ref())));
                errors.push(e);
            }
        }
    }
    match errors.len() {
        0 => Ok(()),
        n => anyhow::bail!(
            "{n} object(s) of cluster {} could not be removed",
            cluster.name
        ),
    }
}

/// Removes a context this cluster added to a talosconfig (only if it still points at this
/// cluster), and the file when create made it and nothing else is left in it.
fn remove_context(path: &Path, name: &str, created_file: bool, dir: &Path) -> anyhow::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let mut tc = TalosConfig::load(path)?;
    let ours = tc
        .contexts
        .get(name)
        .is_some_and(|c| c.local_cluster.as_deref() == Some(dir));
    if !ours {
        return Ok(());
    }
    tc.remove(name);
    if created_file && tc.contexts.is_empty() && tc.other.is_empty() {
        std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))
    } else {
        tc.save(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        assert!(check_name("demo").is_ok());
        assert!(check_name("talos-default").is_ok());
        for bad in ["", "Demo", "1x", "x-", "a_b", &"x".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_for_overlay_options_are_checked() {
        assert!(check_path(Path::new("/root/.talos/clusters/x")).is_ok());
        assert!(check_path(Path::new("/tmp/a,b")).is_err());
        assert!(check_path(Path::new("/tmp/a:b")).is_err());
        assert!(check_path(Path::new("relative")).is_err());
    }

    #[test]
    fn the_manifest_names_its_daemons() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../rootfs/etc/daemons.yaml"
        ))
        .unwrap();
        let names = manifest_daemons(&text);
        assert!(names.contains(&"stated".to_string()));
        assert!(names.contains(&"networkd".to_string()));
    }
}
