//! Validation of a decoded machine configuration, after upstream
//! `v1alpha1_validation.go`: every problem is collected with its path.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use super::checks;
use super::document::Config;
use super::error::{join_index, join_key, ConfigError, ConfigErrors, Warning};
use super::v1alpha1::{
    Bond, ClusterConfig, Device, DeviceWireguardConfig, EncryptionConfig, MachineConfig,
    MachineType, Route, Vlan, VERSION,
};

/// Where the configuration runs; decides which sections are required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValidationMode {
    /// A node in Linux namespaces (no install, no disks).
    Container,
    /// Bare metal or a VM: installs to a disk, so `machine.install` is required.
    Metal,
    /// A cloud instance booting a pre-installed image.
    Cloud,
}

impl ValidationMode {
    /// True if the machine must be installed to a disk (metal).
    pub fn requires_install(self) -> bool {
        matches!(self, Self::Metal)
    }

    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Metal => "metal",
            Self::Cloud => "cloud",
        }
    }
}

impl fmt::Display for ValidationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validation mode name that is not `container`, `metal` or `cloud`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown validation mode {0:?} (expected container, metal or cloud)")]
pub struct ParseValidationModeError(pub String);

impl FromStr for ValidationMode {
    type Err = ParseValidationModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "container" => Ok(Self::Container),
            "metal" => Ok(Self::Metal),
            "cloud" => Ok(Self::Cloud),
            other => Err(ParseValidationModeError(other.to_owned())),
        }
    }
}

/// Talos API roles that may be granted to Kubernetes workloads.
const TALOS_ROLES: [&str; 5] = [
    "os:admin",
    "os:operator",
    "os:reader",
    "os:etcd:backup",
    "os:impersonator",
];

/// KubeletConfiguration fields Talos manages itself.
const PROTECTED_KUBELET_FIELDS: [&str; 9] = [
    "apiVersion",
    "authentication",
    "authorization",
    "cgroupDriver",
    "kind",
    "rotateCertificates",
    "staticPodPath",
    "tlsCertFile",
    "tlsPrivateKeyFile",
];

const MIN_MTU: u32 = 68;
const MAX_MTU: u32 = 65535;
const KUBESPAN_MIN_MTU: u32 = 1280;
const KUBESPAN_DEFAULT_MTU: u32 = 1420;
const DEFAULT_DISCOVERY_ENDPOINT: &str = "https://discovery.talos.dev/";

#[derive(Default)]
struct Report {
    errors: Vec<ConfigError>,
    warnings: Vec<Warning>,
}

impl Report {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError::new(path, message));
    }

    fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Warning::new(path, message));
    }
}

fn is_set(s: &Option<String>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

fn str_of(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("")
}

impl Config {
    /// Validates the configuration for a runtime `mode`.
    ///
    /// Returns the warnings (deprecations, legacy values, settings talos-rs does not apply, see
    /// [`unapplied`](crate::config::unapplied)), or every error found, each with its path.
    pub fn validate(&self, mode: ValidationMode) -> Result<Vec<Warning>, ConfigErrors> {
        let mut report = Report::default();
        validate_config(self, mode, &mut report);
        if report.errors.is_empty() {
            Ok(report.warnings)
        } else {
            Err(ConfigErrors::new(report.errors))
        }
    }

    /// Like [`Config::validate`], with warnings turned into errors (`talosctl validate --strict`).
    pub fn validate_strict(&self, mode: ValidationMode) -> Result<(), ConfigErrors> {
        let mut report = Report::default();
        validate_config(self, mode, &mut report);
        let mut errors = report.errors;
        errors.extend(
            report
                .warnings
                .into_iter()
                .map(|w| ConfigError::new(w.path, format!("warning: {}", w.message))),
        );
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors::new(errors))
        }
    }
}

fn validate_config(config: &Config, mode: ValidationMode, r: &mut Report) {
    let Some(doc) = &config.v1alpha1 else {
        r.error(
            "machine",
            "machine instructions are required (no v1alpha1 document)",
        );
        return;
    };
    if let Some(v) = doc.version.as_deref().filter(|v| *v != VERSION) {
        r.error(
            "version",
            format!("invalid config version {v:?}, expected {VERSION:?}"),
        );
    }
    if doc.persist == Some(false) {
        r.error("persist", "persist should be enabled");
    }
    let Some(machine) = &doc.machine else {
        r.error("machine", "machine instructions are required");
        return;
    };

    let raw_type = str_of(&machine.machine_type);
    let machine_type = MachineType::parse(raw_type);
    match machine_type {
        None if raw_type.is_empty() => r.error(
            "machine.type",
            "machine type is required (\"controlplane\" or \"worker\")",
        ),
        None => r.error(
            "machine.type",
            format!("unknown machine type {raw_type:?} (expected \"controlplane\" or \"worker\")"),
        ),
        Some(MachineType::Init) => r.warn(
            "machine.type",
            "use \"controlplane\" instead of \"init\" for machine type",
        ),
        Some(t) if t.as_str() != raw_type => r.warn(
            "machine.type",
            format!(
                "use {:?} instead of {raw_type:?} for machine type",
                t.as_str()
            ),
        ),
        Some(_) => {}
    }
    let control_plane = machine_type.is_some_and(MachineType::is_control_plane);

    validate_machine_ca(machine, machine_type, doc.cluster.as_ref(), r);

    match &doc.cluster {
        None => r.error("cluster", "cluster instructions are required"),
        Some(cluster) => validate_cluster(cluster, control_plane, r),
    }

    if mode.requires_install() {
        validate_install_required(machine, r);
    }
    validate_install(machine, r);
    validate_features(machine, control_plane, r);
    if let Some(network) = &machine.network {
        validate_network(network, machine_type, r);
    }
    validate_kubespan(machine, doc.cluster.as_ref(), r);
    validate_kubelet(machine, r);
    validate_disks(machine, r);
    validate_encryption(machine, r);
    validate_logging(machine, r);
    validate_files(machine, r);
    validate_node_metadata(machine, r);
    validate_misc(machine, r);
    // Valid upstream, but not applied here: said, never ignored silently.
    r.warnings.extend(super::unapplied::unapplied(config));
    // A node in namespaces shares the host's kernel: its modules are the host's business.
    if mode == ValidationMode::Container {
        if let Some(k) = machine.kernel.as_ref().filter(|k| !k.modules.is_empty()) {
            r.warn(
                "machine.kernel.modules",
                format!(
                    "not applied by talos-rs in container mode: a node in namespaces shares the \
                     host's kernel, so its {} module(s) are not loaded (a VM node loads them)",
                    k.modules.len()
                ),
            );
        }
    }
}

