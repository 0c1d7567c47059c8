//! init: the only process of a talos-rs node that creates processes.
//!
//! It starts the broker (`stated`) first, seeds the `config` namespace, then every daemon of
//! the manifest in dependency order, each in its sandbox (own uid, capabilities, landlock,
//! seccomp), each ready when it says so on its notification fd; it restarts them with backoff,
//! runs the services daemons ask for within their envelopes, publishes what it sees to stated
//! (`runtime`: `ServiceStatus`, `DaemonSecurity`, `MachineStatus`, `KernelCmdline`), answers
//! the control socket, and as PID 1 mounts the early filesystems, reaps zombies and ends the
//! machine.
//!
//! - [`manifest`]: the daemon manifest and its checks; [`profiles`]: the compiled-in seccomp
//!   profiles;
//! - [`supervisor`]: units, restarts, readiness, stop; [`reaper`]: the one `waitpid`;
//!   [`logs`]: output ring buffers;
//! - [`services`]: requested services and envelopes; [`security`]: the observed sandbox;
//! - [`volumes`]: the system volumes init mounts; [`devices`]: who may open block devices;
//! - [`controllers`]: init's reconcile loops on the controller runtime (statuses in stated,
//!   requested services, the node's hostname); [`control`]: the control socket; [`pid1`]:
//!   mounts, mode, power; [`hostname`]: setting the node's hostname;
//!   [`testing`]: a real node in namespaces for tests.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod acquire;
pub mod apply;
pub mod control;
pub mod controllers;
pub mod devices;
pub mod hostname;
pub mod kmod;
pub mod kmsg;
pub mod logs;
pub mod manifest;
pub mod mounts;
pub mod pid1;
pub mod profiles;
pub mod reaper;
pub mod security;
pub mod services;
pub mod supervisor;
#[cfg(feature = "testing")]
pub mod testing;
pub mod volumes;

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cosi::{Query, Resource, ResourceSpec};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG_NS};
use machinery::resources::runtime::{MachineStage, MachineStatusSpec, UnitKind};
use tokio::sync::{mpsc, watch};

pub use manifest::{Manifest, Paths};
pub use pid1::{Mode, PowerAction};

/// The manifest of the image, compiled in; `--manifest` replaces it.
pub const DEFAULT_MANIFEST: &str = include_str!("../../rootfs/etc/daemons.yaml");

/// Where the control socket is, under the node root.
pub const CONTROL_SOCKET: &str = "/run/init/init.sock";

/// How to run init.
#[derive(Clone, Debug)]
pub struct Config {
    /// VM, container or development.
    pub mode: Mode,
    /// Where the templates of the manifest point.
    pub paths: Paths,
    /// The manifest.
    pub manifest: Manifest,
    /// A machine configuration file to seed `config` with when it is empty.
    pub config_file: Option<PathBuf>,
    /// The kernel command line (published; `talos.config=` is read from it).
    pub cmdline: String,
    /// Development mode: init owns its UTS namespace (it runs under `unshare --uts`) and sets
    /// the node's hostname, as it always does in the other modes ([`hostname::may_set`]).
    pub own_uts: bool,
}

/// Errors that stop init before it supervises anything.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A directory or file of the node tree cannot be prepared.
    #[error("cannot prepare {path:?}")]
    Prepare {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The control socket cannot be bound.
    #[error("cannot listen on the control socket {path:?}")]
    Control {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The manifest has no broker (validation should have caught it).
    #[error("the manifest has no broker")]
    NoBroker,
}

fn prepare_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Prepare {
        path: path.to_path_buf(),
        source,
    }
}

/// The talos.config= argument of a kernel command line.
pub fn cmdline_config(cmdline: &str) -> Option<&str> {
    cmdline
        .split_whitespace()
        .find_map(|a| a.strip_prefix("talos.config="))
}

