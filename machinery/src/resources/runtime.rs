//! The `runtime` namespace (written by init): what the node observed about itself.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// The namespace init writes.
pub const NAMESPACE: &str = "runtime";
/// ID of the kernel command line resource.
pub const CMDLINE_ID: &str = "cmdline";

/// The kernel command line of the node (from `/proc/cmdline` in a VM, from the node's own
/// configuration in container mode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelCmdlineSpec {
    /// The whole command line.
    pub cmdline: String,
}

impl ResourceSpec for KernelCmdlineSpec {
    const TYPE: &'static str = "KernelCmdlines.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("Cmdline", "{.cmdline}")])
    }
}

/// A `KernelCmdline` resource.
pub type KernelCmdline = Resource<KernelCmdlineSpec>;

/// ID of the machine status resource.
pub const MACHINE_STATUS_ID: &str = "machine";

/// Whether a supervised program is one of the node's daemons or a service a daemon asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UnitKind {
    /// A daemon of the manifest (stated, networkd, …).
    #[default]
    Daemon,
    /// A requested service (a `ServiceSpec` a daemon wrote, e.g. etcd for k8sd).
    Service,
}

impl UnitKind {
    /// `daemon` or `service`.
    pub fn as_str(self) -> &'static str {
        match self {
            UnitKind::Daemon => "daemon",
            UnitKind::Service => "service",
        }
    }
}

/// The state of a supervised program, as Talos's service states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ServiceState {
    /// Waiting for its dependencies (or for its restart backoff).
    #[default]
    Waiting,
    /// Spawned, not ready yet.
    Starting,
    /// Running (ready when it said so).
    Running,
    /// Asked to stop (SIGTERM sent, SIGKILL after the grace period).
    Stopping,
    /// Stopped on request.
    Stopped,
    /// Ended and will not be restarted: permanent-failure exit code, crash loop, or refused.
    Failed,
    /// Ended with exit 0 and is not restarted (a service that may finish).
    Finished,
}

impl ServiceState {
    /// The lower-case name (`running`).
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceState::Waiting => "waiting",
            ServiceState::Starting => "starting",
            ServiceState::Running => "running",
            ServiceState::Stopping => "stopping",
            ServiceState::Stopped => "stopped",
            ServiceState::Failed => "failed",
            ServiceState::Finished => "finished",
        }
    }
}

/// What init's supervisor knows about one daemon or requested service. ID: the daemon name or
/// the service ID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatusSpec {
    /// Daemon or requested service.
    pub kind: UnitKind,
    /// For a requested service, the daemon that wrote its `ServiceSpec`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub requested_by: String,
    /// Where it is in its lifecycle.
    pub state: ServiceState,
    /// Its pid while it runs (0 otherwise).
    pub pid: i32,
    /// Restarts since init first started it.
    pub restarts: u32,
    /// How its last run ended (`exit 1`, `signal 9`), empty before the first end.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_exit: String,
    /// It said it is ready on its notification fd (or it has no readiness and runs).
    pub ready: bool,
    /// Running and ready: what dependents wait for.
    pub healthy: bool,
    /// Why it is in its state: the refusal reason of a service, the crash loop, the dependency
    /// it waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// For a service that does not restart (`restart: false`), once a run of it ended: the
    /// end of what that run printed (stdout and stderr, as init keeps its log lines), whole
    /// lines joined by newlines, at most [`SERVICE_OUTPUT_MAX`] bytes (the newest lines; a
    /// newest line longer than that alone is cut to its end). This is how the daemon that
    /// asked for a one-shot service (blockd's `blkid -p -o export <device>`) reads its result
    /// from the status it already watches; `last_exit` says how it ended. Empty while it runs,
    /// and always for daemons and services that restart (their output is in their logs).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output: String,
}

/// The most bytes of a one-shot service's output its `ServiceStatus` carries
/// ([`ServiceStatusSpec::output`]).
pub const SERVICE_OUTPUT_MAX: usize = 4096;