fn validate_machine_ca(
    machine: &MachineConfig,
    machine_type: Option<MachineType>,
    cluster: Option<&ClusterConfig>,
    r: &mut Report,
) {
    let ca = machine.ca.as_ref();
    if ca.is_none() && machine.accepted_cas.is_empty() {
        r.error(
            "machine.ca",
            "issuing CA or some accepted CAs are required (.machine.ca, .machine.acceptedCAs)",
        );
    }
    match machine_type {
        Some(MachineType::ControlPlane | MachineType::Init) => match ca {
            None => r.error(
                "machine.ca",
                "issuing CA is required for controlplane nodes",
            ),
            Some(ca) if !ca.has_key() => r.error(
                "machine.ca.key",
                "issuing CA key is required for controlplane nodes",
            ),
            Some(_) => {}
        },
        Some(MachineType::Worker) => {
            if let Some(ca) = ca {
                if ca.has_key() {
                    r.error(
                        "machine.ca.key",
                        "issuing Talos API CA key is not allowed on non-controlplane nodes",
                    );
                }
                if !ca.has_crt() && machine.accepted_cas.is_empty() {
                    r.error(
                        "machine.ca.crt",
                        "trusted CA certificates are required on non-controlplane nodes (.machine.ca.crt, .machine.acceptedCAs)",
                    );
                }
            }
            if let Some(ca) = cluster.and_then(|c| c.ca.as_ref()) {
                if ca.has_key() {
                    r.error(
                        "cluster.ca.key",
                        "issuing Kubernetes API CA key is not allowed on non-controlplane nodes",
                    );
                }
            }
            if let Some(network) = &machine.network {
                for (i, device) in network.interfaces.iter().enumerate() {
                    let path = join_index("machine.network.interfaces", i);
                    if device.vip.is_some() {
                        r.error(
                            join_key(&path, "vip"),
                            "virtual (shared) IP is not allowed on non-controlplane nodes",
                        );
                    }
                    for (j, vlan) in device.vlans.iter().enumerate() {
                        if vlan.vip.is_some() {
                            r.error(
                                join_key(&join_index(&join_key(&path, "vlans"), j), "vip"),
                                "virtual (shared) IP is not allowed on non-controlplane nodes",
                            );
                        }
                    }
                }
            }
        }
        None => {}
    }
    for (i, accepted) in machine.accepted_cas.iter().enumerate() {
        if accepted.crt.as_deref().is_none_or(str::is_empty) {
            r.error(
                join_key(&join_index("machine.acceptedCAs", i), "crt"),
                "accepted CA certificate is empty",
            );
        }
    }
}

fn validate_url_list(urls: &[String], base: &str, what: &str, r: &mut Report) {
    for (i, u) in urls.iter().enumerate() {
        if let Err(e) = checks::parse_url(u) {
            r.error(join_index(base, i), format!("invalid {what}: {e}"));
        }
    }
}

fn validate_subnets(subnets: &[String], base: &str, allow_negation: bool, r: &mut Report) {
    for (i, s) in subnets.iter().enumerate() {
        let s = if allow_negation {
            s.strip_prefix('!').unwrap_or(s)
        } else {
            s
        };
        if let Err(e) = checks::check_ip_or_cidr(s) {
            r.error(join_index(base, i), e);
        }
    }
}

