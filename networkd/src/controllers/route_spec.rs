//! RouteSpecController: merged RouteSpecs (`network`) → kernel routes (networking.md §3.5).
//!
//! - A kernel route matches a spec when family, destination, gateway, table and metric agree
//!   (an IPv6 spec metric 0 matches the kernel's 1024).
//! - Running: a match is kept if scope, on-link flag, output link (when the spec names one),
//!   preferred source (when set), MTU and type agree, whoever added it; a differing match is
//!   deleted; if none is kept the route is added, marked as networkd's. The kernel's own,
//!   changing flags (linkdown, offload ...) are never compared, so a link going down and up
//!   causes no delete/re-add.
//! - Tearing down: only matches networkd added are deleted; then the finalizer goes.
//! - Routes without a gateway go first, so the `/32` link-scope route to an off-subnet gateway
//!   exists before the default route through it (upstream #4320). ENETUNREACH and friends fail
//!   the pass, which is retried with backoff and on every route or link event.
//! - The kernel's routes are followed from its messages ([`Follower`]), not dumped at every
//!   pass: a pass looks them up by their identity (not a scan per spec) and has up to
//!   `link_spec::IN_FLIGHT` (32) netlink requests outstanding: the routes without a gateway
//!   all at once, then those with one. Route, address and link events wake it.

use std::net::IpAddr;

use cosi::runtime::Mirror;
use cosi::{Action, Context, Controller, Input, Output, Phase, ReconcileError};
use machinery::resources::network::{
    Family, RouteFlags, RouteSpec, RouteSpecSpec, RoutingTable, DEFAULT_ROUTE_METRIC, NAMESPACE,
};

use crate::netlink::{self, watch, Link, Route};

use super::kernel_model::{Follower, Table};
use super::link_spec::{aggregate, in_flight};

/// The owner and finalizer name.
pub const NAME: &str = "network.RouteSpecController";

/// How soon a route whose gateway is unreachable is tried again without a route event.
pub const UNREACHABLE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// The outcome of converging one route.
#[derive(Debug, PartialEq, Eq)]
enum Applied {
    /// As the spec says (or waiting for its link).
    Done,
    /// The kernel cannot reach the gateway yet (ENETUNREACH): typically the address that makes
    /// it on-link is not there yet.
    Unreachable,
}

/// Applies RouteSpecs to the kernel.
#[derive(Debug)]
pub struct RouteSpecController {
    /// The kernel's routes. Address events too: the kernel flushes the routes of a deleted
    /// preferred source without a message per route.
    routes: Follower<Route>,
    /// The specs, decoded once per version.
    specs: Mirror<RouteSpecSpec>,
}

impl Default for RouteSpecController {
    fn default() -> Self {
        Self {
            routes: Follower::new(watch::GROUP_LINK | watch::GROUPS_ROUTE | watch::GROUPS_ADDRESS),
            specs: Mirror::default(),
        }
    }
}

impl Controller for RouteSpecController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<RouteSpecSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        ctx.refresh(NAMESPACE, &mut self.specs).await?;
        let mut specs: Vec<&RouteSpec> = self.specs.iter().collect();
        specs.sort_by_key(|s| (s.metadata.phase == Phase::Running, s.spec.gateway.is_some()));
        let (nl, routes) = self.routes.sync(&ctx.waker()).await?;
        let links = nl
            .links()
            .await
            .map_err(|e| ReconcileError::failed("list links", e))?;
        ctx.add_finalizers(specs.iter().copied(), NAME).await?;
        let mut errors = Vec::new();
        let mut unreachable = false;
        // Teardowns first, one by one (rare, and each removes a finalizer).
        for spec in specs
            .iter()
            .filter(|s| s.metadata.phase == Phase::TearingDown)
        {
            if let Err(e) = teardown(ctx, &nl, spec, routes).await {
                errors.push(e);
            }
        }
        // Then the routes without a gateway, all at once, then those with one (`specs` is
        // sorted so): a gateway must be reachable through the former.
        let running: Vec<&RouteSpecSpec> = specs
            .iter()
            .filter(|s| s.metadata.phase == Phase::Running)
            .map(|s| &s.spec)
            .collect();
        let split = running.partition_point(|s| s.gateway.is_none());
        for wave in [&running[..split], &running[split..]] {
            let passes = wave.iter().map(|s| converge(&nl, s, &links, routes));
            let results = in_flight(passes.collect()).await;
            for result in results {
                match result {
                    Ok(Applied::Done) => {}
                    Ok(Applied::Unreachable) => unreachable = true,
                    Err(e) => errors.push(e),
                }
            }
        }
        match aggregate("routes", errors)? {
            // The route (prefix) that makes the gateway reachable wakes us; poll too, in case.
            _ if unreachable => Ok(Action::RequeueAfter(UNREACHABLE_RETRY)),
            action => Ok(action),
        }
    }
}

