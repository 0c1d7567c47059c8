//! RouteStatusController: kernel routes (IPv4 and IPv6, every table) → RouteStatus (`network`,
//! ID as upstream's `RouteID`), woken by every burst of route, address or link events.
//!
//! It keeps the kernel's routes (an [`Observer`]) and updates them from the route messages; it
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

use super::kernel_model::{Followed, Observed, Observer, Step};
use super::route_spec::RouteKey;
use crate::netlink::watch::Change;
use crate::netlink::{watch, Error, Link, Netlink, Route, AF_INET, AF_INET6};

/// `RTM_F_CLONED`: a cached route (IPv6 exceptions), not a route of a table.
const RTM_F_CLONED: u32 = 0x200;

/// The owner name.
pub const NAME: &str = "network.RouteStatusController";

/// Reports kernel routes.
#[derive(Debug)]
pub struct RouteStatusController {
    observer: Observer<Route>,
}

impl Default for RouteStatusController {
    fn default() -> Self {
        Self {
            observer: Observer::new(
                watch::GROUP_LINK | watch::GROUPS_ROUTE | watch::GROUPS_ADDRESS,
            ),
        }
    }
}

impl Followed for Route {
    type Key = RouteKey;
    const LISTING: &'static str = "list routes";

    fn list(nl: &Netlink) -> impl std::future::Future<Output = Result<Vec<Self>, Error>> + Send {
        nl.routes()
    }

    fn key(&self) -> RouteKey {
        RouteKey::of(self)
    }

    /// The status ID and the key already cover table, family, destination, gateway and
    /// priority (the ID also the link name).
    fn same(&self, b: &Self) -> bool {
        self.family == b.family
            && self.table == b.table
            && self.dst == b.dst
            && self.dst_len == b.dst_len
            && self.priority == b.priority
            && self.gateway == b.gateway
            && self.oif == b.oif
            && self.kind == b.kind
    }

    fn step(change: Change) -> Step<Self> {
        match change {
            Change::Link | Change::DelAddress(_) | Change::NewRoute { replace: true, .. } => {
                Step::Relist
            }
            Change::NewRoute { route, .. } | Change::DelRoute(route)
                if !route.multipath.is_empty() =>
            {
                Step::Relist
            }
            Change::NewRoute { route, .. } if route.flags & RTM_F_CLONED == 0 => {
                Step::Upsert(route)
            }
            Change::DelRoute(route) => Step::Remove(route),
            Change::NewAddress(_) | Change::NewRoute { .. } => Step::Ignore,
        }
    }
}

impl Observed for Route {
    type Status = RouteStatusSpec;

    fn status(&self, links: &[Link]) -> Option<(String, RouteStatusSpec)> {
        status(self, links)
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
        vec![Output::exclusive::<RouteStatusSpec>().cached()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        self.observer.reconcile(ctx).await
    }
}
