//! The Kubernetes control plane (written by k8sd, on control planes): the components'
//! configurations in `controlplane` (raw from the machine configuration, `final-*` with the
//! arguments they run with), the static pods in `k8s`, and the address of the server that
//! serves them to a kubelet as one `PodList`. Types, IDs and namespaces follow upstream's
//! `pkg/machinery/resources/k8s`.
//!
//! No Kubernetes binary runs on a talos-rs node yet: the pods are rendered, validated and
//! served, not run (`StaticPodServerStatuses` says so).

use std::collections::BTreeMap;

use cosi::{ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// The control plane's configurations.
pub const CONTROL_PLANE_NAMESPACE: &str = "controlplane";
/// Static pods and the kubelet.
pub const NAMESPACE: &str = "k8s";
/// IDs of the components (raw configurations and static pods).
pub const APISERVER_ID: &str = "kube-apiserver";
/// See [`APISERVER_ID`].
pub const CONTROLLER_MANAGER_ID: &str = "kube-controller-manager";
/// See [`APISERVER_ID`].
pub const SCHEDULER_ID: &str = "kube-scheduler";
/// The prefix of a final configuration's ID (`final-kube-apiserver`).
pub const FINAL_PREFIX: &str = "final-";
/// The ID of [`StaticPodServerStatusSpec`].
pub const STATIC_POD_SERVER_ID: &str = "static-pod-server-status";
/// Kubernetes' version the pods are rendered for when the configuration names none.
pub const DEFAULT_KUBERNETES_VERSION: &str = "v1.35.0";

/// kube-apiserver's flags a user's `cluster.apiServer.extraArgs` may not give (upstream's
/// deny list: the configuration is refused).
pub const APISERVER_DENIED: &[&str] = &[
    "etcd-servers",
    "client-ca-file",
    "requestheader-client-ca-file",
    "proxy-client-cert-file",
    "proxy-client-key-file",
    "encryption-provider-config",
    "etcd-cafile",
    "etcd-certfile",
    "etcd-keyfile",
    "kubelet-client-certificate",
    "kubelet-client-key",
    "service-account-key-file",
    "service-account-signing-key-file",
    "tls-cert-file",
    "tls-min-version",
    "tls-private-key-file",
    "authorization-config",
];
/// kube-controller-manager's (`cluster.controllerManager.extraArgs`).
pub const CONTROLLER_MANAGER_DENIED: &[&str] = &[
    "cluster-signing-cert-file",
    "cluster-signing-key-file",
    "authentication-kubeconfig",
    "authorization-kubeconfig",
    "root-ca-file",
    "service-account-private-key-file",
];
/// kube-scheduler's (`cluster.scheduler.extraArgs`).
pub const SCHEDULER_DENIED: &[&str] = &[
    "kubeconfig",
    "authentication-kubeconfig",
    "authorization-kubeconfig",
    "config",
];

/// The deny list of a component (by its ID).
pub fn denied(component: &str) -> &'static [&'static str] {
    match component {
        APISERVER_ID => APISERVER_DENIED,
        CONTROLLER_MANAGER_ID => CONTROLLER_MANAGER_DENIED,
        SCHEDULER_ID => SCHEDULER_DENIED,
        _ => &[],
    }
}

/// A control plane component's configuration (upstream's `APIServerConfig`,
/// `ControllerManagerConfig`, `SchedulerConfig` share these fields here): the raw one (ID the
/// component's) from the machine configuration, the final one (`final-<component>`) with
/// `args`, the flags it runs with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentConfig {
    /// Rendered (the controller manager and the scheduler can be disabled).
    pub enabled: bool,
    /// Its image (`registry.k8s.io/<component>:<version>` by default).
    pub image: String,
    /// The control plane endpoint (`cluster.controlPlane.endpoint`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub control_plane_endpoint: String,
    /// kube-apiserver's port (`cluster.apiServer`, 6443).
    #[serde(default)]
    pub local_port: u16,
    /// Pod CIDRs.
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
    /// Service CIDRs.
    #[serde(default, rename = "serviceCIDRs")]
    pub service_cidrs: Vec<String>,
    /// `extraArgs` of the configuration.
    #[serde(default)]
    pub extra_args: BTreeMap<String, String>,
    /// Environment of the container.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment_variables: BTreeMap<String, String>,
    /// The flags (final only), `--k=v`, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

macro_rules! component_type {
    ($name:ident, $type:literal, $doc:literal, [$($taken:literal),*], $sensitive:literal) => {
        #[doc = $doc]
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub ComponentConfig);

        impl ResourceSpec for $name {
            const TYPE: &'static str = $type;
            const DEFAULT_NAMESPACE: &'static str = CONTROL_PLANE_NAMESPACE;

            fn definition() -> ResourceDefinition {
                let d = ResourceDefinition::new(Self::TYPE, CONTROL_PLANE_NAMESPACE)
                    .without_aliases(&[$($taken),*])
                    .with_columns(&[("Enabled", "{.enabled}"), ("Image", "{.image}")]);
                if $sensitive {
                    d.sensitive()
                } else {
                    d
                }
            }
        }
    };
}