fn validate_cluster(cluster: &ClusterConfig, control_plane: bool, r: &mut Report) {
    match cluster
        .control_plane
        .as_ref()
        .and_then(|c| c.endpoint.as_deref())
    {
        None | Some("") => r.error(
            "cluster.controlPlane.endpoint",
            "cluster controlplane endpoint is required",
        ),
        Some(endpoint) => {
            if let Err(e) = checks::parse_url(endpoint) {
                r.error(
                    "cluster.controlPlane.endpoint",
                    format!("invalid controlplane endpoint: {e}"),
                );
            }
        }
    }

    if let Some(network) = &cluster.network {
        if let Some(domain) = network.dns_domain.as_deref().filter(|d| !d.is_empty()) {
            if !checks::is_valid_dns_name(domain) {
                r.error(
                    "cluster.network.dnsDomain",
                    format!("{domain:?} is not a valid DNS name"),
                );
            }
        }
        for (field, list) in [
            ("podSubnets", &network.pod_subnets),
            ("serviceSubnets", &network.service_subnets),
        ] {
            for (i, s) in list.iter().enumerate() {
                if let Err(e) = checks::parse_cidr(s) {
                    r.error(join_index(&format!("cluster.network.{field}"), i), e);
                }
            }
        }
        if control_plane {
            validate_cni(cluster, r);
        }
    }

    if let Some(ecp) = &cluster.external_cloud_provider {
        if ecp.enabled != Some(true) && !ecp.manifests.is_empty() {
            r.error(
                "cluster.externalCloudProvider.manifests",
                "external cloud provider is disabled, but manifests are provided",
            );
        }
        validate_url_list(
            &ecp.manifests,
            "cluster.externalCloudProvider.manifests",
            "external cloud provider manifest URL",
            r,
        );
    }
    validate_url_list(
        &cluster.extra_manifests,
        "cluster.extraManifests",
        "manifest URL",
        r,
    );

    if let Some(etcd) = &cluster.etcd {
        if !control_plane {
            r.error(
                "cluster.etcd",
                "etcd config is only allowed on control plane machines",
            );
        } else {
            if etcd.ca.is_none() {
                r.error(
                    "cluster.etcd.ca",
                    "key/cert combination should not be empty",
                );
            }
            if is_set(&etcd.subnet) && !etcd.advertised_subnets.is_empty() {
                r.error(
                    "cluster.etcd.subnet",
                    "etcd subnet can't be set when advertised subnets are set",
                );
            }
            validate_subnets(
                &etcd.advertised_subnets,
                "cluster.etcd.advertisedSubnets",
                true,
                r,
            );
            validate_subnets(&etcd.listen_subnets, "cluster.etcd.listenSubnets", true, r);
            for k in etcd.extra_args.keys() {
                if crate::resources::etcd::PINNED_ARGS.contains(&k.as_str()) {
                    r.error(
                        join_key("cluster.etcd.extraArgs", k),
                        format!("extra arg {k:?} is not allowed: the node pins it"),
                    );
                }
            }
            if is_set(&etcd.image) {
                r.warn(
                    "cluster.etcd.image",
                    "not applied by talos-rs: nodes run the etcd binary of their image (Debian's etcd 3.4), not a container image",
                );
            }
        }
    }

    let mut names = HashSet::new();
    for (i, manifest) in cluster.inline_manifests.iter().enumerate() {
        let path = join_key(&join_index("cluster.inlineManifests", i), "name");
        let name = str_of(&manifest.name);
        if name.trim().is_empty() {
            r.error(path, "inline manifest name can't be empty");
        } else if !names.insert(name) {
            r.error(path, format!("inline manifest name {name:?} is duplicate"));
        }
    }

    if let Some(discovery) = cluster
        .discovery
        .as_ref()
        .filter(|d| d.enabled == Some(true))
    {
        let service = discovery
            .registries
            .as_ref()
            .and_then(|r| r.service.as_ref());
        if service.and_then(|s| s.disabled) != Some(true) {
            let endpoint = service
                .and_then(|s| s.endpoint.as_deref())
                .filter(|e| !e.is_empty())
                .unwrap_or(DEFAULT_DISCOVERY_ENDPOINT);
            match checks::parse_url(endpoint) {
                Err(e) => r.error(
                    "cluster.discovery.registries.service.endpoint",
                    format!("cluster discovery service registry endpoint is invalid: {e}"),
                ),
                Ok(u) if !u.path.is_empty() && u.path != "/" => r.error(
                    "cluster.discovery.registries.service.endpoint",
                    "cluster discovery service path should be empty",
                ),
                Ok(_) => {}
            }
            if !is_set(&cluster.id) {
                r.error(
                    "cluster.id",
                    "cluster discovery service requires .cluster.id",
                );
            }
            if !is_set(&cluster.secret) {
                r.error(
                    "cluster.secret",
                    "cluster discovery service requires .cluster.secret",
                );
            }
        }
    }

    {
        use crate::resources::k8s;
        let components = [
            (
                "cluster.apiServer.extraArgs",
                k8s::APISERVER_ID,
                cluster.api_server.as_ref().map(|a| &a.extra_args),
            ),
            (
                "cluster.controllerManager.extraArgs",
                k8s::CONTROLLER_MANAGER_ID,
                cluster.controller_manager.as_ref().map(|c| &c.extra_args),
            ),
            (
                "cluster.scheduler.extraArgs",
                k8s::SCHEDULER_ID,
                cluster.scheduler.as_ref().map(|s| &s.extra_args),
            ),
        ];
        for (key, component, args) in components {
            for k in args.into_iter().flat_map(|a| a.keys()) {
                if k8s::denied(component).contains(&k.as_str()) {
                    r.error(
                        join_key(key, k),
                        format!("extra arg {k:?} is not allowed: the node pins it"),
                    );
                }
            }
        }
        for k in cluster.proxy.iter().flat_map(|p| p.extra_args.keys()) {
            if k8s::PROXY_DENIED.contains(&k.as_str()) {
                r.error(
                    join_key("cluster.proxy.extraArgs", k),
                    format!("extra arg {k:?} is not allowed: the node pins it"),
                );
            }
        }
        // Bootstrap manifests talos-rs does not render (the rest are rendered as
        // controlplane/Manifests; none is applied: no API server runs yet).
        if control_plane {
            let not_rendered = "not applied by talos-rs: only the bootstrap manifests (flannel, kube-proxy, CoreDNS, RBAC) are rendered";
            if !cluster.extra_manifests.is_empty() {
                r.warn("cluster.extraManifests", not_rendered);
            }
            if !cluster.inline_manifests.is_empty() {
                r.warn("cluster.inlineManifests", not_rendered);
            }
            let cni = cluster.network.as_ref().and_then(|n| n.cni.as_ref());
            if cni.is_some_and(|c| !c.urls.is_empty()) {
                r.warn("cluster.network.cni.urls", not_rendered);
            }
            if cni
                .and_then(|c| c.flannel.as_ref())
                .and_then(|f| f.kube_network_policies_enabled)
                == Some(true)
            {
                r.warn(
                    "cluster.network.cni.flannel.kubeNetworkPoliciesEnabled",
                    "not applied by talos-rs: flannel's kube-network-policies container is not rendered",
                );
            }
        }
    }
    if let Some(lifetime) = cluster
        .admin_kubeconfig
        .as_ref()
        .and_then(|a| a.cert_lifetime.as_deref())
    {
        if let Err(e) = checks::check_go_duration(lifetime) {
            r.error("cluster.adminKubeconfig.certLifetime", e);
        }
    }
    if let Some(api) = &cluster.api_server {
        if !api.authorization_config.is_empty() {
            if api
                .extra_args
                .keys()
                .any(|k| k == "authorization-mode" || k.starts_with("authorization-webhook-"))
            {
                // As upstream: kube-apiserver takes one or the other.
                r.error(
                    "cluster.apiServer.authorizationConfig",
                    "authorizationConfig cannot be used together with the authorization-mode \
                     or authorization-webhook-* extra args",
                );
            } else {
                r.warn(
                    "cluster.apiServer.authorizationConfig",
                    "not applied by talos-rs: the authorization configuration file is not \
                     rendered (kube-apiserver authorizes with Node and RBAC)",
                );
            }
        }
        for (i, plugin) in api.admission_control.iter().enumerate() {
            if !is_set(&plugin.name) {
                r.error(
                    join_key(&join_index("cluster.apiServer.admissionControl", i), "name"),
                    "admission plugin name is required",
                );
            }
        }
    }
    if cluster.allow_scheduling_on_masters.is_some() {
        r.warn(
            "cluster.allowSchedulingOnMasters",
            "allowSchedulingOnMasters is deprecated, use allowSchedulingOnControlPlanes",
        );
    }
}

fn validate_cni(cluster: &ClusterConfig, r: &mut Report) {
    let cni = cluster.network.as_ref().and_then(|n| n.cni.as_ref());
    let name = cni.and_then(|c| c.name.as_deref()).unwrap_or("flannel");
    let urls: &[String] = cni.map(|c| c.urls.as_slice()).unwrap_or_default();
    let flannel = cni.and_then(|c| c.flannel.as_ref());
    let flannel_args = flannel.is_some_and(|f| !f.extra_args.is_empty());
    let flannel_policies = flannel.and_then(|f| f.kube_network_policies_enabled) == Some(true);
    let base = "cluster.network.cni";
    match name {
        "flannel" => {
            if !urls.is_empty() {
                r.error(format!("{base}.urls"), "\"urls\" field should be empty for \"flannel\" CNI");
            }
        }
        "none" | "custom" => {
            if name == "none" && !urls.is_empty() {
                r.error(format!("{base}.urls"), "\"urls\" field should be empty for \"none\" CNI");
            }
            if name == "custom" && urls.is_empty() {
                r.warn(format!("{base}.urls"), "\"urls\" field should not be empty for \"custom\" CNI");
            }
            if flannel_args {
                r.error(
                    format!("{base}.flannel.extraArgs"),
                    format!("flannel extraArgs should be empty for {name:?} CNI"),
                );
            }
            if flannel_policies {
                r.error(
                    format!("{base}.flannel.kubeNetworkPoliciesEnabled"),
                    format!("flannel network policies should not be enabled for {name:?} CNI"),
                );
            }
            validate_url_list(urls, &format!("{base}.urls"), "CNI manifest URL", r);
        }
        other => r.error(
            format!("{base}.name"),
            format!("unsupported CNI {other:?}: cni name should be one of [\"flannel\", \"custom\", \"none\"]"),
        ),
    }
}