impl ResourceSpec for ServiceStatusSpec {
    const TYPE: &'static str = "ServiceStatuses.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["svc", "services"])
            .with_columns(&[
                ("Kind", "{.kind}"),
                ("State", "{.state}"),
                ("Pid", "{.pid}"),
                ("Restarts", "{.restarts}"),
                ("Healthy", "{.healthy}"),
                ("Last Exit", "{.lastExit}"),
            ])
    }
}

/// A `ServiceStatus` resource.
pub type ServiceStatus = Resource<ServiceStatusSpec>;

/// A path a requested service may reach, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServicePath {
    /// An absolute path of the node; everything beneath it is covered.
    pub path: String,
    /// `read-only`, `exec` or `read-write` (landlock rules, as in the daemon manifest).
    pub access: String,
}

/// A long-running program a daemon asks init to run (k8sd asks for etcd). The daemon writes it
/// in a namespace of its own; init checks it against that daemon's envelope in the manifest and
/// runs it sandboxed, or refuses it with the reason in the service's `ServiceStatus`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpecSpec {
    /// The program, an absolute path of the node.
    pub binary: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment (nothing else is passed).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The non-root uid it runs as.
    pub uid: u32,
    /// The non-root gid it runs as.
    pub gid: u32,
    /// Capabilities it holds (`CAP_NET_BIND_SERVICE`).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Landlock path rules.
    #[serde(default)]
    pub paths: Vec<ServicePath>,
    /// TCP ports it may bind.
    #[serde(default)]
    pub bind_tcp: Vec<u16>,
    /// TCP ports it may connect to.
    #[serde(default)]
    pub connect_tcp: Vec<u16>,
    /// The name of a seccomp profile compiled into init (`service`).
    pub seccomp_profile: String,
    /// Restart it when it ends (with backoff), as daemons are; otherwise it runs once.
    #[serde(default = "yes")]
    pub restart: bool,
}

fn yes() -> bool {
    true
}

impl ResourceSpec for ServiceSpecSpec {
    const TYPE: &'static str = "ServiceSpecs.runtime.talos.dev";
    // Written in the asking daemon's own namespace (k8sd: `k8s`).
    const DEFAULT_NAMESPACE: &'static str = "k8s";

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, "k8s")
            .with_columns(&[("Binary", "{.binary}"), ("Uid", "{.uid}")])
    }
}

/// A `ServiceSpec` resource.
pub type ServiceSpec = Resource<ServiceSpecSpec>;

/// The sandbox one daemon runs in, as the kernel reports it for every thread of the process
/// (`/proc/<pid>/task/*/status`), beside what the manifest declared, with the exposure score on
/// the `systemd-analyze security` model. ID: the daemon name. `talosctl audit` reads these.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSecuritySpec {
    /// The observed process.
    pub pid: i32,
    /// Threads observed.
    pub threads: u32,
    /// What `/proc` says.
    pub observed: ObservedSandbox,
    /// What the manifest declares.
    pub declared: DeclaredSandbox,
    /// Differences between the two (empty: the kernel enforces the manifest on every thread).
    #[serde(default)]
    pub mismatches: Vec<String>,
    /// Exposure 0–100 (shown as `exposure / 10`, systemd's scale).
    pub exposure: u64,
    /// systemd's level name for the exposure (`OK`, `MEDIUM`, …).
    pub level: String,
    /// The assessed checks (id, weight, badness, description), for `talosctl audit -o json`.
    #[serde(default)]
    pub checks: Vec<SecurityCheck>,
}

