//! init's reconcile loops, as controllers on the shared runtime (DESIGN §3), so that
//! `talosctl inspect dependencies` shows them with what they read and write:
//!
//! - `runtime.StatusController`: the desired `ServiceStatus`, `DaemonSecurity`,
//!   `MachineStatus` and `KernelCmdline` of `runtime`, from the supervisor (woken by its
//!   changes); the runtime removes statuses of units that are gone.
//! - `runtime.ServiceSpecController`: the `ServiceSpec`s daemons with an envelope write in
//!   their namespaces, each run within the envelope or refused with every reason.
//! - `runtime.HostnameController`: network's `HostnameSpec` `hostname`, applied to the node's
//!   UTS namespace (only where init owns it).
//! - `runtime.KernelModuleConfigController`, `runtime.KernelModuleSpecController`,
//!   `runtime.LoadedKernelModuleController`: the node's kernel modules (the image's boot
//!   modules and `machine.kernel.modules`), loaded in a VM, and what the kernel has loaded.
//! - `runtime.BlockDeviceAccessController`: a VM's block device nodes given to blockd's group,
//!   except a mounted system volume's and its disk's, which are no daemon's (crate::devices).
//! - `config.RedactController`: every `MachineConfig` of `config` copied to `config-redacted`
//!   with its secrets redacted ([`machinery::config::Config::redact`]): what networkd (and
//!   every daemon but the key holders) reads, so that no key leaves `config`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use cosi::runtime::{Action, Context, Controller, Input, InputKind, Output, ReconcileError};
use cosi::{Phase, Resource, ResourceSpec};
use machinery::resources::config::MachineConfigSpec;
use machinery::resources::network::{HostnameSpecSpec, HOSTNAME_ID};
use machinery::resources::runtime::{
    DaemonSecuritySpec, KernelCmdlineSpec, KernelModuleSpecSpec, LoadedKernelModuleSpec,
    MachineStatusSpec, ServiceSpecSpec, ServiceStatusSpec, UnitKind, UnmetCondition, CMDLINE_ID,
    MACHINE_STATUS_ID, NAMESPACE,
};
use tokio::sync::watch;

use crate::devices::DeviceAccess;
use crate::manifest::Daemon;
use crate::services::Envelopes;
use crate::supervisor::Supervisor;

/// How often the controllers whose sources are outside stated reconcile without a wake-up
/// (level triggered: a missed wake-up, or a hostname changed behind init's back, is repaired).
pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(30);

/// Publishes what the supervisor knows.
pub struct StatusController {
    /// The units.
    pub supervisor: Arc<Supervisor>,
    /// The machine's status, set by the boot sequence.
    pub machine: watch::Receiver<MachineStatusSpec>,
    /// The daemons (the machine is ready when they all are).
    pub daemons: Vec<String>,
    /// The kernel command line.
    pub cmdline: String,
    /// Whether the task that turns the supervisor's changes into wake-ups runs.
    pub forwarding: bool,
    /// Whether the first time every daemon was ready has been logged (with the time since
    /// the kernel started: a VM's boot time, read against the kernel's own log).
    pub ready_logged: bool,
}

impl Controller for StatusController {
    fn name(&self) -> &'static str {
        "runtime.StatusController"
    }

    fn inputs(&self) -> Vec<Input> {
        Vec::new()
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<ServiceStatusSpec>(),
            Output::exclusive::<DaemonSecuritySpec>(),
            Output::exclusive::<MachineStatusSpec>(),
            Output::exclusive::<KernelCmdlineSpec>(),
        ]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        if !self.forwarding {
            self.forwarding = true;
            let waker = ctx.waker();
            let changed = self.supervisor.changed.clone();
            let mut machine = self.machine.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = changed.notified() => {}
                        r = machine.changed() => if r.is_err() { return },
                    }
                    if !waker.wake() {
                        return;
                    }
                }
            });
        }
        // Readiness first (from the supervisor's snapshots), then every status in one batch
        // call per type: one round trip each instead of one per unit.
        let mut unmet = Vec::new();
        let mut statuses = Vec::new();
        let mut security = Vec::new();
        for unit in self.supervisor.units() {
            let status = unit.snapshot();
            if self.daemons.contains(&unit.id) && !status.healthy {
                unmet.push(if status.pid == 0 {
                    format!("{} not running", unit.id)
                } else {
                    format!("{} not healthy", unit.id)
                });
            }
            if let Some(sec) = unit.security() {
                security.push(Resource::new(NAMESPACE, unit.id.clone(), sec));
            }
            statuses.push(Resource::new(NAMESPACE, unit.id.clone(), status));
        }
        let mut machine = self.machine.borrow().clone();
        machine.status.ready = unmet.is_empty();
        if machine.status.ready && !self.ready_logged {
            self.ready_logged = true;
            let uptime = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
                .map(|t| std::time::Duration::from(t).as_secs_f64())
                .unwrap_or_default();
            tracing::info!(
                daemons = self.daemons.len(),
                uptime = format_args!("{uptime:.3}s"),
                "every daemon is ready"
            );
        }
        // Upstream's condition for its services: one, every daemon that is not ready named.
        machine.status.unmet_conditions = if unmet.is_empty() {
            Vec::new()
        } else {
            vec![UnmetCondition {
                name: "services".into(),
                reason: unmet.join(", "),
            }]
        };
        ctx.apply(Resource::new(NAMESPACE, MACHINE_STATUS_ID, machine))
            .await?;
        ctx.apply_all(statuses).await?;
        ctx.apply_all(security).await?;
        ctx.apply(Resource::new(
            NAMESPACE,
            CMDLINE_ID,
            KernelCmdlineSpec {
                cmdline: self.cmdline.clone(),
            },
        ))
        .await?;
        Ok(Action::RequeueAfter(RESYNC))
    }
}

