//! Machine configuration generation (`talosctl gen config`), as upstream's
//! `pkg/machinery/config/generate` lays the documents out for the v1.10 contract: a control
//! plane's config holds every CA with its key, a worker's only the certificates it must trust
//! (no CA key), both the tokens they join with.
//!
//! Upstream writes documentation comments and examples into the files it generates; these
//! carry none.

use std::fmt;

use serde_yaml_ng::Value;

use super::v1alpha1::{
    AdmissionPluginConfig, ApiServerConfig, ClusterConfig, ClusterDiscoveryConfig,
    ClusterNetworkConfig, ControlPlaneConfig, ControllerManagerConfig, DiscoveryRegistriesConfig,
    EtcdConfig, FeaturesConfig, HostDnsConfig, InstallConfig, KubePrism, KubeletConfig,
    MachineConfig, MachineType, NetworkConfig, ProxyConfig, RegistryKubernetesConfig,
    RegistryServiceConfig, SchedulerConfig, V1Alpha1, VERSION,
};
use super::Config;
use crate::secrets::Bundle;

/// Kubernetes version of generated configs unless told otherwise.
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.33.1";
/// Installer image of generated configs unless told otherwise.
pub const DEFAULT_INSTALL_IMAGE: &str = "ghcr.io/siderolabs/installer:v1.10.3";
/// Install disk of generated configs unless told otherwise.
pub const DEFAULT_INSTALL_DISK: &str = "/dev/sda";
/// Kubernetes DNS domain unless told otherwise.
pub const DEFAULT_DNS_DOMAIN: &str = "cluster.local";
/// KubePrism's port.
pub const KUBE_PRISM_PORT: u16 = 7445;

/// What a generated configuration is made of.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// `cluster.clusterName`.
    pub cluster_name: String,
    /// `cluster.controlPlane.endpoint`: `https://host:port`.
    pub endpoint: String,
    /// The cluster's secrets (validated before use).
    pub secrets: &'a Bundle,
    /// Kubernetes version of the images (without `v`).
    pub kubernetes_version: String,
    /// `machine.install.disk`.
    pub install_disk: String,
    /// `machine.install.image`.
    pub install_image: String,
    /// `cluster.network.dnsDomain`.
    pub dns_domain: String,
    /// Extra SANs of the API server and machine certificates.
    pub additional_sans: Vec<String>,
}