/// The sandbox as `/proc` shows it, over every thread (sets are unions, flags hold for all).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedSandbox {
    /// Distinct uids of any thread (real, effective, saved, fs).
    pub uids: Vec<u32>,
    /// Distinct gids of any thread.
    pub gids: Vec<u32>,
    /// `CapEff`, union over threads.
    pub effective: Vec<String>,
    /// `CapPrm`, union over threads.
    pub permitted: Vec<String>,
    /// `CapInh`, union over threads.
    pub inheritable: Vec<String>,
    /// `CapBnd`, union over threads.
    pub bounding: Vec<String>,
    /// `CapAmb`, union over threads.
    pub ambient: Vec<String>,
    /// `NoNewPrivs` is 1 on every thread.
    pub no_new_privs: bool,
    /// `Seccomp` of the least confined thread: `disabled`, `strict` or `filter`.
    pub seccomp: String,
    /// Smallest `Seccomp_filters` count over threads.
    pub seccomp_filters: u32,
    /// Landlock: `full`, `partial` or `notEnforced` (what init applied; `/proc` has no field).
    pub landlock: String,
    /// The kernel's landlock ABI.
    pub landlock_abi: u32,
    /// The process is not dumpable (its /proc files are root's): no process of its uid can
    /// read its memory or attach to it. `None` when it runs as root.
    #[serde(default)]
    pub non_dumpable: Option<bool>,
}

/// The sandbox as the manifest declares it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeclaredSandbox {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Capabilities.
    pub capabilities: Vec<String>,
    /// The seccomp profile name (empty: unconfined).
    pub seccomp_profile: String,
    /// Landlock path rules, `access:path`.
    pub paths: Vec<String>,
    /// TCP ports it may bind.
    pub bind_tcp: Vec<u16>,
    /// TCP ports it may connect to.
    pub connect_tcp: Vec<u16>,
    /// Namespaces it writes in stated.
    pub writes: Vec<String>,
    /// Namespaces it reads in stated.
    pub reads: Vec<String>,
}

/// One check of the exposure score.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityCheck {
    /// Stable id (systemd's `json_field`, or `Talos…`).
    pub id: String,
    /// Weight.
    pub weight: u64,
    /// Badness range.
    pub range: u64,
    /// Badness (`None`: not assessed).
    pub badness: Option<u64>,
    /// What was found.
    pub description: String,
}

impl ResourceSpec for DaemonSecuritySpec {
    const TYPE: &'static str = "DaemonSecurities.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Pid", "{.pid}"),
            ("Uids", "{.observed.uids}"),
            ("Effective", "{.observed.effective}"),
            ("Seccomp", "{.observed.seccomp}"),
            ("Exposure", "{.exposure}"),
            ("Level", "{.level}"),
        ])
    }
}

/// A `DaemonSecurity` resource.
pub type DaemonSecurity = Resource<DaemonSecuritySpec>;

/// Where the machine is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MachineStage {
    /// Starting its daemons.
    #[default]
    Booting,
    /// Every daemon started, and the node has no machine configuration: apid serves the
    /// maintenance API (upstream's stage of that name) until one is applied.
    Maintenance,
    /// Every daemon started (ready or not: see `ready`).
    Running,
    /// Stopping everything before power-off.
    ShuttingDown,
    /// Stopping everything before a reboot.
    Rebooting,
}

/// The node as a whole, as Talos's `MachineStatus`, in upstream's shape (`stage`, `status:
/// {ready, unmetConditions}`, so that `-o jsonpath='{.spec.status.ready}'` works as there),
/// plus `mode`. ID: `machine`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatusSpec {
    /// The stage.
    pub stage: MachineStage,
    /// Whether the machine is ready at its stage, and what keeps it from it.
    #[serde(default)]
    pub status: MachineStatusStatus,
    /// How init runs: `vm` (PID 1 of a machine), `container` (PID 1 of a namespace set) or
    /// `dev` (not PID 1). Not upstream's: its platform is in `Version`.
    #[serde(default)]
    pub mode: String,
}