fn validate_install_required(machine: &MachineConfig, r: &mut Report) {
    let has_disk = machine
        .install
        .as_ref()
        .is_some_and(|i| is_set(&i.disk) || i.disk_selector.is_some());
    if !has_disk {
        r.error(
            "machine.install.disk",
            "either install disk or diskSelector should be defined",
        );
    }
}

fn validate_install(machine: &MachineConfig, r: &mut Report) {
    let Some(install) = &machine.install else {
        return;
    };
    if let Some(disk) = install.disk.as_deref().filter(|d| !d.is_empty()) {
        if !disk.starts_with('/') {
            r.error(
                "machine.install.disk",
                format!("install disk {disk:?} must be an absolute device path"),
            );
        }
    }
    if let Some(size) = install
        .disk_selector
        .as_ref()
        .and_then(|s| s.size.as_deref())
    {
        if let Err(e) = checks::check_size_condition(size) {
            r.error(
                "machine.install.diskSelector.size",
                format!("install disk selector is invalid: {e}"),
            );
        }
    }
    if let Some(t) = install
        .disk_selector
        .as_ref()
        .and_then(|s| s.disk_type.as_deref())
    {
        if !matches!(t, "ssd" | "hdd" | "nvme" | "sd" | "") {
            r.error(
                "machine.install.diskSelector.type",
                format!("unknown disk type {t:?} (expected ssd, hdd, nvme or sd)"),
            );
        }
    }
    if !install.extra_kernel_args.is_empty() && install.grub_use_uki_cmdline == Some(true) {
        r.error(
            "machine.install.extraKernelArgs",
            "install.extraKernelArgs and install.grubUseUKICmdline can't be used together",
        );
    }
    let mut seen = HashSet::new();
    for (i, ext) in install.extensions.iter().enumerate() {
        let image = str_of(&ext.image);
        if !seen.insert(image) {
            r.error(
                join_key(&join_index("machine.install.extensions", i), "image"),
                format!("duplicate system extension {image:?}"),
            );
        }
    }
    if !install.extensions.is_empty() {
        r.warn(
            "machine.install.extensions",
            ".machine.install.extensions is deprecated, use a custom installer image",
        );
    }
}

fn validate_features(machine: &MachineConfig, control_plane: bool, r: &mut Report) {
    let Some(features) = &machine.features else {
        return;
    };
    if let Some(dns) = &features.host_dns {
        if dns.forward_kube_dns_to_host == Some(true) && dns.enabled != Some(true) {
            r.error(
                "machine.features.hostDNS.forwardKubeDNSToHost",
                "feature hostDNS.forwardKubeDNSToHost requires hostDNS.enabled to be true",
            );
        }
    }
    if let Some(access) = &features.kubernetes_talos_api_access {
        if !control_plane {
            r.error(
                "machine.features.kubernetesTalosAPIAccess",
                "feature Kubernetes Talos API Access can only be enabled on control plane machines",
            );
        }
        for (i, role) in access.allowed_roles.iter().enumerate() {
            if !TALOS_ROLES.contains(&role.as_str()) {
                r.error(
                    join_index("machine.features.kubernetesTalosAPIAccess.allowedRoles", i),
                    format!(
                        "invalid role {role:?} in allowed roles for Kubernetes Talos API Access"
                    ),
                );
            }
        }
    }
    if let Some(alg) = features.node_address_sort_algorithm.as_deref() {
        if !matches!(alg, "" | "v1" | "v2") {
            r.error(
                "machine.features.nodeAddressSortAlgorithm",
                format!("invalid node address sort algorithm {alg:?} (expected v1 or v2)"),
            );
        }
    }
    if let Some(port) = features.kube_prism.as_ref().and_then(|k| k.port) {
        if port == 0 {
            r.error(
                "machine.features.kubePrism.port",
                "KubePrism port must not be 0",
            );
        }
    }
}

fn mtu_check(mtu: Option<u32>, path: &str, r: &mut Report) {
    if let Some(mtu) = mtu.filter(|m| *m != 0) {
        if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
            r.error(
                path,
                format!("MTU {mtu} is out of range {MIN_MTU}..={MAX_MTU}"),
            );
        }
    }
}

fn validate_network(
    network: &super::v1alpha1::NetworkConfig,
    machine_type: Option<MachineType>,
    r: &mut Report,
) {
    let _ = machine_type;
    let base = "machine.network";
    if let Some(hostname) = network.hostname.as_deref().filter(|h| !h.is_empty()) {
        if !checks::is_valid_hostname(hostname) {
            r.error(
                format!("{base}.hostname"),
                format!("{hostname:?} is not a valid hostname"),
            );
        }
    }
    for (i, ns) in network.nameservers.iter().enumerate() {
        if let Err(e) = checks::parse_ip(ns) {
            r.error(join_index(&format!("{base}.nameservers"), i), e);
        }
    }
    for (i, host) in network.extra_host_entries.iter().enumerate() {
        let path = join_index(&format!("{base}.extraHostEntries"), i);
        if let Err(e) = checks::parse_ip(str_of(&host.ip)) {
            r.error(join_key(&path, "ip"), e);
        }
    }

    // Links that are members of a bond or bridge: member name -> (owner link, path of the claim).
    let mut members: HashMap<String, String> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, device) in network.interfaces.iter().enumerate() {
        let path = join_index(&format!("{base}.interfaces"), i);
        if let Some(name) = device.interface.as_deref().filter(|n| !n.is_empty()) {
            if let Some(first) = names.insert(name, i) {
                r.error(
                    join_key(&path, "interface"),
                    format!(
                        "interface {name:?} is configured more than once (also at {base}.interfaces[{first}])"
                    ),
                );
            }
        }
        if device.bond.is_some() && device.bridge.is_some() {
            r.error(
                path.clone(),
                format!(
                    "interface {:?} has both bridge and bond sections set: config sections are mutually exclusive",
                    device.name()
                ),
            );
        }
        let (section, list): (&str, &[String]) = match (&device.bond, &device.bridge) {
            (Some(bond), _) => ("bond", &bond.interfaces),
            (None, Some(bridge)) => ("bridge", &bridge.interfaces),
            (None, None) => ("", &[]),
        };
        for (j, member) in list.iter().enumerate() {
            let owner = device.name().to_owned();
            match members.get(member) {
                Some(other) if *other != owner => r.error(
                    join_index(&format!("{path}.{section}.interfaces"), j),
                    format!(
                        "interface {member:?} is declared as part of two separate links: {other:?} and {owner:?}"
                    ),
                ),
                _ => {
                    members.insert(member.clone(), owner);
                }
            }
        }
    }

    for (i, device) in network.interfaces.iter().enumerate() {
        if device.is_ignored() {
            continue;
        }
        let path = join_index(&format!("{base}.interfaces"), i);
        validate_device(device, &path, &members, r);
    }
}