component_type!(
    ApiServerConfigSpec,
    "APIServerConfigs.kubernetes.talos.dev",
    "kube-apiserver's configuration (`APIServerConfigs`). Sensitive, as upstream's: its extra \
     arguments and environment may carry credentials.",
    [],
    true
);
component_type!(
    ControllerManagerConfigSpec,
    "ControllerManagerConfigs.kubernetes.talos.dev",
    "kube-controller-manager's configuration (`ControllerManagerConfigs`).",
    [],
    false
);
component_type!(
    SchedulerConfigSpec,
    "SchedulerConfigs.kubernetes.talos.dev",
    "kube-scheduler's configuration (`SchedulerConfigs`): `sc` is SignedCertificates' (trustd).",
    ["sc", "scs"],
    false
);

/// A static pod (`StaticPods`, ID the component's): the whole `v1.Pod`, as upstream's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticPodSpec {
    /// The pod (`k8s-openapi`'s `Pod`, serialized).
    pub pod: serde_json::Value,
}

impl Eq for StaticPodSpec {}

impl ResourceSpec for StaticPodSpec {
    const TYPE: &'static str = "StaticPods.kubernetes.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

/// Where the static pods are served (`StaticPodServerStatuses`, ID
/// `static-pod-server-status`): `http://127.0.0.1:<port>`, one YAML `PodList` of every
/// `StaticPod`, which a kubelet would poll (`staticPodURL`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticPodServerStatusSpec {
    /// The URL.
    pub url: String,
    /// What runs the pods: no kubelet on a talos-rs node yet (rendered and served, not run).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl ResourceSpec for StaticPodServerStatusSpec {
    const TYPE: &'static str = "StaticPodServerStatuses.kubernetes.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("URL", "{.url}")])
    }
}

/// The ID of [`KubeletConfigSpec`] and [`KubeletSpecSpec`].
pub const KUBELET_ID: &str = "kubelet";

/// The kubelet's flags `machine.kubelet.extraArgs` may not give (upstream's deny list).
pub const KUBELET_DENIED_ARGS: &[&str] = &[
    "bootstrap-kubeconfig",
    "kubeconfig",
    "container-runtime",
    "container-runtime-endpoint",
    "config",
    "cert-dir",
];

/// `KubeletConfiguration` fields `machine.kubelet.extraConfig` may not set (upstream's
/// protected fields).
pub const KUBELET_PROTECTED_FIELDS: &[&str] = &[
    "apiVersion",
    "authentication",
    "authorization",
    "cgroupRoot",
    "kind",
    "kubeletCgroups",
    "port",
    "protectKernelDefaults",
    "resolvConf",
    "rotateCertificates",
    "systemCgroups",
    "staticPodPath",
    "seccompDefault",
];

/// The kubelet's configuration from the machine configuration (`KubeletConfigs`, ID
/// `kubelet`; upstream `k8s.KubeletConfigController`), on every node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfigSpec {
    /// Its image.
    pub image: String,
    /// Cluster DNS addresses.
    #[serde(rename = "clusterDNS", default)]
    pub cluster_dns: Vec<String>,
    /// Cluster domain.
    pub cluster_domain: String,
    /// `machine.kubelet.extraArgs`.
    #[serde(default)]
    pub extra_args: BTreeMap<String, String>,
    /// `machine.kubelet.extraConfig`.
    #[serde(default)]
    pub extra_config: BTreeMap<String, serde_json::Value>,
    /// `machine.kubelet.defaultRuntimeSeccompProfileEnabled`.
    #[serde(default)]
    pub default_runtime_seccomp_enabled: bool,
    /// `machine.kubelet.skipNodeRegistration`.
    #[serde(default)]
    pub skip_node_registration: bool,
    /// The static pod server's URL.
    #[serde(rename = "staticPodListURL", default)]
    pub static_pod_list_url: String,
    /// `machine.kubelet.disableManifestsDirectory`.
    #[serde(default)]
    pub disable_manifests_directory: bool,
    /// A control plane (its system reservation is larger).
    #[serde(default)]
    pub control_plane: bool,
}

impl Eq for KubeletConfigSpec {}

impl ResourceSpec for KubeletConfigSpec {
    const TYPE: &'static str = "KubeletConfigs.kubernetes.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // `kc` is KernelCmdlines' (init's). Sensitive, as upstream's: extra arguments and
        // configuration may carry credentials.
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .without_aliases(&["kc", "kcs"])
            .sensitive()
    }
}

/// What the kubelet would run with (`KubeletSpecs`, ID `kubelet`; upstream
/// `k8s.KubeletSpecController`): its flags and its `KubeletConfiguration`. No kubelet runs on
/// a talos-rs node yet: rendered and validated, not run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSpecSpec {
    /// Its image.
    pub image: String,
    /// Its flags, `--k=v`, sorted.
    #[serde(default)]
    pub args: Vec<String>,
    /// The node name it registers.
    #[serde(default)]
    pub expected_nodename: String,
    /// The `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1).
    pub config: serde_json::Value,
}

impl Eq for KubeletSpecSpec {}

