//! `network.StatusController`: the network Status (`status`) from the node addresses, the
//! routes, the hostname and the rendered etc files, as upstream `status.go` (without probes,
//! which networkd does not run: connectivity is "a default route exists"), plus the settings of
//! the machine configuration that networkd does not apply (`unapplied`, from
//! [`machinery::config::unapplied`]), so that none of them is ignored silently.

use std::future::Future;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Phase, Resource, ResourceSpec};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE as CONFIG_NS};
use machinery::resources::network::{
    EtcFileStatusSpec, HostnameStatusSpec, NodeAddressSpec, RouteStatusSpec, StatusSpec,
    ETC_HOSTS_ID, ETC_RESOLV_CONF_ID, HOSTNAME_ID, NAMESPACE, NODE_ADDRESS_CURRENT_ID, STATUS_ID,
};

/// The IDs of default routes: no destination, so the ID ends with `//` and the priority.
const DEFAULT_ROUTE_IDS: &str = "//[0-9]+$";

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
        // Only the default routes (no destination: their IDs end `//<priority>`, see
        // `route_id`) are read, not every route of the node at every wake-up.
        let connectivity_ready = ctx
            .list_raw(
                NAMESPACE,
                RouteStatusSpec::TYPE,
                &cosi::Query::default().id_regexp(DEFAULT_ROUTE_IDS),
            )
            .await?
            .iter()
            .filter(|r| r.metadata.phase == Phase::Running)
            .map(Resource::<RouteStatusSpec>::from_raw)
            .any(|r| r.is_ok_and(|r| r.spec.destination.is_none()));
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
    super::source::parsed(yaml)
        .config
        .as_ref()
        .map(|c| {
            machinery::config::unapplied(c)
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

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::network::{route_id, Family, RoutingTable};

    #[test]
    fn the_default_route_query_matches_default_routes_only() {
        let re = regex::Regex::new(DEFAULT_ROUTE_IDS).expect("regex");
        let gw4: std::net::IpAddr = "10.5.0.1".parse().expect("ip");
        let gw6: std::net::IpAddr = "fe80::1".parse().expect("ip");
        let dst4: ipnet::IpNet = "10.100.0.0/24".parse().expect("net");
        let dst6: ipnet::IpNet = "fd00::/64".parse().expect("net");
        let default = [
            route_id(
                RoutingTable::MAIN,
                Family::Inet4,
                None,
                Some(&gw4),
                1024,
                "eth0",
            ),
            route_id(RoutingTable::MAIN, Family::Inet4, None, None, 0, "eth0"),
            route_id(
                RoutingTable::MAIN,
                Family::Inet6,
                None,
                Some(&gw6),
                1024,
                "eth0",
            ),
            route_id(
                RoutingTable(100),
                Family::Inet4,
                None,
                Some(&gw4),
                5,
                "eth0",
            ),
        ];
        let other = [
            route_id(
                RoutingTable::MAIN,
                Family::Inet4,
                Some(&dst4),
                Some(&gw4),
                1024,
                "eth0",
            ),
            route_id(
                RoutingTable::MAIN,
                Family::Inet4,
                Some(&dst4),
                None,
                0,
                "eth0",
            ),
            route_id(
                RoutingTable::MAIN,
                Family::Inet6,
                Some(&dst6),
                Some(&gw6),
                1024,
                "eth0",
            ),
            route_id(
                RoutingTable::LOCAL,
                Family::Inet6,
                Some(&dst6),
                None,
                0,
                "eth0",
            ),
        ];
        for id in &default {
            assert!(re.is_match(id), "{id} is a default route");
        }
        for id in &other {
            assert!(!re.is_match(id), "{id} is not a default route");
        }
    }
}
