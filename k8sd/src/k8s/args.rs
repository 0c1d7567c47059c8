//! The control plane components' flags, as upstream's final controllers render them
//! (`ControlPlane{APIServer,ControllerManager,Scheduler}FinalController`): the base set, then
//! the user's `extraArgs` merged with upstream's policies: a key of the deny list is refused
//! (`extra arg "X" is not allowed`), an additive key is joined with the base value
//! (comma-separated, de-duplicated), any other overrides. Rendered sorted as `--k=v`.

use std::collections::BTreeMap;

use machinery::resources::k8s::{
    denied, ComponentConfig, APISERVER_ID, CONTROLLER_MANAGER_ID, SCHEDULER_ID,
};

/// kube-apiserver's secrets and configuration directories (upstream's paths).
pub const APISERVER_SECRETS: &str = "/system/secrets/kubernetes/kube-apiserver";
/// See [`APISERVER_SECRETS`].
pub const APISERVER_CONFIG: &str = "/system/config/kubernetes/kube-apiserver";
/// kube-controller-manager's secrets.
pub const CONTROLLER_MANAGER_SECRETS: &str = "/system/secrets/kubernetes/kube-controller-manager";
/// kube-scheduler's secrets and configuration.
pub const SCHEDULER_SECRETS: &str = "/system/secrets/kubernetes/kube-scheduler";
/// See [`SCHEDULER_SECRETS`].
pub const SCHEDULER_CONFIG: &str = "/system/config/kubernetes/kube-scheduler";

/// A refused `extraArgs` key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("extra arg {0:?} is not allowed")]
pub struct Denied(pub String);

/// Keys merged additively (upstream's `MergeAdditive`).
fn additive(component: &str) -> &'static [&'static str] {
    match component {
        APISERVER_ID => &[
            "enable-admission-plugins",
            "feature-gates",
            "authorization-mode",
        ],
        CONTROLLER_MANAGER_ID => &["service-cluster-ip-range", "controllers"],
        _ => &[],
    }
}

/// Whether `extra` sets kube-apiserver's authorization by flags (`authorization-mode` or an
/// `authorization-webhook-*` flag): then, as upstream, the base authorizes with
/// `--authorization-mode=Node,RBAC` (the user's modes are added after it) instead of
/// `--authorization-config` (kube-apiserver refuses both at once).
pub fn authorization_by_flags(extra: &BTreeMap<String, String>) -> bool {
    extra
        .keys()
        .any(|k| k == "authorization-mode" || k.starts_with("authorization-webhook-"))
}