fn validate_device(device: &Device, path: &str, members: &HashMap<String, String>, r: &mut Report) {
    let has_name = device.interface.as_deref().is_some_and(|n| !n.is_empty());
    match (has_name, &device.device_selector) {
        (false, None) => r.error(path, "either interface or deviceSelector is required"),
        (true, Some(_)) => r.error(path, "interface and deviceSelector are mutually exclusive"),
        _ => {}
    }
    if device
        .device_selector
        .as_ref()
        .is_some_and(|s| s.is_empty())
    {
        r.error(
            join_key(path, "deviceSelector"),
            "config section should contain at least one field",
        );
    }
    if let Some(bond) = &device.bond {
        validate_bond(bond, &join_key(path, "bond"), r);
    }
    if let Some(bridge) = &device.bridge {
        if bridge.interfaces.is_empty() {
            r.warn(
                join_key(path, "bridge.interfaces"),
                "bridge has no member interfaces",
            );
        }
    }
    if device
        .bridge_port
        .as_ref()
        .is_some_and(|p| !is_set(&p.master))
    {
        r.error(
            join_key(path, "bridgePort.master"),
            "bridge port master is required",
        );
    }
    if let Some(wg) = &device.wireguard {
        validate_wireguard(wg, &join_key(path, "wireguard"), r);
    }

    // Addressing.
    let name = device.name();
    if members.contains_key(name) && !name.is_empty() {
        let addressed = device.dhcp == Some(true)
            || is_set(&device.cidr)
            || !device.addresses.is_empty()
            || device.vip.is_some();
        if addressed {
            r.error(
                path,
                format!("bonded/bridged interface {name:?} shouldn't have any addressing methods configured"),
            );
        }
    }
    if !device.addresses.is_empty() && is_set(&device.cidr) {
        r.error(path, "interface can't have both .cidr and .addresses set");
    }
    if let Some(cidr) = device.cidr.as_deref().filter(|c| !c.is_empty()) {
        if let Err(e) = checks::check_ip_or_cidr(cidr) {
            r.error(join_key(path, "cidr"), e);
        }
        r.warn(
            join_key(path, "cidr"),
            "machine.network.interface.cidr is deprecated, please use machine.network.interface.addresses",
        );
    }
    for (j, address) in device.addresses.iter().enumerate() {
        if let Err(e) = checks::check_ip_or_cidr(address) {
            r.error(join_index(&join_key(path, "addresses"), j), e);
        }
    }
    if let Some(vip) = &device.vip {
        if let Err(e) = checks::parse_ip(str_of(&vip.ip)) {
            r.error(join_key(path, "vip.ip"), e);
        }
    }
    validate_routes(&device.routes, &join_key(path, "routes"), r);
    mtu_check(device.mtu, &join_key(path, "mtu"), r);
    validate_vlans(&device.vlans, &join_key(path, "vlans"), r);
    validate_duid(
        device.dhcp_options.as_ref(),
        &join_key(&join_key(path, "dhcpOptions"), "duidv6"),
        r,
    );
}

/// Whether `hex` (`:` separators allowed) is a DUID of a known type (RFC 8415 §11) with its
/// fixed part, at most 130 bytes.
fn is_duid(hex: &str) -> bool {
    let digits: Vec<u8> = hex.bytes().filter(|c| *c != b':').collect();
    if !digits.len().is_multiple_of(2) || !digits.iter().all(u8::is_ascii_hexdigit) {
        return false;
    }
    let bytes: Vec<u8> = digits
        .chunks(2)
        .filter_map(|p| std::str::from_utf8(p).ok())
        .filter_map(|t| u8::from_str_radix(t, 16).ok())
        .collect();
    let min = match bytes.get(..2) {
        Some([0, 1]) => 8,
        Some([0, 2]) => 7,
        Some([0, 3]) => 5,
        Some([0, 4]) => 18,
        _ => return false,
    };
    (min..=130).contains(&bytes.len())
}

/// An unusable `duidv6` does not stop DHCPv6 (upstream ignores it too): the DUID of the link's
/// MAC is sent instead, which is worth a warning.
fn validate_duid(options: Option<&super::v1alpha1::DhcpOptions>, path: &str, r: &mut Report) {
    if let Some(duid) = options
        .and_then(|o| o.duidv6.as_deref())
        .filter(|d| !d.is_empty())
    {
        if !is_duid(duid) {
            r.warn(
                path,
                format!("{duid:?} is not a valid DUID: the DUID of the link's MAC address is used instead"),
            );
        }
    }
}

fn validate_routes(routes: &[Route], base: &str, r: &mut Report) {
    for (i, route) in routes.iter().enumerate() {
        let path = join_index(base, i);
        let network = str_of(&route.network);
        let gateway = str_of(&route.gateway);
        if !network.is_empty() {
            if let Err(e) = checks::parse_cidr(network) {
                r.error(
                    join_key(&path, "network"),
                    format!("invalid network address: {e}"),
                );
            }
        }
        if !gateway.is_empty() {
            if let Err(e) = checks::parse_ip(gateway) {
                r.error(
                    join_key(&path, "gateway"),
                    format!("invalid network address: {e}"),
                );
            }
        }
        if network.is_empty() && gateway.is_empty() {
            r.error(path.clone(), "either network or gateway should be set");
        }
        if let Some(source) = route.source.as_deref().filter(|s| !s.is_empty()) {
            if let Err(e) = checks::parse_ip(source) {
                r.error(
                    join_key(&path, "source"),
                    format!("invalid network address: {e}"),
                );
            }
        }
        mtu_check(route.mtu, &join_key(&path, "mtu"), r);
    }
}

