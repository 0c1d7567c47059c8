//! The kubelet, rendered as upstream's controllers render it (no kubelet runs on a talos-rs
//! node yet: these are validated and published, not run):
//! - `k8s.KubeletConfigController`: `machine.kubelet` and the cluster's DNS settings, with the
//!   static pod server's URL → `KubeletConfigs/kubelet`, on every node;
//! - `k8s.KubeletSpecController`: the kubelet's flags (upstream's, then `extraArgs`; a denied
//!   one refused) and its `KubeletConfiguration` (upstream's `NewKubeletConfiguration`: the
//!   user's `extraConfig` without the protected fields, upstream's forced fields, then
//!   upstream's defaults where unset) → `KubeletSpecs/kubelet`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::config::Config;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::k8s::{
    KubeletConfigSpec, KubeletSpecSpec, StaticPodServerStatusSpec, DEFAULT_KUBERNETES_VERSION,
    KUBELET_DENIED_ARGS, KUBELET_ID, KUBELET_PROTECTED_FIELDS, NAMESPACE, STATIC_POD_SERVER_ID,
};
use machinery::resources::network::{HostnameStatusSpec, HOSTNAME_ID, NAMESPACE as NETWORK};
use serde_json::{json, Value};

/// The 10th address of a service CIDR (upstream's `DNSServiceAddrs`).
pub fn dns_service_ip(cidr: &str) -> Option<String> {
    let net: ipnet::IpNet = cidr.parse().ok()?;
    Some(match net.network() {
        IpAddr::V4(a) => std::net::Ipv4Addr::from(u32::from(a).checked_add(10)?).to_string(),
        IpAddr::V6(a) => std::net::Ipv6Addr::from(u128::from(a).checked_add(10)?).to_string(),
    })
}

/// The kubelet's configuration of a machine configuration.
pub fn kubelet_config(config: &Config, static_pod_url: &str) -> KubeletConfigSpec {
    let machine = config.v1alpha1.as_ref().and_then(|v| v.machine.as_ref());
    let kubelet = machine.and_then(|m| m.kubelet.as_ref());
    let cluster = config.cluster();
    let services: Vec<String> = cluster
        .and_then(|c| c.network.as_ref())
        .map(|n| n.service_subnets.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| vec!["10.96.0.0/12".to_string()]);
    let cluster_dns = match kubelet.map(|k| k.cluster_dns.clone()) {
        Some(d) if !d.is_empty() => d,
        _ => services.iter().filter_map(|s| dns_service_ip(s)).collect(),
    };
    let extra_config = kubelet
        .and_then(|k| k.extra_config.clone())
        .and_then(|v| serde_json::to_value(v).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m.into_iter().collect()),
            _ => None,
        })
        .unwrap_or_default();
    KubeletConfigSpec {
        image: kubelet
            .and_then(|k| k.image.clone())
            .unwrap_or_else(|| format!("ghcr.io/siderolabs/kubelet:{DEFAULT_KUBERNETES_VERSION}")),
        cluster_dns,
        cluster_domain: cluster
            .and_then(|c| c.network.as_ref())
            .and_then(|n| n.dns_domain.clone())
            .unwrap_or_else(|| "cluster.local".to_string()),
        extra_args: kubelet.map(|k| k.extra_args.clone()).unwrap_or_default(),
        extra_config,
        default_runtime_seccomp_enabled: kubelet
            .and_then(|k| k.default_runtime_seccomp_profile_enabled)
            .unwrap_or(false),
        skip_node_registration: kubelet
            .and_then(|k| k.skip_node_registration)
            .unwrap_or(false),
        static_pod_list_url: static_pod_url.to_string(),
        disable_manifests_directory: kubelet
            .and_then(|k| k.disable_manifests_directory)
            .unwrap_or(false),
        control_plane: config.machine_type().is_some_and(|t| t.is_control_plane()),
    }
}

/// A refusal of the kubelet's configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A denied extra arg.
    #[error("extra arg {0:?} is not allowed")]
    Arg(String),
    /// A protected `extraConfig` field.
    #[error("extraConfig field {0:?} is not allowed")]
    Field(String),
}