/// Upstream's `MachineStatusStatus`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatusStatus {
    /// Every daemon is running and ready.
    pub ready: bool,
    /// What is not (yet): upstream's condition names (`services`: the daemons, each "NAME not
    /// running" or "NAME not healthy").
    #[serde(default)]
    pub unmet_conditions: Vec<UnmetCondition>,
}

/// A condition that keeps the machine from being ready at its stage (upstream's
/// `UnmetCondition`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmetCondition {
    /// The condition (`services`).
    pub name: String,
    /// Why it is not met.
    pub reason: String,
}

impl ResourceSpec for MachineStatusSpec {
    const TYPE: &'static str = "MachineStatuses.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Stage", "{.stage}"),
            ("Ready", "{.status.ready}"),
            ("Mode", "{.mode}"),
        ])
    }
}

/// A `MachineStatus` resource.
pub type MachineStatus = Resource<MachineStatusSpec>;

/// A kernel module to load (upstream's `KernelModuleSpec`). ID: the module's name. init writes
/// one for every module its image loads at boot (`/usr/lib/modules-load.d/*.conf`) and every
/// one of `machine.kernel.modules`; in a VM it loads them, with their dependencies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelModuleSpecSpec {
    /// The module's name.
    pub name: String,
    /// Its parameters (`key=value`).
    #[serde(default)]
    pub parameters: Vec<String>,
}

impl ResourceSpec for KernelModuleSpecSpec {
    const TYPE: &'static str = "KernelModuleSpecs.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

/// A `KernelModuleSpec` resource.
pub type KernelModuleSpec = Resource<KernelModuleSpecSpec>;

/// A module the kernel has loaded, as `/proc/modules` lists it (upstream's
/// `LoadedKernelModule`, `talosctl get modules`). ID: the module's name. Only a VM's init
/// writes them (a container-mode node shares the host's kernel).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadedKernelModuleSpec {
    /// Bytes of memory it takes.
    pub size: u64,
    /// How many users it has.
    pub reference_count: u64,
    /// Modules that use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// `Live`, `Loading` or `Unloading`.
    pub state: String,
    /// Its load address (zero unless the reader may see addresses).
    pub address: String,
}

impl ResourceSpec for LoadedKernelModuleSpec {
    const TYPE: &'static str = "LoadedKernelModules.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["module", "modules"])
            .with_columns(&[("State", "{.state}")])
    }
}

/// A `LoadedKernelModule` resource.
pub type LoadedKernelModule = Resource<LoadedKernelModuleSpec>;

/// Definitions of the runtime namespace's types.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![
        KernelModuleSpecSpec::definition(),
        LoadedKernelModuleSpec::definition(),
        KernelCmdlineSpec::definition(),
        ServiceStatusSpec::definition(),
        ServiceSpecSpec::definition(),
        DaemonSecuritySpec::definition(),
        MachineStatusSpec::definition(),
        // init mounts the volumes blockd prepares (a block type, in `runtime` as upstream).
        crate::resources::block::MountStatusSpec::definition(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_status_has_upstreams_shape() {
        let spec = MachineStatusSpec {
            stage: MachineStage::Running,
            status: MachineStatusStatus {
                ready: false,
                unmet_conditions: vec![UnmetCondition {
                    name: "services".into(),
                    reason: "k8sd not healthy".into(),
                }],
            },
            mode: "vm".into(),
        };
        let yaml = serde_yaml_ng::to_string(&spec).unwrap();
        assert_eq!(
            yaml,
            "stage: running\nstatus:\n  ready: false\n  unmetConditions:\n  - name: services\n    \
             reason: k8sd not healthy\nmode: vm\n"
        );
        // Upstream's own document (no `mode`) reads back.
        let upstream: MachineStatusSpec = serde_yaml_ng::from_str(
            "stage: running\nstatus:\n    ready: true\n    unmetConditions: []\n",
        )
        .unwrap();
        assert!(upstream.status.ready);
        assert_eq!(upstream.stage, MachineStage::Running);
    }
}