/// Runs the services daemons ask for, within their envelopes.
pub struct ServiceSpecController {
    /// The supervisor that runs them.
    pub supervisor: Arc<Supervisor>,
    /// Each daemon's envelope, and what no service may take.
    pub envelopes: Envelopes,
    /// Where the seccomp profiles are.
    pub profiles_dir: PathBuf,
    /// The node's block devices (a VM's): no service may reach a protected one.
    pub devices: Option<Arc<DeviceAccess>>,
    /// What was last acted on, by service ID: the spec and the daemon that asked.
    known: BTreeMap<String, (String, ServiceSpecSpec)>,
}

impl ServiceSpecController {
    /// The controller for every daemon of `daemons` with an envelope.
    pub fn new(supervisor: Arc<Supervisor>, daemons: &[Daemon], profiles_dir: PathBuf) -> Self {
        Self {
            supervisor,
            envelopes: Envelopes::of(daemons),
            profiles_dir,
            devices: None,
            known: BTreeMap::new(),
        }
    }

    /// Refuses services that reach a device `devices` protects.
    #[must_use]
    pub fn protecting(mut self, devices: Arc<DeviceAccess>) -> Self {
        self.devices = Some(devices);
        self
    }
}

impl Controller for ServiceSpecController {
    fn name(&self) -> &'static str {
        "runtime.ServiceSpecController"
    }

    fn inputs(&self) -> Vec<Input> {
        self.envelopes
            .namespaces()
            .map(|(ns, _)| Input::new(ns, ServiceSpecSpec::TYPE, InputKind::Weak))
            .collect()
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let mut seen = BTreeSet::new();
        let namespaces: Vec<(String, String)> = self
            .envelopes
            .namespaces()
            .map(|(ns, d)| (ns.to_string(), d.to_string()))
            .collect();
        for (ns, daemon) in namespaces {
            for raw in ctx
                .list_raw(&ns, ServiceSpecSpec::TYPE, &cosi::Query::default())
                .await?
            {
                let id = raw.metadata.id.clone();
                seen.insert(id.clone());
                let spec = match raw.decode::<ServiceSpecSpec>() {
                    Ok(r) => r.spec,
                    Err(e) => {
                        if !self.known.contains_key(&id) {
                            self.supervisor
                                .add_refused(
                                    &id,
                                    UnitKind::Service,
                                    &daemon,
                                    format!("refused: the spec does not decode: {e}"),
                                )
                                .await;
                            self.known
                                .insert(id, (daemon.clone(), ServiceSpecSpec::default()));
                        }
                        continue;
                    }
                };
                if self.known.get(&id) == Some(&(daemon.clone(), spec.clone())) {
                    continue;
                }
                let protected = self
                    .devices
                    .as_ref()
                    .map(|d| d.protected())
                    .unwrap_or_default();
                match self.envelopes.check(
                    &self.supervisor,
                    &daemon,
                    &id,
                    &spec,
                    &self.profiles_dir,
                    &protected,
                ) {
                    Ok(launch) => {
                        tracing::info!(service = %id, %daemon, "starting requested service");
                        self.supervisor
                            .add(&id, UnitKind::Service, &daemon, launch, vec![], true)
                            .await;
                    }
                    Err(reasons) => {
                        let reason = format!("refused: {}", reasons.join("; "));
                        tracing::warn!(service = %id, %daemon, %reason, "refused requested service");
                        self.supervisor
                            .add_refused(&id, UnitKind::Service, &daemon, reason)
                            .await;
                    }
                }
                self.known.insert(id, (daemon.clone(), spec));
            }
        }
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            tracing::info!(service = %id, "service spec removed: stopping the service");
            self.supervisor.remove(&id).await;
            self.known.remove(&id);
        }
        Ok(Action::AwaitChange)
    }
}