/// Runs the node until a power request or signal, then stops everything in reverse dependency
/// order and returns what to do with the machine.
pub async fn run(config: Config) -> Result<PowerAction, Error> {
    let paths = &config.paths;
    let manifest = Arc::new(config.manifest.clone());
    let init_dir = paths.node("/run/init");
    std::fs::create_dir_all(&init_dir).map_err(prepare_error(&init_dir))?;
    std::fs::set_permissions(&init_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(prepare_error(&init_dir))?;
    let profiles_dir = init_dir.join("seccomp");
    profiles::install(&profiles_dir).map_err(prepare_error(&profiles_dir))?;
    let manifest_file = init_dir.join("daemons.yaml");
    write_readonly(&manifest_file, &manifest.text).map_err(prepare_error(&manifest_file))?;

    // A VM's STATE (stated's durable namespaces) before the daemons' directories are made.
    // What it mounts is protected before any daemon starts.
    if config.mode == Mode::Vm && paths.root == Path::new("/") {
        let devices = devices::DeviceAccess::node(blockd_of(&manifest));
        let _ = tokio::task::spawn_blocking(move || volumes::mount_state_early(&devices)).await;
    }
    let mut held: Vec<(String, Arc<OwnedFd>)> = Vec::new();
    for d in &manifest.daemons {
        for dir in &d.dirs {
            make_dir(&dir.path, &dir.mode, d.uid, dir.group.unwrap_or(d.gid))
                .map_err(prepare_error(&dir.path))?;
        }
        if let Some(l) = &d.listen {
            let fd = bind_held(&l.path).map_err(prepare_error(&l.path))?;
            held.push((d.name.clone(), Arc::new(fd)));
        }
    }

    // Outside PID 1, orphans of the daemons come to init all the same, to be reaped.
    if config.mode == Mode::Dev {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!(error = %e, "cannot become a subreaper: orphans go to PID 1");
        }
    }
    let reaper = reaper::Reaper::new();
    tokio::spawn(reaper.clone().run());
    let supervisor = supervisor::Supervisor::new(reaper);

    let (power_tx, mut power_rx) = mpsc::unbounded_channel();
    let control_path = paths.node(CONTROL_SOCKET);
    let delegate = manifest.init_control();
    let listener =
        control::bind(&control_path, delegate.map(|d| d.gid)).map_err(|source| Error::Control {
            path: control_path.clone(),
            source,
        })?;
    let (machine_tx, _) = watch::channel(MachineStatusSpec {
        stage: MachineStage::Booting,
        mode: config.mode.as_str().to_string(),
        ..Default::default()
    });
    let validation = match config.mode {
        Mode::Vm => machinery::config::ValidationMode::Metal,
        _ => machinery::config::ValidationMode::Container,
    };
    let applier = match manifest.broker().map(broker_socket) {
        Some(socket) => match cosi::Client::new(&socket) {
            Ok(c) => Some(apply::Applier::new(c, validation, machine_tx.clone())),
            Err(e) => {
                tracing::error!(error = %e, "no client for stated: configurations cannot be applied");
                None
            }
        },
        None => None,
    };
    let control = control::Control::new(
        supervisor.clone(),
        power_tx.clone(),
        delegate.map(|d| (d.name.clone(), d.uid)),
        applier.clone(),
    );
    tokio::spawn(async move {
        if let Err(e) = control::serve(listener, control).await {
            tracing::error!(error = %cosi::error::Chain(&e), "control socket failed");
        }
    });

    let order = manifest.start_order().unwrap_or_default();
    let boot = tokio::spawn(boot(
        config.clone(),
        manifest.clone(),
        supervisor.clone(),
        held,
        profiles_dir,
        machine_tx.clone(),
        applier,
    ));

    let action = wait_for_power(config.mode, &mut power_rx).await;
    tracing::info!(?action, "shutting down");
    machine_tx.send_modify(|m| {
        m.stage = match action {
            PowerAction::PowerOff => MachineStage::ShuttingDown,
            PowerAction::Reboot => MachineStage::Rebooting,
        }
    });
    boot.abort();
    supervisor.begin_shutdown();
    let services: Vec<String> = supervisor
        .units()
        .iter()
        .filter(|u| u.snapshot().kind == UnitKind::Service)
        .map(|u| u.id.clone())
        .collect();
    futures::future::join_all(services.iter().map(|id| supervisor.stop(id))).await;
    let reverse: Vec<String> = order.into_iter().rev().collect();
    supervisor.stop_in_order(&reverse).await;
    let _ = std::fs::remove_file(&control_path);
    Ok(action)
}

