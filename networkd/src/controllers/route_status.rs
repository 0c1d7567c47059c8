//! RouteStatusController: kernel routes (IPv4 and IPv6, every table) → RouteStatus (`network`,
//! ID as upstream's `RouteID`), woken by every burst of route, address or link events.
//!
//! It keeps the kernel's routes ([`KernelModel`]) and updates them from the route messages; it
//! lists them again only when the messages cannot tell everything: at start, after lost
//! messages, after a link change or an address deletion (the kernel flushes IPv4 routes of a
//! link that goes down, or of a deleted address, without a message per route), after a
//! replace (the replaced route vanishes without one) or an append, and for any route with
//! several next hops (whose messages need not match the listing's one route).

use cosi::{Action, Context, Controller, Input, Output, ReconcileError};
use ipnet::IpNet;
use machinery::resources::network::{
    route_id, Family, RouteFlags, RouteProtocol, RouteStatusSpec, RouteType, RoutingTable, Scope,
};

use super::kernel_model::KernelModel;
use crate::netlink::watch::Change;
use crate::netlink::{watch, Kernel, Link, Route, AF_INET, AF_INET6};

/// `RTM_F_CLONED`: a cached route (IPv6 exceptions), not a route of a table.
const RTM_F_CLONED: u32 = 0x200;

/// The owner name.
pub const NAME: &str = "network.RouteStatusController";

/// Reports kernel routes.
#[derive(Debug)]
pub struct RouteStatusController {
    kernel: Kernel,
    /// The links as last listed, and the routes as listed and updated since; `None` until the
    /// first listing.
    model: Option<(Vec<Link>, KernelModel<Route>)>,
}

impl Default for RouteStatusController {
    fn default() -> Self {
        Self {
            kernel: Kernel::recording(
                watch::GROUP_LINK | watch::GROUPS_ROUTE | watch::GROUPS_ADDRESS,
            ),
            model: None,
        }
    }
}

/// Whether two kernel routes of one status ID are the same route (the ID already covers table,
/// family, destination, gateway, priority and link name).
fn same_route(a: &Route, b: &Route) -> bool {
    a.family == b.family
        && a.table == b.table
        && a.dst == b.dst
        && a.dst_len == b.dst_len
        && a.priority == b.priority
        && a.gateway == b.gateway
        && a.oif == b.oif
        && a.kind == b.kind
}

/// Applies the route messages to `model`; `false` if they cannot tell everything (the caller
/// lists again).
fn apply(
    model: &mut KernelModel<Route>,
    links: &[Link],
    changes: Vec<Change>,
) -> Result<bool, ReconcileError> {
    let status = |r: &Route| status(r, links);
    for c in changes {
        match c {
            Change::Link | Change::DelAddress(_) | Change::NewRoute { replace: true, .. } => {
                return Ok(false)
            }
            Change::NewRoute { route, .. } | Change::DelRoute(route)
                if !route.multipath.is_empty() =>
            {
                return Ok(false)
            }
            Change::NewAddress(_) => {}
            Change::NewRoute { route, .. } if route.flags & RTM_F_CLONED == 0 => {
                model.upsert(route, same_route, status)?;
            }
            Change::DelRoute(route) => model.remove(&route, same_route, status)?,
            Change::NewRoute { .. } => {}
        }
    }
    Ok(true)
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
        vec![Output::exclusive::<RouteStatusSpec>().cached()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nl = self
            .kernel
            .connect(&ctx.waker())
            .map_err(|e| ReconcileError::failed("connect to the kernel", e))?
            .clone();
        // Taken before any listing: what arrives during one is applied (again) next time,
        // which changes nothing the listing already has.
        let changes = self.kernel.changes();
        let updated = match (self.model.as_mut(), changes) {
            // A status that does not encode leaves the model half updated: listed again
            // (where the error is reported).
            (Some((links, model)), Some(changes)) => apply(model, links, changes).unwrap_or(false),
            _ => false,
        };
        if !updated {
            // Dropped first: a failed listing lists again next time.
            self.model = None;
            let links = nl
                .links()
                .await
                .map_err(|e| ReconcileError::failed("list links", e))?;
            let routes = nl
                .routes()
                .await
                .map_err(|e| ReconcileError::failed("list routes", e))?;
            let model = KernelModel::listed(routes, |r| status(r, &links))?;
            self.model = Some((links, model));
        }
        if let Some((_, model)) = &self.model {
            ctx.apply_all_raw(model.resources()).await?;
        }
        Ok(Action::AwaitChange)
    }
}
