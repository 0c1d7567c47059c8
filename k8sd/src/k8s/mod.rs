//! The Kubernetes control plane on a control plane node, as upstream's controllers render it:
//! - `k8s.ControlPlane{APIServer,ControllerManager,Scheduler}Controller` (one shape: upstream's
//!   raw and final controllers of each component in one): the component's configuration from
//!   the machine configuration (`controlplane/<Component>Configs`, ID the component's) and the
//!   final one with the flags it runs with (`final-<component>`; a denied extra arg is refused
//!   and the last final configuration stays, as upstream's failing final controller leaves it);
//! - `k8s.ControlPlaneStaticPodController`: the static pods (`k8s/StaticPods`), only while the
//!   local etcd is healthy (upstream's gate: otherwise they are removed);
//! - `k8s.StaticPodServerController`: every static pod as one YAML `PodList` on
//!   `http://127.0.0.1:<port>` (`StaticPodServerStatuses`), what a kubelet polls.
//!
//! - `k8s.KubeletConfigController`, `k8s.KubeletSpecController` ([`kubelet`]): the kubelet's
//!   flags and `KubeletConfiguration` (its `staticPodURL` is the server's).
//!
//! No kubelet runs on a talos-rs node yet: the pods and the kubelet's spec are rendered,
//! validated and served, not run; the server's status says so.

pub mod args;
pub mod files;
pub mod kubelet;
pub mod manifests;
pub mod pods;
pub mod server;

use std::marker::PhantomData;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Resource, ResourceSpec};
use machinery::config::Config;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::etcd::{EtcdStatusSpec, ETCD_ID, NAMESPACE as ETCD};
use machinery::resources::k8s::{
    ApiServerConfigSpec, ComponentConfig, ControllerManagerConfigSpec, SchedulerConfigSpec,
    StaticPodSpec, APISERVER_ID, CONTROLLER_MANAGER_ID, CONTROL_PLANE_NAMESPACE,
    DEFAULT_KUBERNETES_VERSION, FINAL_PREFIX, NAMESPACE, SCHEDULER_ID,
};

/// A component's configuration type (the three share [`ComponentConfig`]).
pub trait ComponentSpec: ResourceSpec + Clone + Send + Sync + 'static {
    /// The component (`kube-apiserver`).
    const ID: &'static str;
    /// Its controller's name.
    const CONTROLLER: &'static str;
    /// Wraps a configuration.
    fn wrap(c: ComponentConfig) -> Self;
    /// The configuration.
    fn config(&self) -> &ComponentConfig;
}

macro_rules! component_spec {
    ($t:ty, $id:expr, $controller:literal) => {
        impl ComponentSpec for $t {
            const ID: &'static str = $id;
            const CONTROLLER: &'static str = $controller;
            fn wrap(c: ComponentConfig) -> Self {
                Self(c)
            }
            fn config(&self) -> &ComponentConfig {
                &self.0
            }
        }
    };
}

component_spec!(
    ApiServerConfigSpec,
    APISERVER_ID,
    "k8s.ControlPlaneAPIServerController"
);
component_spec!(
    ControllerManagerConfigSpec,
    CONTROLLER_MANAGER_ID,
    "k8s.ControlPlaneControllerManagerController"
);
component_spec!(
    SchedulerConfigSpec,
    SCHEDULER_ID,
    "k8s.ControlPlaneSchedulerController"
);

/// The raw configuration of component `id` from a control plane's machine configuration
/// (`None`: not a control plane, or no Kubernetes CA).
pub fn raw(config: &Config, id: &str) -> Option<ComponentConfig> {
    if !config.machine_type().is_some_and(|t| t.is_control_plane()) {
        return None;
    }
    let cluster = config.cluster()?;
    cluster.ca.as_ref()?;
    let endpoint = cluster
        .control_plane
        .as_ref()
        .and_then(|cp| cp.endpoint.clone())
        .unwrap_or_default();
    let network = cluster.network.as_ref();
    let (image, extra_args, env) = match id {
        APISERVER_ID => cluster
            .api_server
            .as_ref()
            .map(|a| (a.image.clone(), a.extra_args.clone(), a.env.clone())),
        CONTROLLER_MANAGER_ID => cluster
            .controller_manager
            .as_ref()
            .map(|a| (a.image.clone(), a.extra_args.clone(), a.env.clone())),
        _ => cluster
            .scheduler
            .as_ref()
            .map(|a| (a.image.clone(), a.extra_args.clone(), a.env.clone())),
    }
    .unwrap_or_default();
    Some(ComponentConfig {
        enabled: true,
        image: image
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| format!("registry.k8s.io/{id}:{DEFAULT_KUBERNETES_VERSION}")),
        control_plane_endpoint: endpoint,
        local_port: cluster
            .control_plane
            .as_ref()
            .and_then(|cp| cp.local_api_server_port)
            .unwrap_or(6443),
        pod_cidrs: network
            .map(|n| n.pod_subnets.clone())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec!["10.244.0.0/16".to_string()]),
        service_cidrs: network
            .map(|n| n.service_subnets.clone())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec!["10.96.0.0/12".to_string()]),
        extra_args,
        environment_variables: env,
        args: Vec::new(),
    })
}