/// Waits for a power request on the control socket or a signal: SIGTERM and SIGPWR power off,
/// SIGINT (ctrl-alt-del as a VM's PID 1) reboots; outside a VM every signal just ends the node.
async fn wait_for_power(
    mode: Mode,
    power: &mut mpsc::UnboundedReceiver<PowerAction>,
) -> PowerAction {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut pwr)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::from_raw(nix::libc::SIGPWR)),
    ) else {
        tracing::error!("cannot watch signals: only the control socket can end the node");
        return power.recv().await.unwrap_or(PowerAction::PowerOff);
    };
    tokio::select! {
        a = power.recv() => a.unwrap_or(PowerAction::PowerOff),
        _ = term.recv() => PowerAction::PowerOff,
        _ = pwr.recv() => PowerAction::PowerOff,
        _ = int.recv() => if mode == Mode::Vm { PowerAction::Reboot } else { PowerAction::PowerOff },
    }
}

/// The boot sequence: the broker, the config seed, the publisher and requested services, then
/// every other daemon (each waits for its dependencies itself).
async fn boot(
    config: Config,
    manifest: Arc<Manifest>,
    supervisor: Arc<supervisor::Supervisor>,
    held: Vec<(String, Arc<OwnedFd>)>,
    profiles_dir: PathBuf,
    machine_tx: watch::Sender<MachineStatusSpec>,
    applier: Option<Arc<apply::Applier>>,
) {
    let Ok(order) = manifest.start_order() else {
        return;
    };
    let Some(broker) = manifest.broker() else {
        tracing::error!("{}", Error::NoBroker);
        return;
    };
    let mut daemons = Vec::new();
    for name in &order {
        let Some(d) = manifest.daemon(name) else {
            continue;
        };
        let listen = held
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, fd)| fd.clone());
        match launch_of(&manifest, d, &profiles_dir, listen) {
            Ok(l) => daemons.push((d, l)),
            Err(e) => tracing::error!(daemon = %name, error = %e, "cannot build its sandbox"),
        }
    }
    let socket = broker_socket(broker);
    let client = match cosi::Client::new(&socket) {
        Ok(c) => c.with_read_retry(Duration::from_secs(5)),
        Err(e) => {
            tracing::error!(error = %e, "no client for stated");
            return;
        }
    };

    // The broker first, alone.
    let mut rest = Vec::new();
    for (d, launch) in daemons {
        if d.broker {
            let unit = supervisor
                .add(&d.name, UnitKind::Daemon, "", launch, vec![], true)
                .await;
            let mut rx = unit.status.subscribe();
            let _ = rx.wait_for(|s| s.healthy).await;
        } else {
            rest.push((d, launch));
        }
    }
    define_types(&client).await;
    seed_config(&client, &config).await;
    if let Some(a) = &applier {
        a.boot().await;
    }
    // init's own reconcile loops run as controllers on the shared runtime, so that the node's
    // dependency graph (`talosctl inspect dependencies`) shows them.
    let mut runtime = cosi::Runtime::new(client.clone())
        .publish_graph(machinery::resources::runtime::NAMESPACE, "init");
    let register = |r: Result<(), cosi::runtime::RuntimeError>| {
        if let Err(e) = r {
            tracing::error!(error = %cosi::error::Chain(&e), "cannot register a controller");
        }
    };
    register(runtime.register(controllers::StatusController {
        supervisor: supervisor.clone(),
        machine: machine_tx.subscribe(),
        daemons: order.clone(),
        cmdline: config.cmdline.clone(),
        forwarding: false,
        ready_logged: false,
    }));
    // Kernel modules: specs always (they say what the configuration asks for), loading and
    // the loaded list only as a VM's PID 1 (a container-mode node shares the host's kernel).
    let vm = config.mode == Mode::Vm;
    // A VM's block devices: blockd's, but for the system volumes' (no daemon's, and no
    // service may reach them).
    let devices = vm.then(|| Arc::new(devices::DeviceAccess::node(blockd_of(&manifest))));
    let services = controllers::ServiceSpecController::new(
        supervisor.clone(),
        &manifest.daemons,
        profiles_dir.clone(),
    );
    register(runtime.register(match &devices {
        Some(d) => services.protecting(d.clone()),
        None => services,
    }));
    let boot_modules = if vm {
        controllers::KernelModuleConfigController::boot_modules(std::path::Path::new(
            "/usr/lib/modules-load.d",
        ))
    } else {
        Vec::new()
    };
    let first = boot_modules.iter().map(|(n, _)| n.clone()).collect();
    register(runtime.register(controllers::KernelModuleConfigController { boot: boot_modules }));
    if let Some(devices) = &devices {
        register(runtime.register(controllers::BlockDeviceAccessController {
            devices: devices.clone(),
            supervisor: Some(supervisor.clone()),
        }));
        register(runtime.register(volumes::SystemVolumeMountController {
            applier: applier.clone(),
            supervisor: supervisor.clone(),
            broker: broker.name.clone(),
            manifest: manifest.clone(),
            devices: Some(devices.clone()),
            said: Default::default(),
        }));
        register(runtime.register(controllers::KernelModuleSpecController::new(first)));
        register(runtime.register(controllers::LoadedKernelModuleController));
    }
    // talos.config=http://…: fetched once the network is up (a file path was seeded above).
    if let (Some(url), Some(applier)) = (
        cmdline_config(&config.cmdline).filter(|u| acquire::is_url(u)),
        &applier,
    ) {
        register(runtime.register(acquire::AcquireController::new(
            url.to_string(),
            applier.clone(),
        )));
    }
    let redacted = machinery::resources::config::REDACTED_NAMESPACE;
    if manifest.namespaces.iter().any(|n| n.name == redacted) {
        register(runtime.register(controllers::RedactController::new(controllers::Redact)));
    }
    register(runtime.register(controllers::MachineTypeController::new(
        controllers::MachineTypeOf,
    )));
    let network = machinery::resources::network::NAMESPACE;
    if manifest.namespaces.iter().any(|n| n.name == network) {
        match hostname::may_set(config.mode, config.own_uts) {
            Ok(()) => register(runtime.register(controllers::HostnameController)),
            Err(why) => tracing::info!("not setting the node's hostname: {why}"),
        }
    }
    tokio::spawn(async move {
        if let Err(e) = runtime.run(std::future::pending::<()>()).await {
            tracing::error!(error = %cosi::error::Chain(&e), "init's controller runtime failed");
        }
    });
    for (d, launch) in rest {
        let deps = manifest.dependencies(d);
        supervisor
            .add(&d.name, UnitKind::Daemon, "", launch, deps, true)
            .await;
    }
    // Without a configuration the node waits in maintenance (apid serves the maintenance API)
    // until one is applied.
    match &applier {
        Some(a) => a.settle().await,
        None => machine_tx.send_modify(|m| m.stage = MachineStage::Running),
    }
    tracing::info!(daemons = order.len(), "every daemon is started");
}

