//! `cluster:` section of the v1alpha1 document.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

use super::{Certificate, CertificateAndKey, PrivateKey, ResourcesConfig};

/// Cluster-wide configuration (`cluster`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterConfig {
    /// Cluster identity for discovery (base64 of 32 random bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Cluster shared secret for discovery (base64 of 32 random bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Control plane endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlaneConfig>,
    /// Cluster name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Kubernetes networking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<ClusterNetworkConfig>,
    /// Kubernetes bootstrap token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Secret encryption at rest with AES-CBC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aescbc_encryption_secret: Option<String>,
    /// Secret encryption at rest with secretbox (preferred).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secretbox_encryption_secret: Option<String>,
    /// Kubernetes root CA (key only on control plane machines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<CertificateAndKey>,
    /// Kubernetes CAs accepted in addition to `ca`.
    #[serde(rename = "acceptedCAs", skip_serializing_if = "Vec::is_empty")]
    pub accepted_cas: Vec<Certificate>,
    /// Front-proxy (aggregation layer) CA.
    #[serde(rename = "aggregatorCA", skip_serializing_if = "Option::is_none")]
    pub aggregator_ca: Option<CertificateAndKey>,
    /// Service account token signing key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<PrivateKey>,
    /// kube-apiserver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_server: Option<ApiServerConfig>,
    /// kube-controller-manager.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_manager: Option<ControllerManagerConfig>,
    /// kube-proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
    /// kube-scheduler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerConfig>,
    /// Cluster member discovery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery: Option<ClusterDiscoveryConfig>,
    /// etcd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdConfig>,
    /// CoreDNS.
    #[serde(rename = "coreDNS", skip_serializing_if = "Option::is_none")]
    pub core_dns: Option<CoreDns>,
    /// External cloud provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_cloud_provider: Option<ExternalCloudProviderConfig>,
    /// URLs of extra manifests applied at bootstrap.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_manifests: Vec<String>,
    /// HTTP headers used to fetch `extraManifests`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_manifest_headers: BTreeMap<String, String>,
    /// Inline manifests applied at bootstrap.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inline_manifests: Vec<ClusterInlineManifest>,
    /// Admin kubeconfig generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_kubeconfig: Option<AdminKubeconfigConfig>,
    /// Deprecated name of `allowSchedulingOnControlPlanes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_scheduling_on_masters: Option<bool>,
    /// Allow workloads on control plane nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_scheduling_on_control_planes: Option<bool>,
}

/// `cluster.controlPlane`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// Canonical control plane endpoint URL, e.g. `https://10.0.0.10:6443`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Port the API server listens on locally (default 6443).
    #[serde(rename = "localAPIServerPort", skip_serializing_if = "Option::is_none")]
    pub local_api_server_port: Option<u16>,
}

/// `cluster.network`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterNetworkConfig {
    /// CNI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniConfig>,
    /// Kubernetes DNS domain (`cluster.local`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_domain: Option<String>,
    /// Pod CIDRs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pod_subnets: Vec<String>,
    /// Service CIDRs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_subnets: Vec<String>,
}

/// `cluster.network.cni`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CniConfig {
    /// `flannel`, `custom` or `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Manifest URLs for `custom`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    /// Flannel options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flannel: Option<FlannelCniConfig>,
}

/// Flannel options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FlannelCniConfig {
    /// Extra flanneld arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Flannel network policies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_network_policies_enabled: Option<bool>,
}

/// An extra volume of a control plane static pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeMountConfig {
    /// Path on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Path in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}

/// `cluster.apiServer`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiServerConfig {
    /// Image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra flags.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Extra volumes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_volumes: Vec<VolumeMountConfig>,
    /// Environment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Extra certificate SANs.
    #[serde(rename = "certSANs", skip_serializing_if = "Vec::is_empty")]
    pub cert_sans: Vec<String>,
    /// Legacy PodSecurityPolicy switch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_pod_security_policy: Option<bool>,
    /// Admission plugin configurations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub admission_control: Vec<AdmissionPluginConfig>,
    /// Audit policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_policy: Option<Value>,
    /// Resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesConfig>,
    /// Authorizers (Node and RBAC are always added).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub authorization_config: Vec<AuthorizationConfigAuthorizer>,
}

/// An admission plugin configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionPluginConfig {
    /// Plugin name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Plugin configuration object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configuration: Option<Value>,
}

/// An authorizer of the API server authorization config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthorizationConfigAuthorizer {
    /// `Node`, `RBAC` or `Webhook`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub authorizer_type: Option<String>,
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Webhook configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Value>,
}

/// `cluster.controllerManager`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ControllerManagerConfig {
    /// Image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra flags.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Extra volumes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_volumes: Vec<VolumeMountConfig>,
    /// Environment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesConfig>,
}

/// `cluster.proxy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyConfig {
    /// Do not deploy kube-proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Proxy mode (`iptables`, `ipvs`, `nftables`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Extra flags.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
}

/// `cluster.scheduler`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SchedulerConfig {
    /// Image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra flags.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Extra volumes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_volumes: Vec<VolumeMountConfig>,
    /// Environment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesConfig>,
    /// KubeSchedulerConfiguration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

/// `cluster.discovery`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterDiscoveryConfig {
    /// Enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Registries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registries: Option<DiscoveryRegistriesConfig>,
}

/// Discovery registries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryRegistriesConfig {
    /// Kubernetes registry (deprecated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<RegistryKubernetesConfig>,
    /// Discovery service registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<RegistryServiceConfig>,
}

/// Kubernetes discovery registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryKubernetesConfig {
    /// Disabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

/// Discovery service registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryServiceConfig {
    /// Disabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Service endpoint (default `https://discovery.talos.dev/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// `cluster.etcd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EtcdConfig {
    /// Image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// etcd CA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<CertificateAndKey>,
    /// Extra flags.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Deprecated: use `advertisedSubnets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// Subnets to pick the advertised IP from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub advertised_subnets: Vec<String>,
    /// Subnets to listen on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listen_subnets: Vec<String>,
}

/// `cluster.coreDNS`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoreDns {
    /// Do not deploy CoreDNS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `cluster.externalCloudProvider`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExternalCloudProviderConfig {
    /// Enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Manifest URLs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<String>,
}

/// An inline manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterInlineManifest {
    /// Unique name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Manifest contents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
}

/// `cluster.adminKubeconfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminKubeconfigConfig {
    /// Certificate lifetime (Go duration, default 1 year).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_lifetime: Option<String>,
}