fn validate_vlans(vlans: &[Vlan], base: &str, r: &mut Report) {
    let mut ids = HashSet::new();
    for (i, vlan) in vlans.iter().enumerate() {
        let path = join_index(base, i);
        match vlan.vlan_id {
            None | Some(0) => r.error(join_key(&path, "vlanId"), "vlan ID is required (1..4095)"),
            Some(id) if id > 4095 => r.error(
                join_key(&path, "vlanId"),
                format!("vlan ID {id} is out of range 1..4095"),
            ),
            Some(id) => {
                if !ids.insert(id) {
                    r.error(join_key(&path, "vlanId"), format!("duplicate vlan ID {id}"));
                }
            }
        }
        if !vlan.addresses.is_empty() && is_set(&vlan.cidr) {
            r.error(
                path.clone(),
                "vlan can't have both .cidr and .addresses set",
            );
        }
        if let Some(cidr) = vlan.cidr.as_deref().filter(|c| !c.is_empty()) {
            if let Err(e) = checks::check_ip_or_cidr(cidr) {
                r.error(join_key(&path, "cidr"), e);
            }
        }
        for (j, address) in vlan.addresses.iter().enumerate() {
            if let Err(e) = checks::check_ip_or_cidr(address) {
                r.error(join_index(&join_key(&path, "addresses"), j), e);
            }
        }
        if let Some(vip) = &vlan.vip {
            if let Err(e) = checks::parse_ip(str_of(&vip.ip)) {
                r.error(join_key(&path, "vip.ip"), e);
            }
        }
        validate_routes(&vlan.routes, &join_key(&path, "routes"), r);
        mtu_check(vlan.mtu, &join_key(&path, "mtu"), r);
        validate_duid(
            vlan.dhcp_options.as_ref(),
            &join_key(&join_key(&path, "dhcpOptions"), "duidv6"),
            r,
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BondMode {
    RoundRobin,
    ActiveBackup,
    Xor,
    Broadcast,
    Lacp,
    Tlb,
    Alb,
}

impl BondMode {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "balance-rr" => Self::RoundRobin,
            "active-backup" => Self::ActiveBackup,
            "balance-xor" => Self::Xor,
            "broadcast" => Self::Broadcast,
            "802.3ad" => Self::Lacp,
            "balance-tlb" => Self::Tlb,
            "balance-alb" => Self::Alb,
            _ => return None,
        })
    }
}

fn check_enum(value: &Option<String>, allowed: &[&str], path: String, what: &str, r: &mut Report) {
    if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
        if !allowed.contains(&v) {
            r.error(
                path,
                format!(
                    "invalid {what} {v:?} (expected one of {})",
                    allowed.join(", ")
                ),
            );
        }
    }
}

fn validate_bond(bond: &Bond, path: &str, r: &mut Report) {
    if !bond.interfaces.is_empty() && !bond.device_selectors.is_empty() {
        r.error(
            path,
            "bond has both interfaces and deviceSelectors set: config sections are mutually exclusive",
        );
    }
    for (i, selector) in bond.device_selectors.iter().enumerate() {
        if selector.is_empty() {
            r.error(
                join_index(&join_key(path, "deviceSelectors"), i),
                "config section should contain at least one field",
            );
        }
    }
    let mode_name = str_of(&bond.mode);
    let mode = BondMode::parse(mode_name);
    if mode.is_none() {
        r.error(
            join_key(path, "mode"),
            format!(
                "invalid bond mode {mode_name:?} (expected one of balance-rr, active-backup, balance-xor, broadcast, 802.3ad, balance-tlb, balance-alb)"
            ),
        );
    }
    let k = |f: &str| join_key(path, f);
    check_enum(
        &bond.xmit_hash_policy,
        &[
            "layer2",
            "layer3+4",
            "layer2+3",
            "encap2+3",
            "encap3+4",
            "vlan+srcmac",
        ],
        k("xmitHashPolicy"),
        "transmit hash policy",
        r,
    );
    check_enum(
        &bond.lacp_rate,
        &["slow", "fast"],
        k("lacpRate"),
        "LACP rate",
        r,
    );
    check_enum(
        &bond.arp_validate,
        &[
            "none",
            "active",
            "backup",
            "all",
            "filter",
            "filter_active",
            "filter_backup",
        ],
        k("arpValidate"),
        "ARP validate",
        r,
    );
    check_enum(
        &bond.arp_all_targets,
        &["any", "all"],
        k("arpAllTargets"),
        "ARP all targets",
        r,
    );
    check_enum(
        &bond.primary_reselect,
        &["always", "better", "failure"],
        k("primaryReselect"),
        "primary reselect",
        r,
    );
    check_enum(
        &bond.fail_over_mac,
        &["none", "active", "follow"],
        k("failOverMac"),
        "fail over MAC",
        r,
    );
    check_enum(
        &bond.ad_select,
        &["stable", "bandwidth", "count"],
        k("adSelect"),
        "AD select",
        r,
    );

    let miimon = bond.miimon.unwrap_or(0);
    let updelay = bond.updelay.unwrap_or(0);
    let downdelay = bond.downdelay.unwrap_or(0);
    if miimon == 0 {
        if updelay != 0 {
            r.error(k("updelay"), "bond.upDelay can't be set if miiMon is zero");
        }
        if downdelay != 0 {
            r.error(
                k("downdelay"),
                "bond.downDelay can't be set if miiMon is zero",
            );
        }
    } else {
        if !updelay.is_multiple_of(miimon) {
            r.error(k("updelay"), "bond.upDelay should be a multiple of miiMon");
        }
        if !downdelay.is_multiple_of(miimon) {
            r.error(
                k("downdelay"),
                "bond.downDelay should be a multiple of miiMon",
            );
        }
    }
    if !bond.arp_ip_target.is_empty() {
        r.error(k("arpIPTarget"), "bond.arpIPTarget is not supported");
    }
    if is_set(&bond.ad_actor_system) {
        r.error(k("adActorSystem"), "bond.adActorSystem is not supported");
    }
    let Some(mode) = mode else {
        return;
    };
    let lb = matches!(mode, BondMode::Lacp | BondMode::Alb | BondMode::Tlb);
    if is_set(&bond.lacp_rate) && mode != BondMode::Lacp {
        r.error(
            k("lacpRate"),
            "bond.lacpRate is only available in 802.3ad mode",
        );
    }
    if lb && is_set(&bond.arp_validate) {
        r.error(
            k("arpValidate"),
            format!("bond.arpValidate is not available in {mode_name} mode"),
        );
    }
    if !matches!(mode, BondMode::ActiveBackup | BondMode::Alb | BondMode::Tlb)
        && is_set(&bond.primary)
    {
        r.error(
            k("primary"),
            format!("bond.primary is not available in {mode_name} mode"),
        );
    }
    if lb && bond.arp_interval.unwrap_or(0) > 0 {
        r.error(
            k("arpInterval"),
            format!("bond.arpInterval is not available in {mode_name} mode"),
        );
    }
    if mode != BondMode::RoundRobin && bond.packets_per_slave.unwrap_or(0) > 1 {
        r.error(
            k("packetsPerSlave"),
            format!("bond.packetsPerSlave is not available in {mode_name} mode"),
        );
    }
    if !matches!(mode, BondMode::Alb | BondMode::Tlb) && bond.tlb_dynamic_lb.unwrap_or(0) > 0 {
        r.error(
            k("tlbDynamicLb"),
            format!("bond.tlbDynamicLb is not available in {mode_name} mode"),
        );
    }
    if mode != BondMode::Lacp && bond.ad_actor_sys_prio.unwrap_or(0) > 0 {
        r.error(
            k("adActorSysPrio"),
            "bond.adActorSysPrio is only available in 802.3ad mode",
        );
    }
    if mode != BondMode::Lacp && bond.ad_user_port_key.unwrap_or(0) > 0 {
        r.error(
            k("adUserPortKey"),
            "bond.adUserPortKey is only available in 802.3ad mode",
        );
    }
}