/// Defines the types of the namespaces init writes (`runtime`, and `config`, which it seeds),
/// before any other daemon runs: their names are then taken, and stated refuses any daemon a
/// definition that reuses them (so nothing can make `talosctl get machineconfig` resolve to a
/// planted type). Retried while stated does not answer.
async fn define_types(client: &cosi::Client) {
    let mut defs = vec![
        MachineConfigSpec::definition(),
        machinery::resources::config::MachineTypeSpec::definition(),
    ];
    defs.extend(machinery::resources::runtime::definitions());
    if let Err(e) = client.define_types_retrying(&defs, "init").await {
        tracing::error!(error = %e, "cannot define the runtime and config types");
    }
}

/// blockd's name and gid, if the manifest has it.
fn blockd_of(manifest: &Manifest) -> Option<(String, u32)> {
    manifest.daemon("blockd").map(|d| (d.name.clone(), d.gid))
}

/// stated's socket: the held listening socket's path, or the `--socket` argument.
fn broker_socket(broker: &manifest::Daemon) -> PathBuf {
    if let Some(l) = &broker.listen {
        return l.path.clone();
    }
    broker
        .args
        .iter()
        .position(|a| a == "--socket")
        .and_then(|i| broker.args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/stated/state.sock"))
}

/// How to run a daemon of the manifest.
pub fn launch_of(
    m: &Manifest,
    d: &manifest::Daemon,
    profiles_dir: &Path,
    listen: Option<Arc<OwnedFd>>,
) -> Result<supervisor::Launch, String> {
    Ok(supervisor::Launch {
        program: d.binary.clone(),
        args: d.args.clone(),
        policy: manifest::policy(d, profiles_dir)?,
        readiness: d.readiness,
        listen,
        restart: d.restart.clone(),
        restart_always: true,
        stop_timeout: Duration::from_millis(d.stop_timeout_ms),
        ready_timeout: Duration::from_millis(d.ready_timeout_ms),
        audit: Some(security::Audit::of(m, d)),
    })
}

/// Seeds `config` with the machine configuration from `--config` or `talos.config=` when it
/// holds none yet. A configuration that does not validate is not written (the node then waits
/// for one, as Talos's maintenance mode).
async fn seed_config(client: &cosi::Client, config: &Config) {
    let source = config.config_file.clone().or_else(|| {
        cmdline_config(&config.cmdline)
            .filter(|p| !acquire::is_url(p))
            .map(|p| config.paths.node(p))
    });
    let Some(source) = source else { return };
    match client
        .list(CONFIG_NS, MachineConfigSpec::TYPE, &Query::default())
        .await
    {
        Ok(l) if !l.is_empty() => {
            tracing::info!("config already holds a machine configuration: not seeding");
            return;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "cannot read the config namespace: not seeding");
            return;
        }
    }
    let text = match std::fs::read_to_string(&source) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(path = %source.display(), error = %e, "cannot read the machine configuration");
            return;
        }
    };
    let mode = match config.mode {
        Mode::Vm => machinery::config::ValidationMode::Metal,
        _ => machinery::config::ValidationMode::Container,
    };
    let valid =
        machinery::config::Config::from_yaml(&text).and_then(|c| c.validate(mode).map(drop));
    if let Err(errors) = valid {
        for e in &errors {
            tracing::error!(path = %source.display(), "invalid machine configuration: {e}");
        }
        return;
    }
    let resource = Resource::new(CONFIG_NS, ACTIVE_ID, MachineConfigSpec(text));
    match resource.to_raw() {
        Ok(raw) => match client.create(&raw, "").await {
            Ok(_) => tracing::info!(path = %source.display(), "seeded the machine configuration"),
            Err(e) => tracing::error!(error = %e, "cannot seed the machine configuration"),
        },
        Err(e) => tracing::error!(error = %e, "cannot encode the machine configuration"),
    }
}

fn write_readonly(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o444))?;
    std::fs::rename(&tmp, path)
}

/// Makes a daemon's directory (and its parents), owned by `uid`:`gid`, with `mode` (octal).
pub(crate) fn make_dir(path: &Path, mode: &str, uid: u32, gid: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    let mode = u32::from_str_radix(mode, 8).unwrap_or(0o700);
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Binds a listening Unix socket that init holds for a daemon (mode 0666: the broker decides
/// per request from peer credentials who may do what).
fn bind_held(path: &Path) -> std::io::Result<OwnedFd> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(OwnedFd::from(listener))
}