impl ResourceSpec for KubeletSpecSpec {
    const TYPE: &'static str = "KubeletSpecs.kubernetes.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // `ks` is KubeletSecrets' (secretsd's). Sensitive, as upstream's (what KubeletConfigs
        // carries, rendered).
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .without_aliases(&["ks", "kss"])
            .with_columns(&[("Nodename", "{.expectedNodename}")])
            .sensitive()
    }
}

/// kube-proxy flags `cluster.proxy.extraArgs` may not give (upstream's deny list).
pub const PROXY_DENIED: &[&str] = &["kubeconfig"];

/// The ID of [`BootstrapManifestsConfigSpec`].
pub const BOOTSTRAP_MANIFESTS_ID: &str = "manifests";

/// What the bootstrap manifests are rendered from (`BootstrapManifestsConfigs`, namespace
/// `controlplane`, ID `manifests`; upstream `k8s.ControlPlaneBootstrapManifestsController`),
/// on control planes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapManifestsConfigSpec {
    /// The API server the in-cluster kubeconfig names (the cluster endpoint).
    pub server: String,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// Pod CIDRs.
    #[serde(rename = "podCIDRs", default)]
    pub pod_cidrs: Vec<String>,
    /// kube-proxy is deployed.
    pub proxy_enabled: bool,
    /// Its image.
    #[serde(default)]
    pub proxy_image: String,
    /// Its flags, upstream's then the user's extra args (sorted by name).
    #[serde(default)]
    pub proxy_args: Vec<String>,
    /// CoreDNS is deployed.
    #[serde(rename = "coreDNSEnabled")]
    pub core_dns_enabled: bool,
    /// Its image.
    #[serde(rename = "coreDNSImage", default)]
    pub core_dns_image: String,
    /// The DNS service's IPv4 address (the 10th of the first IPv4 service CIDR).
    #[serde(rename = "dnsServiceIP", default)]
    pub dns_service_ip: String,
    /// The DNS service's IPv6 address.
    #[serde(rename = "dnsServiceIPv6", default)]
    pub dns_service_ipv6: String,
    /// flannel is the CNI.
    pub flannel_enabled: bool,
    /// Its image.
    #[serde(default)]
    pub flannel_image: String,
    /// Its extra flags.
    #[serde(default)]
    pub flannel_extra_args: Vec<String>,
    /// `KUBERNETES_SERVICE_HOST` for flannel (KubePrism's; empty without it).
    #[serde(default)]
    pub flannel_kube_service_host: String,
    /// `KUBERNETES_SERVICE_PORT` for flannel.
    #[serde(default)]
    pub flannel_kube_service_port: String,
    /// flannel's backend (`vxlan`).
    #[serde(default)]
    pub flannel_backend_type: String,
}

impl ResourceSpec for BootstrapManifestsConfigSpec {
    const TYPE: &'static str = "BootstrapManifestsConfigs.kubernetes.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = CONTROL_PLANE_NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, CONTROL_PLANE_NAMESPACE)
    }
}

/// One bootstrap manifest (`Manifests`, namespace `controlplane`, IDs `00-kubelet-bootstrapping-token`,
/// `05-flannel`, `10-kube-proxy`, `11-core-dns`…; upstream `k8s.ManifestController`): the
/// Kubernetes objects, in order, that the control plane would create once (no API server runs
/// on a talos-rs node yet: rendered, not applied). Sensitive: the bootstrap token's secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestSpec {
    /// The objects (`apiVersion`, `kind`, `metadata`…).
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
}

impl Eq for ManifestSpec {}

impl ResourceSpec for ManifestSpec {
    const TYPE: &'static str = "Manifests.kubernetes.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = CONTROL_PLANE_NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, CONTROL_PLANE_NAMESPACE).sensitive()
    }
}

/// Definitions of every type of both namespaces.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![
        ApiServerConfigSpec::definition(),
        ControllerManagerConfigSpec::definition(),
        SchedulerConfigSpec::definition(),
        StaticPodSpec::definition(),
        StaticPodServerStatusSpec::definition(),
        KubeletConfigSpec::definition(),
        KubeletSpecSpec::definition(),
        BootstrapManifestsConfigSpec::definition(),
        ManifestSpec::definition(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_ids_follow_upstream() {
        assert_eq!(
            ApiServerConfigSpec::TYPE,
            "APIServerConfigs.kubernetes.talos.dev"
        );
        assert_eq!(StaticPodSpec::TYPE, "StaticPods.kubernetes.talos.dev");
        assert_eq!(
            StaticPodServerStatusSpec::TYPE,
            "StaticPodServerStatuses.kubernetes.talos.dev"
        );
        let c = serde_json::to_value(ApiServerConfigSpec(ComponentConfig {
            service_cidrs: vec!["10.96.0.0/12".into()],
            ..ComponentConfig::default()
        }))
        .unwrap();
        assert_eq!(c["serviceCIDRs"][0], "10.96.0.0/12");
        assert!(denied(APISERVER_ID).contains(&"etcd-servers"));
        assert!(denied("kubelet").is_empty());
    }
}