/// The kernel's identity of a route: family, table, destination, gateway and metric (what a
/// spec is matched by).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct RouteKey {
    family: u8,
    table: u32,
    dst: Option<IpAddr>,
    dst_len: u8,
    gateway: Option<IpAddr>,
    priority: u32,
}

impl RouteKey {
    pub(crate) fn of(r: &Route) -> Self {
        Self {
            family: r.family,
            table: r.table,
            dst: if r.dst_len == 0 { None } else { r.dst },
            dst_len: r.dst_len,
            gateway: r.gateway,
            priority: r.priority,
        }
    }

    /// The keys of the kernel routes a spec matches: one, or two for an IPv6 spec of metric 0
    /// (the kernel's 1024 too).
    fn of_spec(s: &RouteSpecSpec) -> impl Iterator<Item = Self> {
        let family = family(s);
        let (dst, dst_len) = match s.destination {
            Some(d) if d.prefix_len() != 0 => (Some(d.addr()), d.prefix_len()),
            Some(_) | None => (None, 0),
        };
        let key = Self {
            family,
            table: table(s),
            dst,
            dst_len,
            gateway: s.gateway,
            priority: s.priority,
        };
        let v6_default = family == Family::Inet6.number() && s.priority == 0;
        std::iter::once(key).chain(v6_default.then_some(Self {
            priority: DEFAULT_ROUTE_METRIC,
            ..key
        }))
    }
}

/// The kernel routes a spec describes (the same identity; for an IPv6 spec of metric 0, the
/// kernel's 1024 too), in the kernel's order within a key.
fn matches<'a>(routes: &'a Table<Route>, s: &RouteSpecSpec) -> impl Iterator<Item = &'a Route> {
    RouteKey::of_spec(s).flat_map(|k| routes.get(&k))
}

/// The kernel table of a spec (unspec means main).
fn table(s: &RouteSpecSpec) -> u32 {
    if s.table == RoutingTable::UNSPEC {
        RoutingTable::MAIN.0
    } else {
        s.table.0
    }
}

/// The family number of a spec, from its field or its addresses.
fn family(s: &RouteSpecSpec) -> u8 {
    match s.family {
        Family::Unspec => s
            .destination
            .map(|d| d.addr())
            .or(s.gateway)
            .map_or(0, |a| Family::of(&a).number()),
        f => f.number(),
    }
}

/// Whether kernel route `r` is the route a spec describes (the kernel's identity of a route),
/// by a scan: what [`matches`] must find by key.
#[cfg(test)]
pub(crate) fn is_match(r: &Route, s: &RouteSpecSpec) -> bool {
    let fam = family(s);
    if r.family != fam || r.table != table(s) {
        return false;
    }
    let (dst, dst_len) = match s.destination {
        Some(d) => (Some(d.addr()), d.prefix_len()),
        None => (None, 0),
    };
    if r.dst_len != dst_len || (dst_len != 0 && r.dst != dst) {
        return false;
    }
    if r.gateway != s.gateway {
        return false;
    }
    let v6_default = fam == Family::Inet6.number() && s.priority == 0;
    r.priority == s.priority || (v6_default && r.priority == DEFAULT_ROUTE_METRIC)
}

