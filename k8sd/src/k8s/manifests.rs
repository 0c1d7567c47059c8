//! The bootstrap manifests (upstream's `k8s.ControlPlaneBootstrapManifestsController` and
//! `k8s.ManifestController`): on a control plane, `controlplane/BootstrapManifestsConfigs/manifests`
//! from the machine configuration, then one `controlplane/Manifests` resource per upstream
//! manifest ID, each the list of Kubernetes objects upstream's `k8stemplates` build, here with
//! `k8s-openapi`'s types: the kubelet's bootstrap token Secret, the CSR role bindings, the
//! in-cluster kubeconfig, Talos' node RBAC, flannel, kube-proxy and CoreDNS.
//!
//! Rendered, not applied: no API server runs on a talos-rs node yet (upstream's
//! ManifestApplyController creates them once through the local API server).
//!
//! Differences from upstream, on purpose:
//! - The bootstrap token comes from `secrets/KubeletSecrets` (the token and the CAs'
//!   certificates), not `KubernetesRootSecrets`, which holds the CAs' keys k8sd must not read.
//! - No KubePrism yet: the in-cluster kubeconfig names the cluster endpoint and flannel gets
//!   no `KUBERNETES_SERVICE_HOST`.
//! - The kube-proxy configuration-file mode and flannel's kube-network-policies container are
//!   not rendered (validation says so when they are asked for).

use std::collections::BTreeMap;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDaemonSet, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, KeyToPath, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, PodAffinityTerm,
    PodAntiAffinity, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Secret,
    SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, Toleration, Volume,
    VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use machinery::config::Config;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::k8s::{
    BootstrapManifestsConfigSpec, ManifestSpec, BOOTSTRAP_MANIFESTS_ID, CONTROL_PLANE_NAMESPACE,
    DEFAULT_KUBERNETES_VERSION, PROXY_DENIED,
};
use machinery::resources::secrets::{KubeletSpec as KubeletSecretsSpec, NAMESPACE as SECRETS};

use super::kubelet::dns_service_ip;

/// Upstream's default CoreDNS image (`constants.CoreDNSImage:DefaultCoreDNSVersion`).
pub const DEFAULT_COREDNS_IMAGE: &str = "docker.io/coredns/coredns:1.13.2";
/// Upstream's default flannel image (`constants.FlannelImage`).
pub const DEFAULT_FLANNEL_IMAGE: &str = "ghcr.io/siderolabs/flannel:v0.27.4";
/// The ID of KubeletSecrets.
const KUBELET_SECRETS_ID: &str = "kubelet";
const KUBE_SYSTEM: &str = "kube-system";
const RBAC: &str = "rbac.authorization.k8s.io";

/// The bootstrap manifests' configuration of a control plane (`None` on a worker).
///
/// # Errors
///
/// A kube-proxy extra arg that is denied.
pub fn config_of(config: &Config) -> Option<Result<BootstrapManifestsConfigSpec, String>> {
    if !config.machine_type().is_some_and(|t| t.is_control_plane()) {
        return None;
    }
    let cluster = config.cluster()?;
    let network = cluster.network.as_ref();
    let pod_cidrs = network
        .map(|n| n.pod_subnets.clone())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec!["10.244.0.0/16".to_string()]);
    let service_cidrs = network
        .map(|n| n.service_subnets.clone())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec!["10.96.0.0/12".to_string()]);
    let dns4 = service_cidrs
        .iter()
        .filter(|c| c.contains('.'))
        .find_map(|c| dns_service_ip(c))
        .unwrap_or_default();
    let dns6 = service_cidrs
        .iter()
        .filter(|c| c.contains(':'))
        .find_map(|c| dns_service_ip(c))
        .unwrap_or_default();
    let proxy = cluster.proxy.clone().unwrap_or_default();
    let denied: Vec<&String> = proxy
        .extra_args
        .keys()
        .filter(|k| PROXY_DENIED.contains(&k.as_str()))
        .collect();
    if let Some(k) = denied.first() {
        return Some(Err(format!("kube-proxy extra arg {k:?} is not allowed")));
    }
    let mut proxy_args: BTreeMap<String, String> = BTreeMap::from([
        ("cluster-cidr".to_string(), pod_cidrs.join(",")),
        ("hostname-override".to_string(), "$(NODE_NAME)".to_string()),
        (
            "kubeconfig".to_string(),
            "/etc/kubernetes/kubeconfig".to_string(),
        ),
        (
            "proxy-mode".to_string(),
            proxy
                .mode
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "nftables".to_string()),
        ),
        ("conntrack-max-per-core".to_string(), "0".to_string()),
    ]);
    proxy_args.extend(proxy.extra_args.clone());
    let cni = network.and_then(|n| n.cni.as_ref());
    let core_dns = cluster.core_dns.clone().unwrap_or_default();
    Some(Ok(BootstrapManifestsConfigSpec {
        server: cluster
            .control_plane
            .as_ref()
            .and_then(|cp| cp.endpoint.clone())
            .unwrap_or_default(),
        cluster_domain: network
            .and_then(|n| n.dns_domain.clone())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| "cluster.local".to_string()),
        pod_cidrs,
        proxy_enabled: proxy.disabled != Some(true),
        proxy_image: proxy
            .image
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| format!("registry.k8s.io/kube-proxy:{DEFAULT_KUBERNETES_VERSION}")),
        proxy_args: proxy_args
            .into_iter()
            .map(|(k, v)| format!("--{k}={v}"))
            .collect(),
        core_dns_enabled: core_dns.disabled != Some(true),
        core_dns_image: core_dns
            .image
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| DEFAULT_COREDNS_IMAGE.to_string()),
        dns_service_ip: dns4,
        dns_service_ipv6: dns6,
        flannel_enabled: cni
            .and_then(|c| c.name.as_deref())
            .is_none_or(|n| n == "flannel"),
        flannel_image: DEFAULT_FLANNEL_IMAGE.to_string(),
        flannel_extra_args: cni
            .and_then(|c| c.flannel.as_ref())
            .map(|f| f.extra_args.clone())
            .unwrap_or_default(),
        flannel_kube_service_host: String::new(),
        flannel_kube_service_port: String::new(),
        flannel_backend_type: "vxlan".to_string(),
    }))
}

