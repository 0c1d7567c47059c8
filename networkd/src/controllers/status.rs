//! `network.StatusController`: the network Status (`status`) from the node addresses, the
//! routes, the hostname and the rendered etc files, as upstream `status.go` (without probes,
//! which networkd does not run: connectivity is "a default route exists"), plus the settings of
//! the machine configuration that networkd does not apply (`unapplied`, from
//! [`machinery::config::unapplied`]), so that none of them is ignored silently.

use std::future::Future;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Phase, Resource};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE as CONFIG_NS};
use machinery::resources::network::{
    EtcFileStatusSpec, HostnameStatusSpec, NodeAddressSpec, RouteStatusSpec, StatusSpec,
    ETC_HOSTS_ID, ETC_RESOLV_CONF_ID, HOSTNAME_ID, NAMESPACE, NODE_ADDRESS_CURRENT_ID, STATUS_ID,
};

/// `network.StatusController`.
#[derive(Debug, Default)]
pub struct StatusController {
    /// The unapplied settings last logged.
    reported: Vec<String>,
    /// The unapplied settings of the current configuration.
    unapplied: super::source::FromConfig<Vec<String>>,
}

impl StatusController {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let address_ready = ctx
            .get::<NodeAddressSpec>(NAMESPACE, NODE_ADDRESS_CURRENT_ID)
            .await?
            .is_some_and(|n| !n.spec.addresses.is_empty());
        let connectivity_ready = ctx
            .list::<RouteStatusSpec>(NAMESPACE)
            .await?
            .iter()
            .any(|r| r.metadata.phase == Phase::Running && r.spec.destination.is_none());
        let hostname_ready = ctx
            .get::<HostnameStatusSpec>(NAMESPACE, HOSTNAME_ID)
            .await?
            .is_some();
        let mut etc_files_ready = true;
        for id in [ETC_HOSTS_ID, ETC_RESOLV_CONF_ID] {
            etc_files_ready &= ctx.get::<EtcFileStatusSpec>(NAMESPACE, id).await?.is_some();
        }
        let unapplied = self
            .unapplied
            .get(ctx, |yaml, _| unapplied(yaml))
            .await?
            .clone();
        if unapplied != self.reported {
            for u in unapplied.iter().filter(|u| !self.reported.contains(u)) {
                tracing::warn!(setting = %u, "machine configuration setting not applied");
            }
            self.reported.clone_from(&unapplied);
        }
        ctx.apply(Resource::new(
            NAMESPACE,
            STATUS_ID,
            StatusSpec {
                address_ready,
                connectivity_ready,
                hostname_ready,
                etc_files_ready,
                unapplied,
            },
        ))
        .await?;
        Ok(Action::AwaitChange)
    }
}

/// The settings of a machine configuration networkd does not apply, as `path: what`; nothing
/// for a configuration that does not decode (the Config controllers report that one).
pub fn unapplied(yaml: &str) -> Vec<String> {
    machinery::config::Config::from_yaml(yaml)
        .map(|c| {
            machinery::config::unapplied(&c)
                .iter()
                .map(ToString::to_string)
                .collect()
        })
        .unwrap_or_default()
}

impl Controller for StatusController {
    fn name(&self) -> &'static str {
        "network.StatusController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<NodeAddressSpec>(NAMESPACE).with_id(NODE_ADDRESS_CURRENT_ID),
            Input::weak::<RouteStatusSpec>(NAMESPACE),
            Input::weak::<HostnameStatusSpec>(NAMESPACE).with_id(HOSTNAME_ID),
            Input::weak::<EtcFileStatusSpec>(NAMESPACE),
            Input::weak::<MachineConfigSpec>(CONFIG_NS).with_id(ACTIVE_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<StatusSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}