/// The base flags of `component` for `c`.
pub fn base(component: &str, c: &ComponentConfig) -> BTreeMap<String, String> {
    let s = |k: &str, v: &str| (k.to_string(), v.to_string());
    let services = c.service_cidrs.join(",");
    match component {
        APISERVER_ID => {
            let sec = |f: &str| format!("{APISERVER_SECRETS}/{f}");
            let cfg = |f: &str| format!("{APISERVER_CONFIG}/{f}");
            let authorization = if authorization_by_flags(&c.extra_args) {
                s("authorization-mode", "Node,RBAC")
            } else {
                s("authorization-config", &cfg("authorization-config.yaml"))
            };
            BTreeMap::from([
                authorization,
                s(
                    "admission-control-config-file",
                    &cfg("admission-control-config.yaml"),
                ),
                s("advertise-address", "$(POD_IP)"),
                s("allow-privileged", "true"),
                s("api-audiences", &c.control_plane_endpoint),
                s("audit-log-maxage", "30"),
                s("audit-log-maxbackup", "10"),
                s("audit-log-maxsize", "100"),
                s("audit-log-path", "/var/log/audit/kube/kube-apiserver.log"),
                s("audit-policy-file", &cfg("auditpolicy.yaml")),
                s("bind-address", "0.0.0.0"),
                s("client-ca-file", &sec("ca.crt")),
                s("enable-admission-plugins", "NodeRestriction"),
                s("enable-bootstrap-token-auth", "true"),
                s("encryption-provider-config", &sec("encryptionconfig.yaml")),
                s("etcd-cafile", &sec("etcd-client-ca.crt")),
                s("etcd-certfile", &sec("etcd-client.crt")),
                s("etcd-keyfile", &sec("etcd-client.key")),
                s("etcd-servers", "https://127.0.0.1:2379"),
                s(
                    "kubelet-client-certificate",
                    &sec("apiserver-kubelet-client.crt"),
                ),
                s("kubelet-client-key", &sec("apiserver-kubelet-client.key")),
                s(
                    "kubelet-preferred-address-types",
                    "InternalIP,ExternalIP,Hostname",
                ),
                s("profiling", "false"),
                s("proxy-client-cert-file", &sec("front-proxy-client.crt")),
                s("proxy-client-key-file", &sec("front-proxy-client.key")),
                s("requestheader-allowed-names", "front-proxy-client"),
                s("requestheader-client-ca-file", &sec("aggregator-ca.crt")),
                s("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
                s("requestheader-group-headers", "X-Remote-Group"),
                s("requestheader-username-headers", "X-Remote-User"),
                s("secure-port", &c.local_port.to_string()),
                s("service-account-issuer", &c.control_plane_endpoint),
                s("service-account-key-file", &sec("service-account.pub")),
                s(
                    "service-account-signing-key-file",
                    &sec("service-account.key"),
                ),
                s("service-cluster-ip-range", &services),
                s("tls-cert-file", &sec("apiserver.crt")),
                s("tls-min-version", "VersionTLS13"),
                s("tls-private-key-file", &sec("apiserver.key")),
                s("anonymous-auth", "false"),
            ])
        }
        CONTROLLER_MANAGER_ID => {
            let sec = |f: &str| format!("{CONTROLLER_MANAGER_SECRETS}/{f}");
            let mut m = BTreeMap::from([
                s("allocate-node-cidrs", "true"),
                s("authentication-kubeconfig", &sec("kubeconfig")),
                s("authorization-kubeconfig", &sec("kubeconfig")),
                s("bind-address", "127.0.0.1"),
                s("cluster-cidr", &c.pod_cidrs.join(",")),
                s("cluster-signing-cert-file", &sec("ca.crt")),
                s("cluster-signing-key-file", &sec("ca.key")),
                s("configure-cloud-routes", "false"),
                s("controllers", "*"),
                s("kubeconfig", &sec("kubeconfig")),
                s("leader-elect", "true"),
                s("profiling", "false"),
                s("root-ca-file", &sec("ca.crt")),
                s(
                    "service-account-private-key-file",
                    &sec("service-account.key"),
                ),
                s("service-cluster-ip-range", &services),
                s("terminated-pod-gc-threshold", "100"),
                s("tls-min-version", "VersionTLS13"),
                s("use-service-account-credentials", "true"),
            ]);
            for cidr in &c.pod_cidrs {
                if cidr.contains(':') {
                    m.insert("node-cidr-mask-size-ipv6".into(), "80".into());
                } else {
                    m.insert("node-cidr-mask-size-ipv4".into(), "24".into());
                }
            }
            m
        }
        SCHEDULER_ID => BTreeMap::from([
            s(
                "authentication-kubeconfig",
                &format!("{SCHEDULER_SECRETS}/kubeconfig"),
            ),
            s("authentication-tolerate-lookup-failure", "false"),
            s(
                "authorization-kubeconfig",
                &format!("{SCHEDULER_SECRETS}/kubeconfig"),
            ),
            s("bind-address", "127.0.0.1"),
            s(
                "config",
                &format!("{SCHEDULER_CONFIG}/scheduler-config.yaml"),
            ),
            s("leader-elect", "true"),
            s("profiling", "false"),
            s("tls-min-version", "VersionTLS13"),
        ]),
        _ => BTreeMap::new(),
    }
}

/// `base` merged with a user's `extra` flags, as upstream's argsbuilder: a key of `denied` is
/// refused, a key of `additive` is joined with the base value (upstream's `MergeAdditive`:
/// comma-separated, each value trimmed, empty ones dropped, once each, the base's first), any
/// other overrides; rendered `--k=v`, sorted. Every kubernetes component and the kubelet
/// render their flags through it.
///
/// # Errors
///
/// Every denied key of `extra`.
pub fn merge(
    mut base: BTreeMap<String, String>,
    extra: &BTreeMap<String, String>,
    denied: &[&str],
    additive: &[&str],
) -> Result<Vec<String>, Vec<Denied>> {
    let refused: Vec<Denied> = extra
        .keys()
        .filter(|k| denied.contains(&k.as_str()))
        .map(|k| Denied(k.clone()))
        .collect();
    if !refused.is_empty() {
        return Err(refused);
    }
    for (k, v) in extra {
        match base.get_mut(k) {
            Some(b) if additive.contains(&k.as_str()) => {
                let mut parts: Vec<&str> = Vec::new();
                for p in b.split(',').chain(v.split(',')).map(str::trim) {
                    if !p.is_empty() && !parts.contains(&p) {
                        parts.push(p);
                    }
                }
                *b = parts.join(",");
            }
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(base
        .into_iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect())
}

/// The flags `component` runs with: the base merged with `c.extra_args` ([`merge`]).
///
/// # Errors
///
/// Every denied key of the extra args.
pub fn render(component: &str, c: &ComponentConfig) -> Result<Vec<String>, Vec<Denied>> {
    merge(
        base(component, c),
        &c.extra_args,
        denied(component),
        additive(component),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ComponentConfig {
        ComponentConfig {
            enabled: true,
            control_plane_endpoint: "https://10.5.0.2:6443".into(),
            local_port: 6443,
            pod_cidrs: vec!["10.244.0.0/16".into()],
            service_cidrs: vec!["10.96.0.0/12".into()],
            ..ComponentConfig::default()
        }
    }

    #[test]
    fn pinned_flags_are_kept_denied_ones_refused_additive_ones_joined() {
        let mut c = config();
        let args = render(APISERVER_ID, &c).unwrap();
        assert!(args.contains(&"--etcd-servers=https://127.0.0.1:2379".to_string()));
        assert!(args.contains(&"--tls-min-version=VersionTLS13".to_string()));
        assert!(args.contains(&"--service-cluster-ip-range=10.96.0.0/12".to_string()));
        let mut sorted = args.clone();
        sorted.sort();
        assert_eq!(args, sorted);

        c.extra_args.insert(
            "enable-admission-plugins".into(),
            "PodNodeSelector,NodeRestriction".into(),
        );
        c.extra_args.insert("profiling".into(), "true".into());
        let args = render(APISERVER_ID, &c).unwrap();
        assert!(args
            .contains(&"--enable-admission-plugins=NodeRestriction,PodNodeSelector".to_string()));
        assert!(args.contains(&"--profiling=true".to_string()));

        // Authorization by flags: the user's modes follow upstream's Node,RBAC (not replace
        // them), and the authorization configuration file is not given beside them.
        for (mode, want) in [
            ("Webhook", "Node,RBAC,Webhook"),
            ("RBAC,Webhook", "Node,RBAC,Webhook"),
            ("Webhook,Node", "Node,RBAC,Webhook"),
            (" Webhook , ,ABAC", "Node,RBAC,Webhook,ABAC"),
        ] {
            let mut w = config();
            w.extra_args
                .insert("authorization-mode".into(), mode.into());
            let args = render(APISERVER_ID, &w).unwrap();
            assert!(
                args.contains(&format!("--authorization-mode={want}")),
                "{mode}: {args:?}"
            );
            assert!(
                !args
                    .iter()
                    .any(|a| a.starts_with("--authorization-config=")),
                "{args:?}"
            );
        }
        let mut w = config();
        w.extra_args.insert(
            "authorization-webhook-config-file".into(),
            "/etc/w.yaml".into(),
        );
        let args = render(APISERVER_ID, &w).unwrap();
        assert!(args.contains(&"--authorization-mode=Node,RBAC".to_string()));
        assert!(args.contains(&"--authorization-webhook-config-file=/etc/w.yaml".to_string()));
        let plain = render(APISERVER_ID, &config()).unwrap();
        assert!(plain
            .iter()
            .any(|a| a.starts_with("--authorization-config=")));
        assert!(!plain.iter().any(|a| a.starts_with("--authorization-mode=")));

        c.extra_args
            .insert("etcd-servers".into(), "https://evil:2379".into());
        c.extra_args
            .insert("tls-min-version".into(), "VersionTLS10".into());
        let refused = render(APISERVER_ID, &c).unwrap_err();
        assert_eq!(
            refused,
            vec![
                Denied("etcd-servers".into()),
                Denied("tls-min-version".into())
            ]
        );
        assert_eq!(
            refused[0].to_string(),
            "extra arg \"etcd-servers\" is not allowed"
        );
    }

    #[test]
    fn denied_flags_are_pinned_ones() {
        // (kube-scheduler's deny list also keeps `kubeconfig` out: it runs with `config`.)
        for component in [APISERVER_ID, CONTROLLER_MANAGER_ID] {
            let b = base(component, &config());
            for d in denied(component) {
                assert!(
                    b.contains_key(*d),
                    "{component}: {d} is denied but not pinned"
                );
            }
        }
        let cm = base(CONTROLLER_MANAGER_ID, &config());
        assert_eq!(cm["node-cidr-mask-size-ipv4"], "24");
    }
}