impl<'a> Input<'a> {
    /// An input with upstream's defaults.
    pub fn new(cluster_name: &str, endpoint: &str, secrets: &'a Bundle) -> Input<'a> {
        Input {
            cluster_name: cluster_name.to_string(),
            endpoint: endpoint.to_string(),
            secrets,
            kubernetes_version: DEFAULT_KUBERNETES_VERSION.to_string(),
            install_disk: DEFAULT_INSTALL_DISK.to_string(),
            install_image: DEFAULT_INSTALL_IMAGE.to_string(),
            dns_domain: DEFAULT_DNS_DOMAIN.to_string(),
            additional_sans: Vec::new(),
        }
    }
}

/// Why a configuration cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The secrets bundle is incomplete or broken.
    #[error("secrets bundle: {0}")]
    Secrets(#[from] crate::secrets::SecretsError),
    /// A bad input, with what is wrong.
    #[error("{0}")]
    Input(String),
}

/// The host of an endpoint URL (`https://[::1]:6443` → `::1`), if it is one.
pub fn endpoint_host(endpoint: &str) -> Result<String, GenerateError> {
    let bad = |why: &str| {
        GenerateError::Input(format!(
            "invalid control plane endpoint {endpoint:?}: {why}"
        ))
    };
    let rest = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .ok_or_else(|| bad("it must be a URL, e.g. https://10.5.0.2:6443"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok(host.to_string())
}

/// Default pod and service networks: IPv6 ones when the endpoint is an IPv6 address. As
/// upstream's, the whole endpoint is parsed, so a URL (what `gen config` takes) gets the IPv4
/// ones.
fn networks(endpoint: &str) -> (&'static str, &'static str) {
    if endpoint.parse::<std::net::Ipv6Addr>().is_ok() {
        ("fc00:db8:10::/56", "fc00:db8:20::/112")
    } else {
        ("10.244.0.0/16", "10.96.0.0/12")
    }
}

fn yaml(text: &str) -> Option<Value> {
    serde_yaml_ng::from_str(text).ok()
}

/// Upstream's default PodSecurity admission configuration.
const POD_SECURITY: &str = "\
apiVersion: pod-security.admission.config.k8s.io/v1alpha1
kind: PodSecurityConfiguration
defaults:
    audit: restricted
    audit-version: latest
    enforce: baseline
    enforce-version: latest
    warn: restricted
    warn-version: latest
exemptions:
    namespaces:
        - kube-system
    runtimeClasses: []
    usernames: []
";

/// Upstream's default audit policy.
const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
    - level: Metadata
";

fn features() -> FeaturesConfig {
    FeaturesConfig {
        rbac: Some(true),
        stable_hostname: Some(true),
        apid_check_ext_key_usage: Some(true),
        disk_quota_support: Some(true),
        kube_prism: Some(KubePrism {
            enabled: Some(true),
            port: Some(KUBE_PRISM_PORT),
        }),
        host_dns: Some(HostDnsConfig {
            enabled: Some(true),
            forward_kube_dns_to_host: Some(true),
            resolve_member_names: None,
        }),
        ..FeaturesConfig::default()
    }
}

/// The configuration of a machine of type `role` (`Init` is generated as a control plane).
pub fn generate(input: &Input<'_>, role: MachineType) -> Result<Config, GenerateError> {
    input.secrets.validate()?;
    if input.cluster_name.is_empty() {
        return Err(GenerateError::Input("the cluster name is empty".into()));
    }
    let host = endpoint_host(&input.endpoint)?;
    let (pods, services) = networks(&input.endpoint);
    // `validate` above: every part is there.
    let missing = || GenerateError::Input("incomplete secrets bundle".into());
    let b = input.secrets;
    let certs = b.certs.as_ref().ok_or_else(missing)?;
    let os = certs.os.as_ref().ok_or_else(missing)?;
    let k8s = certs.k8s.as_ref().ok_or_else(missing)?;
    let cluster_secrets = b.cluster.as_ref().ok_or_else(missing)?;
    let k8s_secrets = b.secrets.as_ref().ok_or_else(missing)?;
    let trustd = b.trustdinfo.as_ref().ok_or_else(missing)?;
    let control_plane = role.is_control_plane();
    let kv = &input.kubernetes_version;

    let mut machine = MachineConfig {
        machine_type: Some(
            if control_plane {
                "controlplane"
            } else {
                "worker"
            }
            .to_string(),
        ),
        token: Some(trustd.token.clone()),
        ca: Some(os.to_config(control_plane)),
        cert_sans: input.additional_sans.clone(),
        kubelet: Some(KubeletConfig {
            image: Some(format!("ghcr.io/siderolabs/kubelet:v{kv}")),
            default_runtime_seccomp_profile_enabled: Some(true),
            disable_manifests_directory: Some(true),
            ..KubeletConfig::default()
        }),
        network: Some(NetworkConfig::default()),
        install: Some(InstallConfig {
            disk: Some(input.install_disk.clone()),
            image: Some(input.install_image.clone()),
            wipe: Some(false),
            ..InstallConfig::default()
        }),
        features: Some(features()),
        ..MachineConfig::default()
    };
    let mut cluster = ClusterConfig {
        id: Some(cluster_secrets.id.clone()),
        secret: Some(cluster_secrets.secret.clone()),
        control_plane: Some(ControlPlaneConfig {
            endpoint: Some(input.endpoint.clone()),
            local_api_server_port: None,
        }),
        network: Some(ClusterNetworkConfig {
            cni: None,
            dns_domain: Some(input.dns_domain.clone()),
            pod_subnets: vec![pods.to_string()],
            service_subnets: vec![services.to_string()],
        }),
        token: Some(k8s_secrets.bootstraptoken.clone()),
        ca: Some(k8s.to_config(control_plane)),
        discovery: Some(ClusterDiscoveryConfig {
            enabled: Some(true),
            registries: Some(DiscoveryRegistriesConfig {
                kubernetes: Some(RegistryKubernetesConfig {
                    disabled: Some(true),
                }),
                service: Some(RegistryServiceConfig::default()),
            }),
        }),
        ..ClusterConfig::default()
    };
    if control_plane {
        let etcd = certs.etcd.as_ref().ok_or_else(missing)?;
        let aggregator = certs.k8saggregator.as_ref().ok_or_else(missing)?;
        let sa = certs.k8sserviceaccount.as_ref().ok_or_else(missing)?;
        machine.node_labels.insert(
            "node.kubernetes.io/exclude-from-external-load-balancers".into(),
            String::new(),
        );
        let mut sans = vec![host];
        sans.extend(input.additional_sans.iter().cloned());
        cluster.cluster_name = Some(input.cluster_name.clone());
        cluster.secretbox_encryption_secret = (!k8s_secrets.secretboxencryptionsecret.is_empty())
            .then(|| k8s_secrets.secretboxencryptionsecret.clone());
        cluster.aescbc_encryption_secret = (!k8s_secrets.aescbcencryptionsecret.is_empty())
            .then(|| k8s_secrets.aescbcencryptionsecret.clone());
        cluster.aggregator_ca = Some(aggregator.to_config(true));
        cluster.service_account = Some(sa.to_config());
        cluster.api_server = Some(ApiServerConfig {
            image: Some(format!("registry.k8s.io/kube-apiserver:v{kv}")),
            cert_sans: sans,
            disable_pod_security_policy: Some(true),
            admission_control: vec![AdmissionPluginConfig {
                name: Some("PodSecurity".into()),
                configuration: yaml(POD_SECURITY),
            }],
            audit_policy: yaml(AUDIT_POLICY),
            ..ApiServerConfig::default()
        });
        cluster.controller_manager = Some(ControllerManagerConfig {
            image: Some(format!("registry.k8s.io/kube-controller-manager:v{kv}")),
            ..ControllerManagerConfig::default()
        });
        cluster.proxy = Some(ProxyConfig {
            image: Some(format!("registry.k8s.io/kube-proxy:v{kv}")),
            ..ProxyConfig::default()
        });
        cluster.scheduler = Some(SchedulerConfig {
            image: Some(format!("registry.k8s.io/kube-scheduler:v{kv}")),
            ..SchedulerConfig::default()
        });
        cluster.etcd = Some(EtcdConfig {
            ca: Some(etcd.to_config(true)),
            ..EtcdConfig::default()
        });
    }
    Ok(Config {
        v1alpha1: Some(V1Alpha1 {
            version: Some(VERSION.to_string()),
            debug: Some(false),
            persist: Some(true),
            machine: Some(machine),
            cluster: Some(cluster),
        }),
        documents: Vec::new(),
    })
}

/// The output types of `talosctl gen config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OutputType {
    /// `controlplane.yaml`.
    ControlPlane,
    /// `worker.yaml`.
    Worker,
    /// `talosconfig`.
    TalosConfig,
}

impl OutputType {
    /// Parses upstream's names (`controlplane`, `worker`, `talosconfig`).
    pub fn parse(s: &str) -> Option<OutputType> {
        match s {
            "controlplane" => Some(Self::ControlPlane),
            "worker" => Some(Self::Worker),
            "talosconfig" => Some(Self::TalosConfig),
            _ => None,
        }
    }

    /// The file it is written to in an output directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::ControlPlane => "controlplane.yaml",
            Self::Worker => "worker.yaml",
            Self::TalosConfig => "talosconfig",
        }
    }
}

impl fmt::Display for OutputType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ControlPlane => "controlplane",
            Self::Worker => "worker",
            Self::TalosConfig => "talosconfig",
        })
    }
}