/// The kubelet's flags and `KubeletConfiguration` for `c` on node `nodename`.
///
/// # Errors
///
/// Every denied extra arg and protected field.
pub fn kubelet_spec(
    c: &KubeletConfigSpec,
    nodename: &str,
) -> Result<KubeletSpecSpec, Vec<Refused>> {
    let mut base = BTreeMap::from([
        ("cert-dir".to_string(), "/var/lib/kubelet/pki".to_string()),
        (
            "config".to_string(),
            "/etc/kubernetes/kubelet.yaml".to_string(),
        ),
        ("hostname-override".to_string(), nodename.to_string()),
    ]);
    if !c.skip_node_registration {
        base.insert(
            "bootstrap-kubeconfig".into(),
            "/etc/kubernetes/bootstrap-kubeconfig".into(),
        );
        base.insert(
            "kubeconfig".into(),
            "/etc/kubernetes/kubeconfig-kubelet".into(),
        );
    }
    let args = super::args::merge(base, &c.extra_args, KUBELET_DENIED_ARGS, &[]);
    let mut refused: Vec<Refused> = match &args {
        Ok(_) => Vec::new(),
        Err(d) => d.iter().map(|d| Refused::Arg(d.0.clone())).collect(),
    };
    refused.extend(
        c.extra_config
            .keys()
            .filter(|k| KUBELET_PROTECTED_FIELDS.contains(&k.as_str()))
            .map(|k| Refused::Field(k.clone())),
    );
    let (Ok(args), true) = (args, refused.is_empty()) else {
        return Err(refused);
    };

    let mut cfg: serde_json::Map<String, Value> = c.extra_config.clone().into_iter().collect();
    let forced = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "staticPodPath": if c.disable_manifests_directory { "" } else { "/etc/kubernetes/manifests" },
        "staticPodURL": c.static_pod_list_url,
        "port": 10250,
        "authentication": {
            "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
            "webhook": {"enabled": !c.skip_node_registration},
            "anonymous": {"enabled": false},
        },
        "authorization": {"mode": if c.skip_node_registration { "AlwaysAllow" } else { "Webhook" }},
        "cgroupRoot": "/",
        "systemCgroups": "/system",
        "kubeletCgroups": "/podruntime/kubelet",
        "rotateCertificates": true,
        "protectKernelDefaults": true,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "resolvConf": "/system/resolved/resolv.conf",
    });
    if let Value::Object(f) = forced {
        cfg.extend(f);
    }
    if c.default_runtime_seccomp_enabled {
        cfg.insert("seccompDefault".into(), Value::Bool(true));
    }
    let memory = if c.control_plane { "512Mi" } else { "384Mi" };
    let defaults = json!({
        "address": "0.0.0.0",
        "oomScoreAdj": -450,
        "clusterDomain": c.cluster_domain,
        "clusterDNS": c.cluster_dns,
        "serializeImagePulls": false,
        "failSwapOn": false,
        "systemReserved": {"cpu": "50m", "pid": "100", "ephemeral-storage": "256Mi", "memory": memory},
        "logging": {"format": "json"},
        "shutdownGracePeriod": "30s",
        "shutdownGracePeriodCriticalPods": "10s",
        "streamingConnectionIdleTimeout": "5m",
        "tlsMinVersion": "VersionTLS13",
    });
    if let Value::Object(d) = defaults {
        for (k, v) in d {
            cfg.entry(k).or_insert(v);
        }
    }
    Ok(KubeletSpecSpec {
        image: c.image.clone(),
        args,
        expected_nodename: nodename.to_string(),
        config: Value::Object(cfg),
    })
}

/// `k8s.KubeletConfigController`.
#[derive(Default)]
pub struct KubeletConfigController;

