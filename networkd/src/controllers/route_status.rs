//! RouteStatusController: kernel routes (IPv4 and IPv6, every table) → RouteStatus (`network`,
//! ID as upstream's `RouteID`), re-listed on every burst of route or link events.

use std::collections::BTreeSet;

use cosi::{Action, Context, Controller, Input, Output, ReconcileError, Resource};
use ipnet::IpNet;
use machinery::resources::network::{
    route_id, Family, RouteFlags, RouteProtocol, RouteStatusSpec, RouteType, RoutingTable, Scope,
    NAMESPACE,
};

use crate::netlink::{watch, Kernel, Link, Route, AF_INET, AF_INET6};

/// The owner name.
pub const NAME: &str = "network.RouteStatusController";

/// Reports kernel routes.
#[derive(Debug)]
pub struct RouteStatusController {
    kernel: Kernel,
}

impl Default for RouteStatusController {
    fn default() -> Self {
        Self {
            kernel: Kernel::new(watch::GROUP_LINK | watch::GROUPS_ROUTE),
        }
    }
}

/// The ID and status of one kernel route; `None` for families other than IPv4/IPv6 or an
/// invalid destination.
pub(crate) fn status(r: &Route, links: &[Link]) -> Option<(String, RouteStatusSpec)> {
    let family = match r.family {
        AF_INET => Family::Inet4,
        AF_INET6 => Family::Inet6,
        _ => return None,
    };
    let destination = match (r.dst, r.dst_len) {
        (_, 0) => None,
        (Some(d), len) => Some(IpNet::new(d, len).ok()?),
        (None, _) => return None,
    };
    let out_link_name = links
        .iter()
        .find(|l| l.index == r.oif && r.oif != 0)
        .map(|l| l.name.clone())
        .unwrap_or_default();
    let spec = RouteStatusSpec {
        family,
        destination,
        source: r.src,
        gateway: r.gateway,
        out_link_index: r.oif,
        out_link_name,
        table: RoutingTable(r.table),
        priority: r.priority,
        scope: Scope::from_number(r.scope).unwrap_or_default(),
        r#type: RouteType::from_number(r.kind).unwrap_or_default(),
        flags: RouteFlags(r.flags),
        protocol: RouteProtocol(r.protocol),
        mtu: r.mtu,
    };
    let id = route_id(
        spec.table,
        family,
        spec.destination.as_ref(),
        spec.gateway.as_ref(),
        spec.priority,
        &spec.out_link_name,
    );
    Some((id, spec))
}

impl Controller for RouteStatusController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<RouteStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nl = self
            .kernel
            .connect(&ctx.waker())
            .map_err(|e| ReconcileError::failed("connect to the kernel", e))?
            .clone();
        let links = nl
            .links()
            .await
            .map_err(|e| ReconcileError::failed("list links", e))?;
        let routes = nl
            .routes()
            .await
            .map_err(|e| ReconcileError::failed("list routes", e))?;
        let mut seen = BTreeSet::new();
        // Routes the ID cannot tell apart (e.g. of different types) are reported once, so a
        // pass never writes one resource twice.
        let statuses = routes
            .iter()
            .filter_map(|r| status(r, &links))
            .filter(|(id, _)| seen.insert(id.clone()))
            .map(|(id, spec)| Resource::new(NAMESPACE, id, spec));
        ctx.apply_all(statuses.collect::<Vec<_>>()).await?;
        Ok(Action::AwaitChange)
    }
}
