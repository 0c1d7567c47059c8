//! The control plane's static pods as upstream's templates (`k8stemplates`): namespace
//! `kube-system`, labels `tier=control-plane`, `k8s-app=<component>`,
//! `app.kubernetes.io/managed-by=Talos`, host network, priority class `system-cluster-critical`,
//! non-root (kube-apiserver 65534, kube-controller-manager 65535, kube-scheduler 65536), every
//! capability dropped (kube-apiserver keeps `NET_BIND_SERVICE`), read-only root filesystem,
//! seccomp `RuntimeDefault`, the component's secrets and configuration mounted read-only from
//! the host, annotation `talos.dev/config-version` (a new final configuration → a new pod).
//! Built with `k8s-openapi`'s types.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use machinery::resources::k8s::{ComponentConfig, APISERVER_ID, CONTROLLER_MANAGER_ID};

use super::args;

/// The uid a component runs as (upstream's).
fn uid(component: &str) -> i64 {
    match component {
        APISERVER_ID => 65534,
        CONTROLLER_MANAGER_ID => 65535,
        _ => 65536,
    }
}

fn host_path(name: &str, path: &str, read_only: bool) -> (Volume, VolumeMount) {
    (
        Volume {
            name: name.to_string(),
            host_path: Some(HostPathVolumeSource {
                path: path.to_string(),
                type_: Some("DirectoryOrCreate".to_string()),
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: name.to_string(),
            mount_path: path.to_string(),
            read_only: Some(read_only),
            ..VolumeMount::default()
        },
    )
}

/// The pod of `component` running `final_args`, for the final configuration `c` at
/// `config_version`.
pub fn pod(
    component: &str,
    c: &ComponentConfig,
    final_args: &[String],
    config_version: u64,
) -> Pod {
    let mut command = vec![format!("/usr/local/bin/{component}")];
    command.extend(final_args.iter().cloned());
    let mounts: Vec<(Volume, VolumeMount)> = match component {
        APISERVER_ID => vec![
            host_path("secrets", args::APISERVER_SECRETS, true),
            host_path("config", args::APISERVER_CONFIG, true),
            host_path("audit", "/var/log/audit/kube", false),
        ],
        CONTROLLER_MANAGER_ID => vec![host_path("secrets", args::CONTROLLER_MANAGER_SECRETS, true)],
        _ => vec![
            host_path("secrets", args::SCHEDULER_SECRETS, true),
            host_path("config", args::SCHEDULER_CONFIG, true),
        ],
    };
    let mut env: Vec<EnvVar> = c
        .environment_variables
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            ..EnvVar::default()
        })
        .collect();
    if component == APISERVER_ID {
        env.push(EnvVar {
            name: "POD_IP".to_string(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".to_string(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    let (cpu, memory) = match component {
        APISERVER_ID => ("200m", "512Mi"),
        CONTROLLER_MANAGER_ID => ("50m", "256Mi"),
        _ => ("10m", "64Mi"),
    };
    let labels = BTreeMap::from([
        ("tier".to_string(), "control-plane".to_string()),
        ("k8s-app".to_string(), component.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "Talos".to_string(),
        ),
    ]);
    let annotations = BTreeMap::from([(
        "talos.dev/config-version".to_string(),
        config_version.to_string(),
    )]);
    let add = if component == APISERVER_ID {
        Some(vec!["NET_BIND_SERVICE".to_string()])
    } else {
        None
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(component.to_string()),
            namespace: Some("kube-system".to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            host_network: Some(true),
            priority_class_name: Some("system-cluster-critical".to_string()),
            priority: Some(2_000_000_000),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(uid(component)),
                run_as_group: Some(uid(component)),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_string(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: component.to_string(),
                image: Some(c.image.clone()),
                command: Some(command),
                env: (!env.is_empty()).then_some(env),
                volume_mounts: Some(mounts.iter().map(|(_, m)| m.clone()).collect()),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity(cpu.to_string())),
                        ("memory".to_string(), Quantity(memory.to_string())),
                    ])),
                    ..ResourceRequirements::default()
                }),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".to_string()]),
                        add,
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            volumes: Some(mounts.into_iter().map(|(v, _)| v).collect()),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// The YAML `PodList` of `pods` (what the static pod server serves).
///
/// # Errors
///
/// A pod that does not serialize.
pub fn pod_list(pods: &[serde_json::Value]) -> Result<Vec<u8>, serde_yaml_ng::Error> {
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "items": pods,
    });
    serde_yaml_ng::to_string(&list).map(String::into_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apiserver_pod_is_upstreams_shape() {
        let c = ComponentConfig {
            image: "registry.k8s.io/kube-apiserver:v1.35.0".into(),
            ..ComponentConfig::default()
        };
        let p = pod(
            APISERVER_ID,
            &c,
            &["--etcd-servers=https://127.0.0.1:2379".into()],
            7,
        );
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["metadata"]["namespace"], "kube-system");
        assert_eq!(
            v["metadata"]["annotations"]["talos.dev/config-version"],
            "7"
        );
        assert_eq!(v["spec"]["hostNetwork"], true);
        let c0 = &v["spec"]["containers"][0];
        assert_eq!(c0["command"][0], "/usr/local/bin/kube-apiserver");
        assert_eq!(c0["command"][1], "--etcd-servers=https://127.0.0.1:2379");
        assert_eq!(c0["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(
            c0["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP"
        );
        assert_eq!(v["spec"]["securityContext"]["runAsUser"], 65534);
        let list = String::from_utf8(pod_list(&[v]).unwrap()).unwrap();
        assert!(list.starts_with("apiVersion: v1\n"), "{list}");
        assert!(list.contains("kind: PodList"));
    }
}