/// Applies networkd's merged hostname to the node's UTS namespace.
pub struct HostnameController;

impl Controller for HostnameController {
    fn name(&self) -> &'static str {
        "runtime.HostnameController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<HostnameSpecSpec>(machinery::resources::network::NAMESPACE)
                .with_id(HOSTNAME_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let spec = ctx
            .get::<HostnameSpecSpec>(machinery::resources::network::NAMESPACE, HOSTNAME_ID)
            .await?;
        // A spec being torn down changes nothing: the kernel keeps its names (as upstream).
        if let Some(r) = spec.filter(|r| r.metadata.phase == Phase::Running) {
            match crate::hostname::apply(&r.spec) {
                Ok(crate::hostname::Applied::Set) => tracing::info!(
                    hostname = %r.spec.hostname,
                    domainname = %r.spec.domainname,
                    "hostname set"
                ),
                Ok(crate::hostname::Applied::Unchanged) => {}
                Err(e) => tracing::warn!(error = %e, "cannot set the hostname"),
            }
        }
        Ok(Action::RequeueAfter(RESYNC))
    }
}

/// `config` → `config-redacted`, secrets redacted.
#[derive(Debug, Default)]
pub struct Redact;

/// `config.RedactController`.
pub type RedactController = cosi::generic::TransformController<Redact>;

impl cosi::generic::Transform for Redact {
    type Input = MachineConfigSpec;
    type Output = MachineConfigSpec;

    fn name(&self) -> &'static str {
        "config.RedactController"
    }

    fn input_namespace(&self) -> &str {
        machinery::resources::config::NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        machinery::resources::config::REDACTED_NAMESPACE
    }

    fn map_id(&self, input: &Resource<MachineConfigSpec>) -> Option<String> {
        Some(input.metadata.id.clone())
    }

    /// The version it was made from: a client that reads the copy, changes it and applies it
    /// sends it back, and init refuses the apply if the configuration changed in between.
    fn annotations(&self, input: &Resource<MachineConfigSpec>) -> Vec<(String, String)> {
        vec![(
            machinery::resources::config::SOURCE_VERSION_ANNOTATION.to_string(),
            input.metadata.version.to_string(),
        )]
    }

    /// A configuration that does not decode is not copied at all (its secrets could not be
    /// found): the last redacted copy stays, and the error says why.
    fn transform(
        &self,
        input: &Resource<MachineConfigSpec>,
    ) -> Result<MachineConfigSpec, ReconcileError> {
        let config = machinery::config::Config::from_yaml(&input.spec.0).map_err(|e| {
            ReconcileError::other(format!(
                "MachineConfig {:?} does not decode, so it is not redacted ({} problems, the first: {})",
                input.metadata.id,
                e.errors.len(),
                e.errors.first().map(|p| p.path.as_str()).unwrap_or("")
            ))
        })?;
        let text = config.redacted().to_yaml().map_err(|e| {
            ReconcileError::other(format!(
                "MachineConfig {:?}: cannot encode the redacted copy: {e}",
                input.metadata.id
            ))
        })?;
        Ok(MachineConfigSpec(text))
    }
}

/// The active configuration's `machine.type` → `config/MachineTypes/machine-type`.
#[derive(Debug, Default)]
pub struct MachineTypeOf;

/// `config.MachineTypeController` (upstream's name).
pub type MachineTypeController = cosi::generic::TransformController<MachineTypeOf>;

impl cosi::generic::Transform for MachineTypeOf {
    type Input = MachineConfigSpec;
    type Output = machinery::resources::config::MachineTypeSpec;