impl Controller for KubeletConfigController {
    fn name(&self) -> &'static str {
        "k8s.KubeletConfigController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<MachineConfigSpec>(REDACTED_NAMESPACE).with_id(ACTIVE_ID),
            Input::weak::<StaticPodServerStatusSpec>(NAMESPACE).with_id(STATIC_POD_SERVER_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<KubeletConfigSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let (Some(text), Some(server)) = (
            ctx.get::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
                .await?
                .map(|c| c.spec.0),
            ctx.get::<StaticPodServerStatusSpec>(NAMESPACE, STATIC_POD_SERVER_ID)
                .await?,
        ) else {
            return Ok(Action::AwaitChange);
        };
        let Ok(config) = Config::from_yaml(&text) else {
            return Ok(Action::AwaitChange);
        };
        ctx.apply(Resource::new(
            NAMESPACE,
            KUBELET_ID,
            kubelet_config(&config, &server.spec.url),
        ))
        .await?;
        Ok(Action::AwaitChange)
    }
}

/// `k8s.KubeletSpecController`.
#[derive(Default)]
pub struct KubeletSpecController {
    refused: Option<String>,
}

impl Controller for KubeletSpecController {
    fn name(&self) -> &'static str {
        "k8s.KubeletSpecController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<KubeletConfigSpec>(NAMESPACE).with_id(KUBELET_ID),
            Input::weak::<HostnameStatusSpec>(NETWORK).with_id(HOSTNAME_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<KubeletSpecSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let (Some(c), Some(host)) = (
            ctx.get::<KubeletConfigSpec>(NAMESPACE, KUBELET_ID).await?,
            ctx.get::<HostnameStatusSpec>(NETWORK, HOSTNAME_ID).await?,
        ) else {
            return Ok(Action::AwaitChange);
        };
        // Upstream's nodename: the hostname, lower-cased (RFC 1123).
        let nodename = host.spec.hostname.to_lowercase().replace('_', "-");
        match kubelet_spec(&c.spec, &nodename) {
            Ok(spec) => {
                self.refused = None;
                ctx.apply(Resource::new(NAMESPACE, KUBELET_ID, spec))
                    .await?;
            }
            Err(r) => {
                let why = r
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                if self.refused.as_deref() != Some(why.as_str()) {
                    tracing::error!(error = %why, "the kubelet's configuration is refused: its spec stays");
                    self.refused = Some(why);
                }
                if let Some(old) = ctx.get::<KubeletSpecSpec>(NAMESPACE, KUBELET_ID).await? {
                    ctx.apply(old).await?;
                }
            }
        }
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dns_address_is_the_tenth_of_the_service_cidr() {
        assert_eq!(
            dns_service_ip("10.96.0.0/12").as_deref(),
            Some("10.96.0.10")
        );
        assert_eq!(dns_service_ip("fd00::/108").as_deref(), Some("fd00::a"));
        assert_eq!(dns_service_ip("nope"), None);
    }

    #[test]
    fn forced_fields_win_defaults_yield_and_protected_ones_are_refused() {
        let mut c = KubeletConfigSpec {
            image: "k".into(),
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            static_pod_list_url: "http://127.0.0.1:4321".into(),
            ..KubeletConfigSpec::default()
        };
        c.extra_config
            .insert("serializeImagePulls".into(), Value::Bool(true));
        c.extra_args.insert("v".into(), "2".into());
        let s = kubelet_spec(&c, "cp-1").unwrap();
        assert_eq!(s.config["staticPodURL"], "http://127.0.0.1:4321");
        assert_eq!(
            s.config["serializeImagePulls"], true,
            "the user's value stays"
        );
        assert_eq!(s.config["tlsMinVersion"], "VersionTLS13");
        assert_eq!(s.config["systemReserved"]["memory"], "384Mi");
        assert!(s.args.contains(&"--hostname-override=cp-1".to_string()));
        assert!(s.args.contains(&"--v=2".to_string()));

        c.extra_config.insert("port".into(), json!(1234));
        c.extra_args.insert("kubeconfig".into(), "/tmp/x".into());
        let r = kubelet_spec(&c, "cp-1").unwrap_err();
        assert_eq!(
            r,
            vec![
                Refused::Arg("kubeconfig".into()),
                Refused::Field("port".into())
            ]
        );
    }
}