fn check_wireguard_key(key: &str) -> Result<(), String> {
    match checks::decode_base64(key) {
        None => Err(format!("key {key:?} is not valid base64")),
        Some(raw) if raw.len() != 32 => Err(format!("wrong key {key:?} length: {}", raw.len())),
        Some(_) => Ok(()),
    }
}

fn validate_wireguard(wg: &DeviceWireguardConfig, path: &str, r: &mut Report) {
    if let Err(e) = check_wireguard_key(str_of(&wg.private_key)) {
        r.error(
            join_key(path, "privateKey"),
            format!("private key is invalid: {e}"),
        );
    }
    for (i, peer) in wg.peers.iter().enumerate() {
        let peer_path = join_index(&join_key(path, "peers"), i);
        if let Err(e) = check_wireguard_key(str_of(&peer.public_key)) {
            r.error(
                join_key(&peer_path, "publicKey"),
                format!("public key invalid: {e}"),
            );
        }
        if let Some(endpoint) = peer.endpoint.as_deref().filter(|e| !e.is_empty()) {
            if let Err(e) = checks::check_host_port(endpoint) {
                r.error(
                    join_key(&peer_path, "endpoint"),
                    format!("peer endpoint is invalid: {e}"),
                );
            }
        }
        if let Some(interval) = peer.persistent_keepalive_interval.as_deref() {
            if let Err(e) = checks::check_go_duration(interval) {
                r.error(join_key(&peer_path, "persistentKeepaliveInterval"), e);
            }
        }
        for (j, ip) in peer.allowed_ips.iter().enumerate() {
            if let Err(e) = checks::parse_cidr(ip) {
                r.error(
                    join_index(&join_key(&peer_path, "allowedIPs"), j),
                    format!("peer allowed IP is invalid: {e}"),
                );
            }
        }
    }
}

fn validate_kubespan(machine: &MachineConfig, cluster: Option<&ClusterConfig>, r: &mut Report) {
    let Some(kubespan) = machine
        .network
        .as_ref()
        .and_then(|n| n.kubespan.as_ref())
        .filter(|k| k.enabled == Some(true))
    else {
        return;
    };
    let base = "machine.network.kubespan";
    let mtu = kubespan.mtu.unwrap_or(KUBESPAN_DEFAULT_MTU);
    if mtu < KUBESPAN_MIN_MTU {
        r.error(
            format!("{base}.mtu"),
            format!("kubespan link MTU must be at least {KUBESPAN_MIN_MTU}"),
        );
    }
    let discovery = cluster
        .and_then(|c| c.discovery.as_ref())
        .and_then(|d| d.enabled)
        == Some(true);
    if !discovery {
        r.error(
            "cluster.discovery.enabled",
            ".cluster.discovery should be enabled when .machine.network.kubespan is enabled",
        );
    }
    if let Some(filters) = &kubespan.filters {
        validate_subnets(
            &filters.endpoints,
            &format!("{base}.filters.endpoints"),
            true,
            r,
        );
        for (i, cidr) in filters.exclude_advertised_networks.iter().enumerate() {
            if let Err(e) = checks::parse_cidr(cidr) {
                r.error(
                    join_index(&format!("{base}.filters.excludeAdvertisedNetworks"), i),
                    e,
                );
            }
        }
    }
}

fn validate_kubelet(machine: &MachineConfig, r: &mut Report) {
    let Some(kubelet) = &machine.kubelet else {
        return;
    };
    let base = "machine.kubelet";
    if let Some(node_ip) = &kubelet.node_ip {
        validate_subnets(
            &node_ip.valid_subnets,
            &format!("{base}.nodeIP.validSubnets"),
            true,
            r,
        );
    }
    for (i, ip) in kubelet.cluster_dns.iter().enumerate() {
        if let Err(e) = checks::parse_ip(ip) {
            r.error(join_index(&format!("{base}.clusterDNS"), i), e);
        }
    }
    match &kubelet.extra_config {
        Some(serde_yaml_ng::Value::Mapping(map)) => {
            let mut protected: Vec<&str> = PROTECTED_KUBELET_FIELDS.to_vec();
            for f in crate::resources::k8s::KUBELET_PROTECTED_FIELDS {
                if !protected.contains(f) {
                    protected.push(f);
                }
            }
            for field in protected {
                if map.contains_key(field) {
                    r.error(
                        join_key(&format!("{base}.extraConfig"), field),
                        format!("kubelet configuration field {field:?} can't be overridden"),
                    );
                }
            }
        }
        Some(serde_yaml_ng::Value::Null) | None => {}
        Some(_) => r.error(
            format!("{base}.extraConfig"),
            "kubelet extraConfig must be a mapping",
        ),
    }
    for k in kubelet.extra_args.keys() {
        if crate::resources::k8s::KUBELET_DENIED_ARGS.contains(&k.as_str()) {
            r.error(
                join_key(&format!("{base}.extraArgs"), k),
                format!("extra arg {k:?} is not allowed: the node pins it"),
            );
        }
    }
    for (i, mount) in kubelet.extra_mounts.iter().enumerate() {
        let path = join_index(&format!("{base}.extraMounts"), i);
        if !mount
            .destination
            .as_deref()
            .is_some_and(|d| d.starts_with('/'))
        {
            r.error(
                join_key(&path, "destination"),
                "mount destination must be an absolute path",
            );
        }
    }
}

fn validate_disks(machine: &MachineConfig, r: &mut Report) {
    for (i, disk) in machine.disks.iter().enumerate() {
        let path = join_index("machine.disks", i);
        for (j, partition) in disk.partitions.iter().enumerate() {
            let ppath = join_index(&join_key(&path, "partitions"), j);
            let size = match &partition.size {
                None => 0,
                Some(super::v1alpha1::DiskSize::Bytes(b)) => *b,
                Some(super::v1alpha1::DiskSize::Human(s)) => match checks::parse_byte_size(s) {
                    Ok(b) => b,
                    Err(e) => {
                        r.error(join_key(&ppath, "size"), e);
                        1
                    }
                },
            };
            if size == 0 && j + 1 != disk.partitions.len() {
                r.error(
                    ppath,
                    format!(
                        "partition for disk {:?} is set to occupy full disk, but it's not the last partition in the list",
                        str_of(&disk.device)
                    ),
                );
            }
        }
    }
    if !machine.disks.is_empty() {
        r.warn(
            "machine.disks",
            ".machine.disks is deprecated, use UserVolumeConfig documents",
        );
    }
}