    fn name(&self) -> &'static str {
        "config.MachineTypeController"
    }

    fn input_namespace(&self) -> &str {
        machinery::resources::config::NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        machinery::resources::config::NAMESPACE
    }

    fn map_id(&self, input: &Resource<MachineConfigSpec>) -> Option<String> {
        (input.metadata.id == machinery::resources::config::ACTIVE_ID)
            .then(|| machinery::resources::config::MACHINE_TYPE_ID.to_string())
    }

    fn transform(
        &self,
        input: &Resource<MachineConfigSpec>,
    ) -> Result<machinery::resources::config::MachineTypeSpec, ReconcileError> {
        let config = machinery::config::Config::from_yaml(&input.spec.0).map_err(|e| {
            ReconcileError::other(format!(
                "the active MachineConfig does not decode ({} problems)",
                e.errors.len()
            ))
        })?;
        // Upstream's name for a configuration without a known type.
        let name = config.machine_type().map_or("unknown", |t| t.as_str());
        Ok(machinery::resources::config::MachineTypeSpec(
            name.to_string(),
        ))
    }
}

/// `runtime.KernelModuleConfigController`: the `KernelModuleSpec`s of the node, one per module:
/// those the image loads at boot (its `modules-load.d` files, read once; a VM's only: a
/// container-mode node shares the host's kernel) and those of `machine.kernel.modules` (its
/// parameters win for a module in both).
pub struct KernelModuleConfigController {
    /// The image's boot modules, with their parameters.
    pub boot: Vec<(String, Vec<String>)>,
}

impl KernelModuleConfigController {
    /// The boot modules listed in `dir`'s `*.conf` files (`/usr/lib/modules-load.d`), in file
    /// name order; none if the directory is missing.
    pub fn boot_modules(dir: &std::path::Path) -> Vec<(String, Vec<String>)> {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        files.sort();
        files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .flat_map(|t| crate::kmod::parse_modules_load(&t))
            .collect()
    }
}

impl Controller for KernelModuleConfigController {
    fn name(&self) -> &'static str {
        "runtime.KernelModuleConfigController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<MachineConfigSpec>(machinery::resources::config::NAMESPACE)
                .with_id(machinery::resources::config::ACTIVE_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<KernelModuleSpecSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let mut specs: BTreeMap<String, Vec<String>> = self.boot.iter().cloned().collect();
        let config = ctx
            .get::<MachineConfigSpec>(
                machinery::resources::config::NAMESPACE,
                machinery::resources::config::ACTIVE_ID,
            )
            .await?;
        if let Some(c) = config {
            // A configuration that does not decode adds nothing (init refuses to write one;
            // this is a stored one from before): the boot modules still load.
            if let Ok(c) = machinery::config::Config::from_yaml(&c.spec.0) {
                let modules = c
                    .machine()
                    .and_then(|m| m.kernel.as_ref())
                    .map(|k| k.modules.clone())
                    .unwrap_or_default();
                for m in modules {
                    if let Some(name) = m.name.filter(|n| !n.is_empty()) {
                        specs.insert(name.replace('-', "_"), m.parameters);
                    }
                }
            }
        }
        ctx.apply_all(specs.into_iter().map(|(name, parameters)| {
            Resource::new(
                NAMESPACE,
                &name,
                KernelModuleSpecSpec {
                    name: name.clone(),
                    parameters,
                },
            )
        }))
        .await?;
        Ok(Action::AwaitChange)
    }
}

/// `runtime.KernelModuleSpecController` (a VM's init only): loads every `KernelModuleSpec`,
/// with the modules it needs, from the image's modules for the running kernel. Modules are
/// never unloaded (as upstream). A module that cannot be loaded is an error of the cycle
/// (every other one is still loaded), retried with backoff.
pub struct KernelModuleSpecController {
    /// The image's boot modules, loaded first and in their files' order (the NIC's and the
    /// disk's drivers come first there); the others after, by name.
    pub first: Vec<String>,
    /// The image's module index, once read.
    index: Option<Arc<crate::kmod::ModuleIndex>>,
    /// Modules loaded (or found loaded) already.
    done: BTreeSet<String>,
}

impl KernelModuleSpecController {
    /// A controller that reads the running kernel's module index on its first cycle and loads
    /// `first` (names) before the others.
    pub fn new(first: Vec<String>) -> Self {
        Self {
            first,
            index: None,
            done: BTreeSet::new(),
        }
    }
}