fn s(v: &str) -> String {
    v.to_string()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_string()).collect()
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(pairs.iter().map(|(k, v)| (s(k), s(v))).collect())
}

fn meta(name: &str, namespace: Option<&str>, l: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(s(name)),
        namespace: namespace.map(s),
        labels: if l.is_empty() { None } else { labels(l) },
        ..ObjectMeta::default()
    }
}

fn group(name: &str) -> Subject {
    Subject {
        kind: s("Group"),
        name: s(name),
        api_group: Some(s(RBAC)),
        namespace: None,
    }
}

fn service_account_subject(name: &str) -> Subject {
    Subject {
        kind: s("ServiceAccount"),
        name: s(name),
        namespace: Some(s(KUBE_SYSTEM)),
        api_group: None,
    }
}

fn binding(m: ObjectMeta, role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: m,
        role_ref: RoleRef {
            api_group: s(RBAC),
            kind: s("ClusterRole"),
            name: s(role),
        },
        subjects: Some(subjects),
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: s(name),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: s(path),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: s(name),
        value: Some(s(value)),
        ..EnvVar::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: s(name),
        mount_path: s(path),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn host_volume(name: &str, path: &str) -> Volume {
    Volume {
        name: s(name),
        host_path: Some(HostPathVolumeSource {
            path: s(path),
            type_: None,
        }),
        ..Volume::default()
    }
}

fn config_map_volume(name: &str, config_map: &str, items: Option<Vec<KeyToPath>>) -> Volume {
    Volume {
        name: s(name),
        config_map: Some(ConfigMapVolumeSource {
            name: s(config_map),
            items,
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    Some(pairs.iter().map(|(k, v)| (s(k), Quantity(s(v)))).collect())
}

fn tolerate_all() -> Vec<Toleration> {
    ["NoSchedule", "NoExecute"]
        .iter()
        .map(|e| Toleration {
            effect: Some(s(e)),
            operator: Some(s("Exists")),
            ..Toleration::default()
        })
        .collect()
}

/// A Kubernetes object as JSON (`apiVersion` and `kind` included by k8s-openapi).
fn item<T: k8s_openapi::serde::Serialize>(o: &T) -> serde_json::Value {
    serde_json::to_value(o).unwrap_or(serde_json::Value::Null)
}

fn bootstrap_token(secrets: &KubeletSecretsSpec) -> Secret {
    Secret {
        metadata: meta(
            &format!("bootstrap-token-{}", secrets.bootstrap_token_id),
            Some(KUBE_SYSTEM),
            &[],
        ),
        type_: Some(s("bootstrap.kubernetes.io/token")),
        string_data: Some(BTreeMap::from([
            (s("auth-extra-groups"), s("system:bootstrappers:nodes")),
            (s("token-id"), secrets.bootstrap_token_id.clone()),
            (s("token-secret"), secrets.bootstrap_token_secret.clone()),
            (s("usage-bootstrap-authentication"), s("true")),
        ])),
        ..Secret::default()
    }
}

fn kubeconfig_in_cluster(c: &BootstrapManifestsConfigSpec) -> ConfigMap {
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": c.server,
            "certificate-authority": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        }}],
        "users": [{"name": "service-account", "user": {
            "tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        }}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "service-account"}}],
        "current-context": "local",
    });
    ConfigMap {
        metadata: meta("kubeconfig-in-cluster", Some(KUBE_SYSTEM), &[]),
        data: Some(BTreeMap::from([(
            s("kubeconfig"),
            serde_yaml_ng::to_string(&kubeconfig).unwrap_or_default(),
        )])),
        ..ConfigMap::default()
    }
}

fn rbac_defaults(name: &str, autoupdate: bool) -> ObjectMeta {
    let mut m = meta(
        name,
        None,
        &[("kubernetes.io/bootstrapping", "rbac-defaults")],
    );
    if autoupdate {
        m.annotations = labels(&[("rbac.authorization.kubernetes.io/autoupdate", "true")]);
    }
    m
}

fn flannel(c: &BootstrapManifestsConfigSpec) -> Vec<serde_json::Value> {
    let flannel_labels = [("k8s-app", "flannel")];
    let node_labels = [("k8s-app", "flannel"), ("tier", "node")];
    let role = ClusterRole {
        metadata: meta("flannel", None, &flannel_labels),
        rules: Some(vec![
            rule(
                &[""],
                &["pods", "nodes", "namespaces"],
                &["get", "list", "watch"],
            ),
            rule(&[""], &["nodes/status"], &["patch"]),
        ]),
        ..ClusterRole::default()
    };
    let crb = binding(
        meta("flannel", None, &flannel_labels),
        "flannel",
        vec![service_account_subject("flannel")],
    );
    let sa = ServiceAccount {
        metadata: meta("flannel", Some(KUBE_SYSTEM), &flannel_labels),
        ..ServiceAccount::default()
    };
    let mut net_conf = serde_json::Map::new();
    let mut has_v4 = false;
    for cidr in &c.pod_cidrs {
        if cidr.contains('.') {
            net_conf.insert(s("Network"), serde_json::json!(cidr));
            has_v4 = true;
        } else {
            net_conf.insert(s("IPv6Network"), serde_json::json!(cidr));
            net_conf.insert(s("EnableIPv6"), serde_json::json!(true));
        }
    }
    if !has_v4 {
        net_conf.insert(s("EnableIPv4"), serde_json::json!(false));
    }
    net_conf.insert(s("EnableNFTables"), serde_json::json!(true));
    net_conf.insert(
        s("Backend"),
        serde_json::json!({"Type": c.flannel_backend_type}),
    );
    let cni_conf = serde_json::json!({
        "name": "cbr0",
        "cniVersion": "1.0.0",
        "plugins": [
            {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    let cm = ConfigMap {
        metadata: meta("kube-flannel-cfg", Some(KUBE_SYSTEM), &node_labels),
        data: Some(BTreeMap::from([
            (
                s("cni-conf.json"),
                serde_json::to_string_pretty(&cni_conf).unwrap_or_default(),
            ),
            (
                s("net-conf.json"),
                serde_json::to_string_pretty(&net_conf).unwrap_or_default(),
            ),
        ])),
        ..ConfigMap::default()
    };
    let mut envs = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        env("EVENT_QUEUE_DEPTH", "5000"),
        env("CONT_WHEN_CACHE_NOT_READY", "false"),
    ];
    if !c.flannel_kube_service_host.is_empty() {
        envs.push(env("KUBERNETES_SERVICE_HOST", &c.flannel_kube_service_host));
    }
    if !c.flannel_kube_service_port.is_empty() {
        envs.push(env("KUBERNETES_SERVICE_PORT", &c.flannel_kube_service_port));
    }
    let mut args = strings(&["--ip-masq", "--kube-subnet-mgr"]);
    args.extend(c.flannel_extra_args.iter().cloned());
    let flanneld = Container {
        name: s("kube-flannel"),
        image: Some(c.flannel_image.clone()),
        command: Some(strings(&["/opt/bin/flanneld"])),
        args: Some(args),
        env: Some(envs),
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "100m"), ("memory", "50Mi")]),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(strings(&["NET_ADMIN", "NET_RAW"])),
                drop: None,
            }),
            privileged: Some(false),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount("run", "/run/flannel", false),
            mount("flannel-cfg", "/etc/kube-flannel/", false),
        ]),
        ..Container::default()
    };
    let install = Container {
        name: s("install-config"),
        image: Some(c.flannel_image.clone()),
        command: Some(strings(&["cp"])),
        args: Some(strings(&[
            "-f",
            "/etc/kube-flannel/cni-conf.json",
            "/etc/cni/net.d/10-flannel.conflist",
        ])),
        volume_mounts: Some(vec![
            mount("cni", "/etc/cni/net.d", false),
            mount("flannel-cfg", "/etc/kube-flannel/", false),
        ]),
        ..Container::default()
    };
    let ds = DaemonSet {
        metadata: meta("kube-flannel", Some(KUBE_SYSTEM), &node_labels),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: labels(&node_labels),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: labels(&node_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    affinity: Some(Affinity {
                        node_affinity: Some(NodeAffinity {
                            required_during_scheduling_ignored_during_execution: Some(
                                NodeSelector {
                                    node_selector_terms: vec![NodeSelectorTerm {
                                        match_expressions: Some(vec![NodeSelectorRequirement {
                                            key: s("kubernetes.io/os"),
                                            operator: s("In"),
                                            values: Some(strings(&["linux"])),
                                        }]),
                                        ..NodeSelectorTerm::default()
                                    }],
                                },
                            ),
                            ..NodeAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    containers: vec![flanneld],
                    init_containers: Some(vec![install]),
                    host_network: Some(true),
                    priority_class_name: Some(s("system-node-critical")),
                    service_account_name: Some(s("flannel")),
                    tolerations: Some(tolerate_all()),
                    volumes: Some(vec![
                        host_volume("run", "/run/flannel"),
                        host_volume("cni", "/etc/cni/net.d"),
                        config_map_volume("flannel-cfg", "kube-flannel-cfg", None),
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    };
    vec![item(&role), item(&crb), item(&sa), item(&cm), item(&ds)]
}

fn kube_proxy(c: &BootstrapManifestsConfigSpec) -> Vec<serde_json::Value> {
    let node_labels = [("tier", "node"), ("k8s-app", "kube-proxy")];
    let sa = ServiceAccount {
        metadata: meta("kube-proxy", Some(KUBE_SYSTEM), &[]),
        ..ServiceAccount::default()
    };
    let crb = binding(
        meta("kube-proxy", None, &[]),
        "system:node-proxier",
        vec![service_account_subject("kube-proxy")],
    );
    let mut command = vec![s("/usr/local/bin/kube-proxy")];
    command.extend(c.proxy_args.iter().cloned());
    let container = Container {
        name: s("kube-proxy"),
        image: Some(c.proxy_image.clone()),
        command: Some(command),
        env: Some(vec![
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_IP", "status.podIP"),
        ]),
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "100m"), ("memory", "50Mi")]),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount("lib-modules", "/lib/modules", true),
            mount("ssl-certs-host", "/etc/ssl/certs", true),
            mount("kubeconfig", "/etc/kubernetes", true),
        ]),
        ..Container::default()
    };
    let ds = DaemonSet {
        metadata: meta("kube-proxy", Some(KUBE_SYSTEM), &node_labels),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: labels(&node_labels),
                ..LabelSelector::default()
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some(s("RollingUpdate")),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(1)),
                    ..RollingUpdateDaemonSet::default()
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: labels(&node_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    host_network: Some(true),
                    priority_class_name: Some(s("system-cluster-critical")),
                    service_account_name: Some(s("kube-proxy")),
                    tolerations: Some(tolerate_all()),
                    volumes: Some(vec![
                        host_volume("lib-modules", "/usr/lib/modules"),
                        host_volume("ssl-certs-host", "/etc/ssl/certs"),
                        config_map_volume("kubeconfig", "kubeconfig-in-cluster", None),
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    };
    vec![item(&sa), item(&crb), item(&ds)]
}

/// CoreDNS's Corefile (upstream's, byte for byte).
pub fn corefile(domain: &str) -> String {
    let mut f = format!(
        ".:53 {{\n    errors\n    health {{\n        lameduck 5s\n    }}\n    ready\n    log . {{\n        class error\n    }}\n    prometheus :9153\n\n    kubernetes {domain} in-addr.arpa ip6.arpa {{\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 30\n    }}\n    forward . /etc/resolv.conf {{\n       max_concurrent 1000\n    }}\n    cache 30"
    );
    if domain.is_empty() {
        f.push('\n');
    } else {
        f.push_str(&format!(
            " {{\n       disable success {domain}\n       disable denial {domain}\n    }}\n"
        ));
    }
    f.push_str("    loop\n    reload\n    loadbalance\n}\n");
    f
}

fn core_dns(c: &BootstrapManifestsConfigSpec) -> Vec<serde_json::Value> {
    let sa = ServiceAccount {
        metadata: meta("coredns", Some(KUBE_SYSTEM), &[]),
        ..ServiceAccount::default()
    };
    let role = ClusterRole {
        metadata: rbac_defaults("system:coredns", false),
        rules: Some(vec![
            rule(
                &[""],
                &["endpoints", "services", "pods", "namespaces"],
                &["list", "watch"],
            ),
            rule(
                &["discovery.k8s.io"],
                &["endpointslices"],
                &["list", "watch"],
            ),
        ]),
        ..ClusterRole::default()
    };
    let crb = binding(
        rbac_defaults("system:coredns", true),
        "system:coredns",
        vec![service_account_subject("coredns")],
    );
    let cm = ConfigMap {
        metadata: meta("coredns", Some(KUBE_SYSTEM), &[]),
        data: Some(BTreeMap::from([(
            s("Corefile"),
            corefile(&c.cluster_domain),
        )])),
        ..ConfigMap::default()
    };
    let probe = |path: &str, port: i32| HTTPGetAction {
        path: Some(s(path)),
        port: IntOrString::Int(port),
        scheme: Some(s("HTTP")),
        ..HTTPGetAction::default()
    };
    let port = |name: &str, proto: &str, p: i32| ContainerPort {
        name: Some(s(name)),
        protocol: Some(s(proto)),
        container_port: p,
        ..ContainerPort::default()
    };
    let container = Container {
        name: s("coredns"),
        image: Some(c.core_dns_image.clone()),
        image_pull_policy: Some(s("IfNotPresent")),
        resources: Some(ResourceRequirements {
            limits: quantities(&[("memory", "170Mi")]),
            requests: quantities(&[("cpu", "100m"), ("memory", "70Mi")]),
            ..ResourceRequirements::default()
        }),
        env: Some(vec![env("GOMEMLIMIT", "161MiB")]),
        args: Some(strings(&["-conf", "/etc/coredns/Corefile"])),
        volume_mounts: Some(vec![mount("config-volume", "/etc/coredns", true)]),
        ports: Some(vec![
            port("dns", "UDP", 53),
            port("dns-tcp", "TCP", 53),
            port("metrics", "TCP", 9153),
        ]),
        liveness_probe: Some(Probe {
            http_get: Some(probe("/health", 8080)),
            initial_delay_seconds: Some(60),
            timeout_seconds: Some(5),
            success_threshold: Some(1),
            failure_threshold: Some(5),
            ..Probe::default()
        }),
        readiness_probe: Some(Probe {
            http_get: Some(probe("/ready", 8181)),
            ..Probe::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(strings(&["NET_BIND_SERVICE"])),
                drop: Some(strings(&["ALL"])),
            }),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let toleration = |key: &str| Toleration {
        key: Some(s(key)),
        operator: Some(s("Exists")),
        effect: Some(s("NoSchedule")),
        ..Toleration::default()
    };
    let deployment = Deployment {
        metadata: meta(
            "coredns",
            Some(KUBE_SYSTEM),
            &[("k8s-app", "kube-dns"), ("kubernetes.io/name", "CoreDNS")],
        ),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            strategy: Some(DeploymentStrategy {
                type_: Some(s("RollingUpdate")),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(1)),
                    ..RollingUpdateDeployment::default()
                }),
            }),
            selector: LabelSelector {
                match_labels: labels(&[("k8s-app", "kube-dns")]),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: labels(&[("k8s-app", "kube-dns")]),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    node_selector: labels(&[("kubernetes.io/os", "linux")]),
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            preferred_during_scheduling_ignored_during_execution: Some(vec![
                                WeightedPodAffinityTerm {
                                    weight: 100,
                                    pod_affinity_term: PodAffinityTerm {
                                        label_selector: Some(LabelSelector {
                                            match_expressions: Some(vec![
                                                LabelSelectorRequirement {
                                                    key: s("k8s-app"),
                                                    operator: s("In"),
                                                    values: Some(strings(&["kube-dns"])),
                                                },
                                            ]),
                                            ..LabelSelector::default()
                                        }),
                                        topology_key: s("kubernetes.io/hostname"),
                                        ..PodAffinityTerm::default()
                                    },
                                },
                            ]),
                            ..PodAntiAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    service_account_name: Some(s("coredns")),
                    priority_class_name: Some(s("system-cluster-critical")),
                    tolerations: Some(vec![
                        toleration("node-role.kubernetes.io/control-plane"),
                        toleration("node.cloudprovider.kubernetes.io/uninitialized"),
                    ]),
                    containers: vec![container],
                    dns_policy: Some(s("Default")),
                    volumes: Some(vec![config_map_volume(
                        "config-volume",
                        "coredns",
                        Some(vec![KeyToPath {
                            key: s("Corefile"),
                            path: s("Corefile"),
                            mode: None,
                        }]),
                    )]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    vec![
        item(&sa),
        item(&role),
        item(&crb),
        item(&cm),
        item(&deployment),
    ]
}

fn core_dns_service(c: &BootstrapManifestsConfigSpec) -> Service {
    let mut ips = Vec::new();
    let mut families = Vec::new();
    if !c.dns_service_ip.is_empty() {
        ips.push(c.dns_service_ip.clone());
        families.push(s("IPv4"));
    }
    if !c.dns_service_ipv6.is_empty() {
        ips.push(c.dns_service_ipv6.clone());
        families.push(s("IPv6"));
    }
    let policy = if ips.len() == 2 {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    let port = |name: &str, proto: &str, p: i32| ServicePort {
        name: Some(s(name)),
        port: p,
        protocol: Some(s(proto)),
        target_port: Some(IntOrString::Int(p)),
        ..ServicePort::default()
    };
    let mut m = meta(
        "kube-dns",
        Some(KUBE_SYSTEM),
        &[
            ("k8s-app", "kube-dns"),
            ("kubernetes.io/cluster-service", "true"),
            ("kubernetes.io/name", "CoreDNS"),
        ],
    );
    m.annotations = labels(&[
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", "9153"),
    ]);
    Service {
        metadata: m,
        spec: Some(ServiceSpec {
            selector: labels(&[("k8s-app", "kube-dns")]),
            cluster_ip: ips.first().cloned(),
            cluster_ips: Some(ips),
            ip_families: Some(families),
            ip_family_policy: Some(s(policy)),
            ports: Some(vec![
                port("dns", "UDP", 53),
                port("dns-tcp", "TCP", 53),
                port("metrics", "TCP", 9153),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Every manifest of `c`, by upstream's IDs, in ID order.
pub fn render(
    c: &BootstrapManifestsConfigSpec,
    secrets: &KubeletSecretsSpec,
) -> BTreeMap<&'static str, Vec<serde_json::Value>> {
    let mut out: BTreeMap<&'static str, Vec<serde_json::Value>> = BTreeMap::new();
    out.insert(
        "00-kubelet-bootstrapping-token",
        vec![item(&bootstrap_token(secrets))],
    );
    out.insert(
        "01-csr-node-bootstrap",
        vec![item(&binding(
            meta("system-bootstrap-node-bootstrapper", None, &[]),
            "system:node-bootstrapper",
            vec![group("system:bootstrappers:nodes"), group("system:nodes")],
        ))],
    );
    out.insert(
        "01-csr-approver-role-binding",
        vec![item(&binding(
            meta("system-bootstrap-approve-node-client-csr", None, &[]),
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![group("system:bootstrappers:nodes")],
        ))],
    );
    out.insert(
        "01-csr-renewal-role-binding",
        vec![item(&binding(
            meta("system-bootstrap-node-renewal", None, &[]),
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![group("system:nodes")],
        ))],
    );
    out.insert(
        "11-kube-config-in-cluster",
        vec![item(&kubeconfig_in_cluster(c))],
    );
    out.insert(
        "11-talos-node-rbac-template",
        vec![
            item(&binding(
                rbac_defaults("system:talos-nodes", true),
                "system:talos-nodes",
                vec![group("system:nodes")],
            )),
            item(&ClusterRole {
                metadata: rbac_defaults("system:talos-nodes", false),
                rules: Some(vec![rule(
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                    &["get", "list", "watch"],
                )]),
                ..ClusterRole::default()
            }),
        ],
    );
    if c.flannel_enabled {
        out.insert("05-flannel", flannel(c));
    }
    if c.proxy_enabled {
        out.insert("10-kube-proxy", kube_proxy(c));
    }
    if c.core_dns_enabled {
        out.insert("11-core-dns", core_dns(c));
        out.insert("11-core-dns-svc", vec![item(&core_dns_service(c))]);
    }
    out
}

/// `k8s.ControlPlaneBootstrapManifestsController`.
#[derive(Default)]
pub struct BootstrapManifestsConfigController {
    refused: Option<String>,
}

impl Controller for BootstrapManifestsConfigController {
    fn name(&self) -> &'static str {
        "k8s.ControlPlaneBootstrapManifestsController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<MachineConfigSpec>(REDACTED_NAMESPACE).with_id(ACTIVE_ID)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<BootstrapManifestsConfigSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(text) = ctx
            .get::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
            .await?
            .map(|c| c.spec.0)
        else {
            return Ok(Action::AwaitChange);
        };
        let Ok(config) = Config::from_yaml(&text) else {
            return Ok(Action::AwaitChange);
        };
        match config_of(&config) {
            None => {}
            Some(Ok(spec)) => {
                self.refused = None;
                ctx.apply(Resource::new(
                    CONTROL_PLANE_NAMESPACE,
                    BOOTSTRAP_MANIFESTS_ID,
                    spec,
                ))
                .await?;
            }
            Some(Err(why)) => {
                if self.refused.as_deref() != Some(why.as_str()) {
                    tracing::error!(error = %why, "the bootstrap manifests' configuration is refused: it stays as it was");
                    self.refused = Some(why);
                }
                super::super::etcd::keep::<BootstrapManifestsConfigSpec>(
                    ctx,
                    CONTROL_PLANE_NAMESPACE,
                    BOOTSTRAP_MANIFESTS_ID,
                )
                .await?;
            }
        }
        Ok(Action::AwaitChange)
    }
}

/// `k8s.ManifestController`.
#[derive(Default)]
pub struct ManifestController;

impl Controller for ManifestController {
    fn name(&self) -> &'static str {
        "k8s.ManifestController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<BootstrapManifestsConfigSpec>(CONTROL_PLANE_NAMESPACE)
                .with_id(BOOTSTRAP_MANIFESTS_ID),
            Input::weak::<KubeletSecretsSpec>(SECRETS).with_id(KUBELET_SECRETS_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<ManifestSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let config = ctx
            .get::<BootstrapManifestsConfigSpec>(CONTROL_PLANE_NAMESPACE, BOOTSTRAP_MANIFESTS_ID)
            .await?;
        let secrets = ctx
            .get::<KubeletSecretsSpec>(SECRETS, KUBELET_SECRETS_ID)
            .await?;
        let (Some(config), Some(secrets)) = (config, secrets) else {
            return Ok(Action::AwaitChange);
        };
        for (id, items) in render(&config.spec, &secrets.spec) {
            ctx.apply(Resource::new(
                CONTROL_PLANE_NAMESPACE,
                id,
                ManifestSpec { items },
            ))
            .await?;
        }
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CP: &str = r#"
version: v1alpha1
machine: {type: controlplane, token: abc}
cluster:
  controlPlane: {endpoint: "https://10.5.0.2:6443"}
  network:
    dnsDomain: cluster.local
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  proxy:
    extraArgs: {proxy-mode: iptables, v: "2"}
"#;

    fn secrets() -> KubeletSecretsSpec {
        KubeletSecretsSpec {
            endpoint: "https://10.5.0.2:6443".into(),
            accepted_cas: vec![],
            bootstrap_token_id: "25p8ak".into(),
            bootstrap_token_secret: "vshybadgp2mhtvm7".into(),
        }
    }

    fn kinds(items: &[serde_json::Value]) -> Vec<String> {
        items
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["kind"].as_str().unwrap_or(""),
                    i["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    #[test]
    fn a_control_plane_renders_upstreams_manifests() {
        let config = Config::from_yaml(CP).unwrap();
        let c = config_of(&config).unwrap().unwrap();
        assert_eq!(c.server, "https://10.5.0.2:6443");
        assert_eq!(c.dns_service_ip, "10.96.0.10");
        assert!(
            c.proxy_args.contains(&"--proxy-mode=iptables".to_string()),
            "{:?}",
            c.proxy_args
        );
        assert!(c.proxy_args.contains(&"--v=2".to_string()));
        assert!(c
            .proxy_args
            .contains(&"--cluster-cidr=10.244.0.0/16".to_string()));
        let m = render(&c, &secrets());
        assert_eq!(
            m.keys().copied().collect::<Vec<_>>(),
            [
                "00-kubelet-bootstrapping-token",
                "01-csr-approver-role-binding",
                "01-csr-node-bootstrap",
                "01-csr-renewal-role-binding",
                "05-flannel",
                "10-kube-proxy",
                "11-core-dns",
                "11-core-dns-svc",
                "11-kube-config-in-cluster",
                "11-talos-node-rbac-template",
            ]
        );
        // Upstream's testdata/kubelet-bootstrapping-token.yaml, field for field.
        let token = &m["00-kubelet-bootstrapping-token"][0];
        let want: serde_json::Value = serde_yaml_ng::from_str(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bootstrap-token-25p8ak\n  namespace: kube-system\nstringData:\n  auth-extra-groups: system:bootstrappers:nodes\n  token-id: 25p8ak\n  token-secret: vshybadgp2mhtvm7\n  usage-bootstrap-authentication: \"true\"\ntype: bootstrap.kubernetes.io/token\n",
        )
        .unwrap();
        assert_eq!(token, &want);
        assert_eq!(
            kinds(&m["05-flannel"]),
            [
                "ClusterRole/flannel",
                "ClusterRoleBinding/flannel",
                "ServiceAccount/flannel",
                "ConfigMap/kube-flannel-cfg",
                "DaemonSet/kube-flannel"
            ]
        );
        let net_conf: serde_json::Value = serde_json::from_str(
            m["05-flannel"][3]["data"]["net-conf.json"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(net_conf["Network"], "10.244.0.0/16");
        assert_eq!(net_conf["Backend"]["Type"], "vxlan");
        let svc = &m["11-core-dns-svc"][0];
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(svc["spec"]["ipFamilyPolicy"], "SingleStack");
        let deploy = &m["11-core-dns"][4];
        assert_eq!(deploy["kind"], "Deployment");
        assert_eq!(deploy["apiVersion"], "apps/v1");
        assert_eq!(deploy["spec"]["replicas"], 2);
        let corefile = m["11-core-dns"][3]["data"]["Corefile"].as_str().unwrap();
        assert!(corefile.contains("kubernetes cluster.local in-addr.arpa ip6.arpa {"));
        assert!(corefile.contains("disable success cluster.local"));
        let proxy = &m["10-kube-proxy"][2];
        let command = proxy["spec"]["template"]["spec"]["containers"][0]["command"].clone();
        assert_eq!(command[0], "/usr/local/bin/kube-proxy");
        assert!(command.as_array().unwrap().contains(&serde_json::json!(
            "--kubeconfig=/etc/kubernetes/kubeconfig"
        )));
        let kubeconfig: serde_json::Value = serde_yaml_ng::from_str(
            m["11-kube-config-in-cluster"][0]["data"]["kubeconfig"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            kubeconfig["clusters"][0]["cluster"]["server"],
            "https://10.5.0.2:6443"
        );
    }

    #[test]
    fn disabled_components_and_other_cnis_are_left_out_and_a_denied_proxy_arg_is_refused() {
        let text = CP
            .replace(
                "  proxy:\n    extraArgs: {proxy-mode: iptables, v: \"2\"}\n",
                "  proxy: {disabled: true}\n  coreDNS: {disabled: true}\n",
            )
            .replace(
                "    dnsDomain: cluster.local\n",
                "    dnsDomain: cluster.local\n    cni: {name: none}\n",
            );
        let c = config_of(&Config::from_yaml(&text).unwrap())
            .unwrap()
            .unwrap();
        let m = render(&c, &secrets());
        assert!(!m.contains_key("05-flannel") && !m.contains_key("10-kube-proxy"));
        assert!(!m.contains_key("11-core-dns") && !m.contains_key("11-core-dns-svc"));
        assert!(m.contains_key("00-kubelet-bootstrapping-token"));

        let denied = CP.replace("proxy-mode: iptables", "kubeconfig: /x");
        let err = config_of(&Config::from_yaml(&denied).unwrap())
            .unwrap()
            .unwrap_err();
        assert!(err.contains("kubeconfig"), "{err}");

        let worker = CP.replace("type: controlplane", "type: worker");
        assert!(config_of(&Config::from_yaml(&worker).unwrap()).is_none());
    }

    #[test]
    fn a_dual_stack_service_asks_for_both_families() {
        let c = BootstrapManifestsConfigSpec {
            dns_service_ip: "10.96.0.10".into(),
            dns_service_ipv6: "fd00::a".into(),
            ..Default::default()
        };
        let svc = item(&core_dns_service(&c));
        assert_eq!(svc["spec"]["ipFamilyPolicy"], "RequireDualStack");
        assert_eq!(
            svc["spec"]["clusterIPs"],
            serde_json::json!(["10.96.0.10", "fd00::a"])
        );
    }
}