/// `k8s.ControlPlane<Component>Controller`: raw and final configuration of one component.
pub struct ComponentController<S> {
    /// The last refusal logged.
    refused: Option<String>,
    _spec: PhantomData<S>,
}

impl<S> Default for ComponentController<S> {
    fn default() -> Self {
        Self {
            refused: None,
            _spec: PhantomData,
        }
    }
}

impl<S: ComponentSpec> Controller for ComponentController<S> {
    fn name(&self) -> &'static str {
        S::CONTROLLER
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<MachineConfigSpec>(REDACTED_NAMESPACE).with_id(ACTIVE_ID)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<S>().in_namespace(CONTROL_PLANE_NAMESPACE)]
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
        let Some(raw) = raw(&config, S::ID) else {
            return Ok(Action::AwaitChange);
        };
        ctx.apply(Resource::new(
            CONTROL_PLANE_NAMESPACE,
            S::ID,
            S::wrap(raw.clone()),
        ))
        .await?;
        let final_id = format!("{FINAL_PREFIX}{}", S::ID);
        match args::render(S::ID, &raw) {
            Ok(a) => {
                self.refused = None;
                let mut fin = raw;
                fin.args = a;
                ctx.apply(Resource::new(
                    CONTROL_PLANE_NAMESPACE,
                    final_id,
                    S::wrap(fin),
                ))
                .await?;
            }
            Err(denied) => {
                let why = denied
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                if self.refused.as_deref() != Some(why.as_str()) {
                    tracing::error!(component = S::ID, error = %why, "the component's extra args are refused: it keeps its flags");
                    self.refused = Some(why);
                }
                if let Some(r) = ctx.get::<S>(CONTROL_PLANE_NAMESPACE, &final_id).await? {
                    ctx.apply(r).await?;
                }
            }
        }
        Ok(Action::AwaitChange)
    }
}

/// `k8s.ControlPlaneStaticPodController`.
#[derive(Default)]
pub struct StaticPodController;

impl StaticPodController {
    async fn pod_of<S: ComponentSpec>(
        ctx: &Context,
    ) -> Result<Option<(String, serde_json::Value)>, ReconcileError> {
        let id = format!("{FINAL_PREFIX}{}", S::ID);
        let Some(fin) = ctx.get::<S>(CONTROL_PLANE_NAMESPACE, &id).await? else {
            return Ok(None);
        };
        let c = fin.spec.config();
        if !c.enabled {
            return Ok(None);
        }
        let pod = pods::pod(S::ID, c, &c.args, fin.metadata.version);
        let v = serde_json::to_value(&pod)
            .map_err(|e| ReconcileError::failed("cannot encode a static pod", e))?;
        Ok(Some((S::ID.to_string(), v)))
    }
}

impl Controller for StaticPodController {
    fn name(&self) -> &'static str {
        "k8s.ControlPlaneStaticPodController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<ApiServerConfigSpec>(CONTROL_PLANE_NAMESPACE),
            Input::weak::<ControllerManagerConfigSpec>(CONTROL_PLANE_NAMESPACE),
            Input::weak::<SchedulerConfigSpec>(CONTROL_PLANE_NAMESPACE),
            Input::weak::<EtcdStatusSpec>(ETCD).with_id(ETCD_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<StaticPodSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let healthy = ctx
            .get::<EtcdStatusSpec>(ETCD, ETCD_ID)
            .await?
            .is_some_and(|s| s.spec.healthy);
        if !healthy {
            // Upstream's gate: no static pods without a healthy local etcd.
            return Ok(Action::AwaitChange);
        }
        let mut out = Vec::new();
        for p in [
            Self::pod_of::<ApiServerConfigSpec>(ctx).await?,
            Self::pod_of::<ControllerManagerConfigSpec>(ctx).await?,
            Self::pod_of::<SchedulerConfigSpec>(ctx).await?,
        ]
        .into_iter()
        .flatten()
        {
            out.push(Resource::new(NAMESPACE, p.0, StaticPodSpec { pod: p.1 }));
        }
        ctx.apply_all(out).await?;
        Ok(Action::AwaitChange)
    }
}