impl Controller for KernelModuleSpecController {
    fn name(&self) -> &'static str {
        "runtime.KernelModuleSpecController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<KernelModuleSpecSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let specs = ctx.list::<KernelModuleSpecSpec>(NAMESPACE).await?;
        if self.index.is_none() {
            match crate::kmod::ModuleIndex::for_running_kernel() {
                Ok(i) => self.index = Some(Arc::new(i)),
                Err(e) => {
                    return Err(ReconcileError::other(format!(
                        "no kernel modules to load from: {}",
                        cosi::error::Chain(&e)
                    )))
                }
            }
        }
        let Some(index) = self.index.clone() else {
            return Ok(Action::AwaitChange);
        };
        let rank = |name: &str| {
            self.first
                .iter()
                .position(|f| f == name)
                .unwrap_or(usize::MAX)
        };
        let mut todo: Vec<(String, Vec<String>)> = specs
            .iter()
            .filter(|s| s.metadata.phase == Phase::Running && !self.done.contains(&s.spec.name))
            .map(|s| (s.spec.name.clone(), s.spec.parameters.clone()))
            .collect();
        todo.sort_by(|a, b| rank(&a.0).cmp(&rank(&b.0)).then_with(|| a.0.cmp(&b.0)));
        // finit_module(2) blocks while the module initializes: off the async workers.
        let results = tokio::task::spawn_blocking(move || {
            todo.into_iter()
                .map(|(name, params)| {
                    let r = index.load(&name, &params);
                    (name, r)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| ReconcileError::other(format!("module loading ended: {e}")))?;
        let mut failed = Vec::new();
        for (name, r) in results {
            match r {
                Ok(loaded) => {
                    if !loaded.is_empty() {
                        tracing::info!(module = %name, loaded = ?loaded, "kernel module loaded");
                    }
                    self.done.insert(name);
                }
                Err(e) => failed.push(format!("{name}: {}", cosi::error::Chain(&e))),
            }
        }
        if failed.is_empty() {
            Ok(Action::AwaitChange)
        } else {
            Err(ReconcileError::other(format!(
                "cannot load kernel modules: {}",
                failed.join("; ")
            )))
        }
    }
}

/// `runtime.LoadedKernelModuleController` (a VM's init only): a `LoadedKernelModule` for every
/// module in `/proc/modules`, read again when a module spec changes and every [`RESYNC`].
pub struct LoadedKernelModuleController;

impl Controller for LoadedKernelModuleController {
    fn name(&self) -> &'static str {
        "runtime.LoadedKernelModuleController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<KernelModuleSpecSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<LoadedKernelModuleSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let text = std::fs::read_to_string("/proc/modules")
            .map_err(|e| ReconcileError::other(format!("cannot read /proc/modules: {e}")))?;
        ctx.apply_all(
            crate::kmod::parse_proc_modules(&text)
                .into_iter()
                .map(|(name, spec)| Resource::new(NAMESPACE, &name, spec)),
        )
        .await?;
        // The spec controller loads in the same cycle as the specs appear: look again shortly
        // after, then at the resync pace.
        Ok(Action::RequeueAfter(std::time::Duration::from_secs(2)))
    }
}

/// How often [`BlockDeviceAccessController`] looks for new block devices.
pub const DEVICE_RESYNC: std::time::Duration = std::time::Duration::from_secs(2);

/// `runtime.BlockDeviceAccessController` (a VM's init only): gives blockd the block device
/// nodes (`root:<blockd's gid>`, mode 0660), as udev gives them to its `disk` group: blockd
/// needs no capability to probe and partition them, and no other daemon can open them. Nodes
/// that appear later (a disk attached, partitions re-read) are given it within
/// [`DEVICE_RESYNC`]. A mounted system volume's device and the disk that holds it are no
/// daemon's (`root:root` 0600), never handed back; blockd is restarted when one it could open
/// is taken from it, and a requested service that reaches one is stopped
/// ([`DeviceAccess::enforce`]). Only block devices are touched, never through a symlink.
pub struct BlockDeviceAccessController {
    /// The nodes, blockd, and what is protected.
    pub devices: Arc<DeviceAccess>,
    /// The units (blockd, requested services); `None`: nodes only.
    pub supervisor: Option<Arc<Supervisor>>,
}

impl Controller for BlockDeviceAccessController {
    fn name(&self) -> &'static str {
        "runtime.BlockDeviceAccessController"
    }

    fn inputs(&self) -> Vec<Input> {
        Vec::new()
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
    }

    async fn reconcile(&mut self, _ctx: &mut Context) -> Result<Action, ReconcileError> {
        let applied = self.devices.enforce(self.supervisor.as_ref()).await;
        if !applied.failed.is_empty() {
            return Err(ReconcileError::other(format!(
                "cannot set the access of block devices: {}",
                applied.failed.join("; ")
            )));
        }
        Ok(Action::RequeueAfter(DEVICE_RESYNC))
    }
}