fn validate_encryption_partition(cfg: &EncryptionConfig, path: &str, label: &str, r: &mut Report) {
    if cfg.keys.is_empty() {
        r.error(
            join_key(path, "keys"),
            format!("partition {label:?}: no encryption keys provided"),
        );
    }
    let mut slots = HashSet::new();
    for (i, key) in cfg.keys.iter().enumerate() {
        let kpath = join_index(&join_key(path, "keys"), i);
        let slot = key.slot.unwrap_or(0);
        if !slots.insert(slot) {
            r.error(
                join_key(&kpath, "slot"),
                format!("partition {label:?}: encryption key slot {slot} is already in use"),
            );
        }
        if key.node_id.is_none()
            && key.static_key.is_none()
            && key.kms.is_none()
            && key.tpm.is_none()
        {
            r.error(
                kpath,
                format!("partition {label:?}: encryption key at slot {slot} doesn't have the configuration parameters"),
            );
        }
    }
}

fn validate_encryption(machine: &MachineConfig, r: &mut Report) {
    let Some(enc) = &machine.system_disk_encryption else {
        return;
    };
    if let Some(cfg) = &enc.ephemeral {
        validate_encryption_partition(
            cfg,
            "machine.systemDiskEncryption.ephemeral",
            "EPHEMERAL",
            r,
        );
    }
    if let Some(cfg) = &enc.state {
        validate_encryption_partition(cfg, "machine.systemDiskEncryption.state", "STATE", r);
    }
}

fn validate_logging(machine: &MachineConfig, r: &mut Report) {
    let Some(logging) = &machine.logging else {
        return;
    };
    for (i, dest) in logging.destinations.iter().enumerate() {
        let path = join_index("machine.logging.destinations", i);
        match dest.endpoint.as_deref() {
            None | Some("") => r.error(join_key(&path, "endpoint"), "logging endpoint is required"),
            Some(endpoint) => match checks::parse_url(endpoint) {
                Err(e) => r.error(join_key(&path, "endpoint"), e),
                Ok(u) => {
                    if !matches!(u.scheme, "tcp" | "udp") {
                        r.error(
                            join_key(&path, "endpoint"),
                            format!("unsupported scheme {:?} (expected tcp or udp)", u.scheme),
                        );
                    }
                    if u.port.is_none() {
                        r.error(
                            join_key(&path, "endpoint"),
                            "logging endpoint requires a port",
                        );
                    }
                }
            },
        }
        let format = str_of(&dest.format);
        if format != "json_lines" {
            r.error(
                join_key(&path, "format"),
                format!("unknown log format {format:?} (expected json_lines)"),
            );
        }
    }
}

fn validate_files(machine: &MachineConfig, r: &mut Report) {
    for (i, file) in machine.files.iter().enumerate() {
        let path = join_index("machine.files", i);
        let op = str_of(&file.op);
        if !matches!(op, "create" | "append" | "overwrite") {
            r.error(
                join_key(&path, "op"),
                format!("unknown file op {op:?} (expected create, append or overwrite)"),
            );
        }
        if !file.path.as_deref().is_some_and(|p| p.starts_with('/')) {
            r.error(join_key(&path, "path"), "file path must be absolute");
        }
        if let Some(mode) = file.permissions {
            if mode.0 > 0o7777 {
                r.error(
                    join_key(&path, "permissions"),
                    format!("invalid file mode {mode}"),
                );
            }
        }
    }
}

fn validate_string_map(
    map: &BTreeMap<String, String>,
    base: &str,
    what: &str,
    check_value: fn(&str) -> Result<(), String>,
    r: &mut Report,
) {
    for (key, value) in map {
        let path = join_key(base, key);
        if let Err(e) = checks::check_label_key(key) {
            r.error(path.clone(), format!("invalid {what}: {e}"));
        }
        if let Err(e) = check_value(value) {
            r.error(path, format!("invalid {what}: {e}"));
        }
    }
}

fn validate_node_metadata(machine: &MachineConfig, r: &mut Report) {
    validate_string_map(
        &machine.node_labels,
        "machine.nodeLabels",
        "node label",
        checks::check_label_value,
        r,
    );
    validate_string_map(
        &machine.node_annotations,
        "machine.nodeAnnotations",
        "node annotation",
        |_| Ok(()),
        r,
    );
    validate_string_map(
        &machine.node_taints,
        "machine.nodeTaints",
        "node taint",
        checks::check_taint_value,
        r,
    );
}

fn validate_misc(machine: &MachineConfig, r: &mut Report) {
    if let Some(registries) = &machine.registries {
        for (host, mirror) in &registries.mirrors {
            if mirror.is_none() {
                r.error(
                    join_key("machine.registries.mirrors", host),
                    "registry mirror is null",
                );
            }
        }
        for (host, config) in &registries.config {
            if config.is_none() {
                r.error(
                    join_key("machine.registries.config", host),
                    "registry config is null",
                );
            }
        }
    }
    if let Some(timeout) = machine
        .time
        .as_ref()
        .and_then(|t| t.boot_timeout.as_deref())
    {
        if let Err(e) = checks::check_go_duration(timeout) {
            r.error("machine.time.bootTimeout", e);
        }
    }
    match &machine.base_runtime_spec_overrides {
        None | Some(serde_yaml_ng::Value::Null) | Some(serde_yaml_ng::Value::Mapping(_)) => {}
        Some(_) => r.error(
            "machine.baseRuntimeSpecOverrides",
            "base runtime spec overrides must be a mapping",
        ),
    }
    let mut names = HashSet::new();
    for (i, profile) in machine.seccomp_profiles.iter().enumerate() {
        let path = join_index("machine.seccompProfiles", i);
        let name = str_of(&profile.name);
        if name.is_empty() {
            r.error(join_key(&path, "name"), "seccomp profile name is required");
        } else if !names.insert(name) {
            r.error(
                join_key(&path, "name"),
                format!("duplicate seccomp profile {name:?}"),
            );
        }
        if !matches!(profile.value, Some(serde_yaml_ng::Value::Mapping(_))) {
            r.error(
                join_key(&path, "value"),
                "seccomp profile value must be a mapping",
            );
        }
    }
    for (i, module) in machine
        .kernel
        .as_ref()
        .map(|k| k.modules.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if !is_set(&module.name) {
            r.error(
                join_key(&join_index("machine.kernel.modules", i), "name"),
                "kernel module name is required",
            );
        }
    }
    for key in machine.sysctls.keys() {
        if key.is_empty() || key.contains(char::is_whitespace) {
            r.error(join_key("machine.sysctls", key), "invalid sysctl name");
        }
    }
}