/// Whether a matching kernel route already is what the spec asks for.
pub(crate) fn is_equal(r: &Route, s: &RouteSpecSpec, oif: u32) -> bool {
    let onlink = RouteFlags::ONLINK.0;
    r.scope == s.scope.number()
        && (r.flags & onlink) == (s.flags.0 & onlink)
        && (s.out_link_name.is_empty() || r.oif == oif)
        && (s.source.is_none() || r.src == s.source)
        && r.mtu == s.mtu
        && r.kind == s.r#type.number()
}

async fn teardown(
    ctx: &Context,
    nl: &netlink::Netlink,
    spec: &RouteSpec,
    routes: &Table<Route>,
) -> Result<(), ReconcileError> {
    let s = &spec.spec;
    for r in matches(routes, s) {
        if !r.is_owned() {
            tracing::info!(route = %spec.id(), "route not added by networkd, left in place");
            continue;
        }
        match nl.delete_route(r).await {
            Ok(()) => tracing::info!(route = %spec.id(), "route deleted"),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                return Err(ReconcileError::failed(
                    format!("delete route {}", spec.id()),
                    e,
                ))
            }
        }
    }
    ctx.remove_finalizer::<RouteSpecSpec>(NAMESPACE, spec.id(), NAME)
        .await
}

async fn converge(
    nl: &netlink::Netlink,
    s: &RouteSpecSpec,
    links: &[Link],
    routes: &Table<Route>,
) -> Result<Applied, ReconcileError> {
    let id = s.id();
    let oif = if s.out_link_name.is_empty() {
        0
    } else {
        match netlink::resolve_link(links, &s.out_link_name, false) {
            Some(l) => l.index,
            None => {
                tracing::debug!(route = %id, link = %s.out_link_name, "link missing");
                return Ok(Applied::Done);
            }
        }
    };
    let mut kept = false;
    let mut stale = Vec::new();
    for r in matches(routes, s) {
        if !kept && is_equal(r, s, oif) {
            kept = true;
        } else {
            stale.push(r);
        }
    }
    for r in stale {
        tracing::info!(route = %id, "route differs from its spec, replacing");
        match nl.delete_route(r).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(ReconcileError::failed(format!("delete route {id}"), e)),
        }
    }
    if kept {
        return Ok(Applied::Done);
    }
    let (dst, dst_len) = match s.destination {
        Some(d) => (Some(d.addr()), d.prefix_len()),
        None => (None, 0),
    };
    let fam = family(s);
    let priority = if fam == Family::Inet6.number() && s.priority == 0 {
        DEFAULT_ROUTE_METRIC
    } else {
        s.priority
    };
    let route = Route {
        family: fam,
        dst,
        dst_len,
        src: s.source,
        gateway: s.gateway.filter(|g: &IpAddr| !g.is_unspecified()),
        oif,
        table: table(s),
        priority,
        scope: s.scope.number(),
        protocol: netlink::OWN_PROTOCOL,
        kind: s.r#type.number(),
        flags: s.flags.0 & RouteFlags::ONLINK.0,
        mtu: s.mtu,
        multipath: Vec::new(),
    };
    match nl.add_route(&route).await {
        Ok(()) => {
            tracing::info!(route = %id, "route added");
            Ok(Applied::Done)
        }
        Err(e) if e.is_exists() => Ok(Applied::Done),
        Err(e) if e.errno() == Some(netlink::errno::ENETUNREACH) => {
            tracing::debug!(route = %id, "gateway unreachable for now, route waits");
            Ok(Applied::Unreachable)
        }
        Err(e) => Err(ReconcileError::failed(format!("add route {id}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::network::{ConfigLayer, RouteProtocol, RouteType, Scope};

    fn default_route() -> RouteSpecSpec {
        let mut s = RouteSpecSpec {
            family: Family::Inet4,
            gateway: Some("10.0.0.1".parse().expect("ip")),
            out_link_name: "eth0".into(),
            table: RoutingTable::MAIN,
            priority: 1024,
            r#type: RouteType::Unicast,
            protocol: RouteProtocol::STATIC,
            layer: ConfigLayer::Configuration,
            ..RouteSpecSpec::default()
        };
        s.normalize();
        s
    }

    fn kernel(s: &RouteSpecSpec) -> Route {
        Route {
            family: 2,
            dst: None,
            dst_len: 0,
            src: None,
            gateway: s.gateway,
            oif: 3,
            table: 254,
            priority: 1024,
            scope: 0,
            protocol: netlink::OWN_PROTOCOL,
            kind: 1,
            flags: 0,
            mtu: 0,
            multipath: vec![],
        }
    }

    #[test]
    fn kernel_flags_do_not_cause_a_replacement() {
        let s = default_route();
        assert_eq!(s.scope, Scope::Global);
        let mut r = kernel(&s);
        assert!(is_match(&r, &s));
        assert!(is_equal(&r, &s, 3));
        r.flags = RouteFlags::LINKDOWN.0;
        assert!(is_equal(&r, &s, 3), "linkdown is the kernel's");
        r.protocol = 3;
        assert!(
            is_equal(&r, &s, 3),
            "a foreign equal route satisfies the spec"
        );
        r.oif = 4;
        assert!(!is_equal(&r, &s, 3));
    }

    /// The table finds exactly what a scan with [`is_match`] finds, for specs that differ from
    /// the kernel's routes in each part of the identity (in the kernel's order: no spec here
    /// matches routes under both of an IPv6 metric-0 spec's keys).
    #[test]
    fn the_table_agrees_with_a_scan() {
        let base = default_route();
        let mut routes = Vec::new();
        let mut specs = Vec::new();
        for (i, gw) in ["10.0.0.1", "10.0.0.2"].iter().enumerate() {
            for priority in [0, 100, 1024] {
                for table in [254, 100] {
                    let mut s = RouteSpecSpec {
                        gateway: Some(gw.parse().expect("ip")),
                        priority,
                        table: RoutingTable(table),
                        ..base.clone()
                    };
                    s.normalize();
                    let mut r = kernel(&s);
                    r.priority = priority;
                    r.table = table;
                    r.oif = 3 + i as u32;
                    routes.push(r.clone());
                    // A duplicate of another type: both match.
                    r.kind = 2;
                    routes.push(r);
                    specs.push(s);
                }
            }
        }
        for (dst, prio) in [
            ("2001:db8::/64", 1024),
            ("2001:db8::/64", 0),
            ("2001:db8:1::/64", 0),
        ] {
            let mut v6 = RouteSpecSpec {
                family: Family::Inet6,
                destination: Some(dst.parse().expect("prefix")),
                priority: prio,
                ..RouteSpecSpec::default()
            };
            v6.normalize();
            specs.push(v6);
        }
        routes.push(Route {
            family: 10,
            dst: Some("2001:db8::".parse().expect("ip")),
            dst_len: 64,
            priority: 1024,
            gateway: None,
            ..kernel(&base)
        });
        // A default route with a zero destination address, as some kernels report it.
        routes.push(Route {
            dst: Some("0.0.0.0".parse().expect("ip")),
            ..kernel(&base)
        });
        let table = Table::listed(routes.clone());
        let mut found = 0;
        for s in &specs {
            let scanned: Vec<&Route> = routes.iter().filter(|r| is_match(r, s)).collect();
            let indexed: Vec<&Route> = matches(&table, s).collect();
            assert_eq!(indexed, scanned, "spec {s:?}");
            found += scanned.len();
        }
        assert!(
            found > specs.len(),
            "the cases must match something ({found})"
        );
    }

    #[test]
    fn matching_by_identity() {
        let s = default_route();
        let mut r = kernel(&s);
        r.priority = 100;
        assert!(!is_match(&r, &s));
        let mut r = kernel(&s);
        r.gateway = Some("10.0.0.2".parse().expect("ip"));
        assert!(!is_match(&r, &s));
        let mut r = kernel(&s);
        r.table = 100;
        assert!(!is_match(&r, &s));

        let mut v6 = RouteSpecSpec {
            family: Family::Inet6,
            destination: Some("2001:db8::/64".parse().expect("prefix")),
            ..RouteSpecSpec::default()
        };
        v6.normalize();
        let r = Route {
            family: 10,
            dst: Some("2001:db8::".parse().expect("ip")),
            dst_len: 64,
            priority: 1024,
            gateway: None,
            ..kernel(&s)
        };
        assert!(is_match(&r, &v6), "IPv6 metric 0 is the kernel's 1024");
    }
}
