//! OperatorSpecController: merged OperatorSpecs (`network`) → running DHCPv4 and DHCPv6
//! operators, and their results as operator-layer specs in `network-config` (networking.md
//! §3.7, §3.8).
//!
//! - An operator runs while its link exists and (with `requireUp`) is operationally up or
//!   unknown, or up with carrier before the kernel says operationally up (ours: the kernel
//!   reports operstate up to a second after carrier; `LinkStatusSpec::dhcp_ready`). A changed
//!   spec or identity restarts it from its lease.
//! - Its lease is kept in stated as `DHCP4Lease` / `DHCP6Lease` (`network`, ID = operator
//!   ID, e.g. `dhcp4/eth0`, `dhcp6/eth0`). A restarted networkd, or a link that comes back, starts the operator from
//!   that lease: it republishes the same specs (nothing in the kernel changes) and renews at once.
//! - A link that goes down stops the operator without RELEASE, and its specs stay until the
//!   lease expires (a hold-down by lease validity; upstream drops them at once, §3.7).
//! - An OperatorSpec that goes away (config change) stops the operator with a RELEASE; the
//!   lease and the specs are then no longer asserted and are removed.
//! - Specs, IDs under the operator prefix (`dhcp4/eth0/...`), as upstream: the address
//!   (`yiaddr/mask`, permanent, priority = route metric), routes (option 121 if present, else a
//!   default route per router; a `/32` link-scope route to each off-subnet gateway), the MTU
//!   (option 26, default layer), hostname (options 12 and 15, when requested), resolvers
//!   (option 6, search = 119 ∪ 15) and time servers (option 42).
//! - DHCPv6 specs, under `dhcp6/eth0/...`, as upstream's DHCP6 operator: the IA_NA address as a
//!   `/128` (permanent, global), resolvers (option 23, search = option 24), time servers
//!   (option 56) and the hostname (option 39, when requested). No routes and no MTU: those come
//!   from router advertisements, which the kernel handles. The client identifier is the
//!   configured DUID (`dhcpOptions.duidv6`), else DUID-LL of the link's MAC.
//! - VIP operators (`vip/eth0/10.5.0.100`): k8sd campaigns for the IP in etcd and publishes
//!   where this node stands as `vip/VIPElections/<IP>`; while it says `leader`, the IP is an
//!   operator-layer address spec under `vip/<link>/` (upstream's VIP operator: `/32` or
//!   `/128`, global, permanent, announced with a gratuitous ARP for IPv4 when
//!   `gratuitousARP`). The link is this OperatorSpec's: k8sd can only say whether this node
//!   holds an IP the configuration names, never which address or where. A restarted networkd
//!   republishes the same spec (nothing in the kernel changes).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use cosi::{Action, Context, Controller, Input, Output, Phase, ReconcileError, Resource};
use ipnet::{IpNet, Ipv4Net};
use machinery::resources::network::{
    operator_prefixed_id, AddressFlags, AddressSpecSpec, ClientIdentifier, ConfigLayer, Family,
    HostnameSpecSpec, HostnameStatusSpec, LinkSpecSpec, LinkStatusSpec, Operator, OperatorSpecSpec,
    ResolverSpecSpec, RouteProtocol, RouteSpecSpec, RouteType, RoutingTable, Scope,
    TimeServerSpecSpec, CONFIG_NAMESPACE, DEFAULT_ROUTE_METRIC, HOSTNAME_ID, NAMESPACE,
    RESOLVER_ID, TIME_SERVER_ID,
};

use machinery::resources::etcd::{VipElectionSpec, VIP_NAMESPACE};

use crate::dhcp::{self, Dhcp4LeaseSpec, Identity, Lease};
use crate::dhcp6::{self, Dhcp6LeaseSpec};

/// The owner name.
pub const NAME: &str = "network.OperatorSpecController";

/// A running operator and what it was started with.
#[derive(Debug)]
struct Running {
    operator: dhcp::Operator,
    spec: OperatorSpecSpec,
}

/// A running DHCPv6 operator and what it was started with.
#[derive(Debug)]
struct Running6 {
    operator: dhcp6::Operator,
    spec: OperatorSpecSpec,
}

/// Runs DHCPv4 and DHCPv6 operators and publishes their leases as specs.
#[derive(Debug, Default)]
pub struct OperatorSpecController {
    running: BTreeMap<String, Running>,
    running6: BTreeMap<String, Running6>,
}

impl Controller for OperatorSpecController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<OperatorSpecSpec>(NAMESPACE),
            Input::weak::<LinkStatusSpec>(NAMESPACE),
            Input::weak::<HostnameStatusSpec>(NAMESPACE).with_id(HOSTNAME_ID),
            Input::weak::<VipElectionSpec>(VIP_NAMESPACE),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<Dhcp4LeaseSpec>(),
            Output::exclusive::<Dhcp6LeaseSpec>(),
            Output::shared::<AddressSpecSpec>().in_namespace(CONFIG_NAMESPACE),
            Output::shared::<RouteSpecSpec>().in_namespace(CONFIG_NAMESPACE),
            Output::shared::<LinkSpecSpec>().in_namespace(CONFIG_NAMESPACE),
            Output::shared::<HostnameSpecSpec>().in_namespace(CONFIG_NAMESPACE),
            Output::shared::<ResolverSpecSpec>().in_namespace(CONFIG_NAMESPACE),
            Output::shared::<TimeServerSpecSpec>().in_namespace(CONFIG_NAMESPACE),
        ]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let mut specs4 = BTreeMap::new();
        let mut specs6 = BTreeMap::new();
        let mut vips = BTreeMap::new();
        for s in ctx.list::<OperatorSpecSpec>(NAMESPACE).await? {
            if s.metadata.phase != Phase::Running {
                continue;
            }
            match s.spec.operator {
                Operator::Dhcp4 => {
                    specs4.insert(s.id().to_string(), s.spec);
                }
                Operator::Dhcp6 => {
                    specs6.insert(s.id().to_string(), s.spec);
                }
                Operator::Vip => {
                    vips.insert(s.id().to_string(), s.spec);
                }
            }
        }
        let links = ctx.list::<LinkStatusSpec>(NAMESPACE).await?;
        let hostname = ctx
            .get::<HostnameStatusSpec>(NAMESPACE, HOSTNAME_ID)
            .await?
            .map(|h| h.spec);
        let requeue4 = self.dhcp4(ctx, &specs4, &links, hostname.as_ref()).await?;
        let requeue6 = self.dhcp6(ctx, &specs6, &links, hostname.as_ref()).await?;
        vip(ctx, &vips).await?;
        let requeue = match (requeue4, requeue6) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(match requeue {
            // Just past the expiry of a held lease, to drop its specs.
            Some(d) => Action::RequeueAfter(d + Duration::from_secs(1)),
            None => Action::AwaitChange,
        })
    }
}

impl OperatorSpecController {
    /// Runs the DHCPv4 operators of `specs` and publishes their leases; returns when to look
    /// again for a held lease's expiry.
    async fn dhcp4(
        &mut self,
        ctx: &mut Context,
        specs: &BTreeMap<String, OperatorSpecSpec>,
        links: &[cosi::Resource<LinkStatusSpec>],
        hostname: Option<&HostnameStatusSpec>,
    ) -> Result<Option<Duration>, ReconcileError> {
        // Operators whose spec is gone: release and forget.
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !specs.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(r) = self.running.remove(&id) {
                tracing::info!(operator = %id, "operator removed, releasing its lease");
                r.operator.stop(true).await;
            }
        }

        let now = SystemTime::now();
        let mut requeue: Option<Duration> = None;
        for (id, spec) in specs {
            let link = links.iter().find(|l| l.id() == spec.link_name);
            let stored = ctx
                .get::<Dhcp4LeaseSpec>(NAMESPACE, id)
                .await?
                .map(|l| l.spec)
                .filter(|l| !l.expired(now) && l.link_name == spec.link_name);
            let should_run = link.is_some_and(|l| !spec.require_up || l.spec.dhcp_ready());
            let identity = link.map(|l| identity(spec, &l.spec, hostname, stored.as_ref()));

            let restart = self.running.get(id).is_some_and(|r| {
                !should_run
                    || !r.spec.same_operator(spec)
                    || Some(r.operator.identity()) != identity.as_ref()
            });
            if restart {
                if let Some(r) = self.running.remove(id) {
                    let lease = r.operator.state().lease;
                    tracing::info!(operator = %id, link_up = should_run, "operator stopped");
                    r.operator.stop(false).await;
                    // Keep what it had: the restarted operator (or the hold-down) starts from it.
                    if let Some(l) = lease {
                        ctx.apply(Resource::new(NAMESPACE, id.clone(), l)).await?;
                    }
                }
            }
            let stored = ctx
                .get::<Dhcp4LeaseSpec>(NAMESPACE, id)
                .await?
                .map(|l| l.spec)
                .filter(|l| !l.expired(now) && l.link_name == spec.link_name);
            let request_hostname = identity
                .as_ref()
                .map_or(!spec.dhcp4.skip_hostname_request, |i| i.request_hostname);
            if let (true, false, Some(identity)) =
                (should_run, self.running.contains_key(id), identity)
            {
                tracing::info!(operator = %id, link = %spec.link_name,
                    restored = ?stored.as_ref().map(|l| l.address), "operator started");
                let waker = ctx.waker();
                let operator =
                    dhcp::Operator::spawn(&spec.link_name, identity, stored.clone(), move || {
                        waker.wake();
                    });
                self.running.insert(
                    id.clone(),
                    Running {
                        operator,
                        spec: spec.clone(),
                    },
                );
            }
            let lease = match self.running.get(id) {
                Some(r) => r.operator.state().lease,
                None => {
                    if let Some(l) = &stored {
                        let left = l.until_expiry(now);
                        requeue = Some(requeue.map_or(left, |r| r.min(left)));
                    }
                    stored
                }
            };
            if let Some(lease) = lease {
                ctx.apply(Resource::new(NAMESPACE, id.clone(), lease.clone()))
                    .await?;
                publish(ctx, id, lease_specs(spec, &lease, request_hostname)).await?;
            }
        }
        Ok(requeue)
    }

    /// Runs the DHCPv6 operators of `specs` and publishes their leases, as [`Self::dhcp4`].
    async fn dhcp6(
        &mut self,
        ctx: &mut Context,
        specs: &BTreeMap<String, OperatorSpecSpec>,
        links: &[cosi::Resource<LinkStatusSpec>],
        hostname: Option<&HostnameStatusSpec>,
    ) -> Result<Option<Duration>, ReconcileError> {
        // Operators whose spec is gone: release and forget.
        let gone: Vec<String> = self
            .running6
            .keys()
            .filter(|id| !specs.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(r) = self.running6.remove(&id) {
                tracing::info!(operator = %id, "operator removed, releasing its lease");
                r.operator.stop(true).await;
            }
        }

        let now = SystemTime::now();
        let mut requeue: Option<Duration> = None;
        for (id, spec) in specs {
            let link = links.iter().find(|l| l.id() == spec.link_name);
            let should_run = link.is_some_and(|l| !spec.require_up || l.spec.dhcp_ready());
            let stored = ctx
                .get::<Dhcp6LeaseSpec>(NAMESPACE, id)
                .await?
                .map(|l| l.spec)
                .filter(|l| !l.expired(now) && l.link_name == spec.link_name);
            let identity = link.map(|l| identity6(spec, &l.spec, hostname, stored.as_ref()));

            let restart = self.running6.get(id).is_some_and(|r| {
                !should_run
                    || !r.spec.same_operator(spec)
                    || Some(r.operator.identity()) != identity.as_ref()
            });
            if restart {
                if let Some(r) = self.running6.remove(id) {
                    let lease = r.operator.state().lease;
                    tracing::info!(operator = %id, link_up = should_run, "operator stopped");
                    r.operator.stop(false).await;
                    // Keep what it had: the restarted operator (or the hold-down) starts from it.
                    if let Some(l) = lease {
                        ctx.apply(Resource::new(NAMESPACE, id.clone(), l)).await?;
                    }
                }
            }
            let stored = ctx
                .get::<Dhcp6LeaseSpec>(NAMESPACE, id)
                .await?
                .map(|l| l.spec)
                .filter(|l| !l.expired(now) && l.link_name == spec.link_name);
            let request_hostname = identity
                .as_ref()
                .map_or(!spec.dhcp6.skip_hostname_request, |i| i.request_hostname);
            if let (true, false, Some(identity)) =
                (should_run, self.running6.contains_key(id), identity)
            {
                // A lease granted to another DUID or IAID cannot be renewed: start over.
                let stored = stored
                    .clone()
                    .filter(|l| l.belongs_to(&spec.link_name, &identity));
                tracing::info!(operator = %id, link = %spec.link_name,
                    restored = ?stored.as_ref().map(|l| l.address), "operator started");
                let waker = ctx.waker();
                let operator =
                    dhcp6::Operator::spawn(&spec.link_name, identity, stored, move || {
                        waker.wake();
                    });
                self.running6.insert(
                    id.clone(),
                    Running6 {
                        operator,
                        spec: spec.clone(),
                    },
                );
            }
            let lease = match self.running6.get(id) {
                Some(r) => r.operator.state().lease,
                None => {
                    if let Some(l) = &stored {
                        let left = l.until_expiry(now);
                        requeue = Some(requeue.map_or(left, |r| r.min(left)));
                    }
                    stored
                }
            };
            if let Some(lease) = lease {
                ctx.apply(Resource::new(NAMESPACE, id.clone(), lease.clone()))
                    .await?;
                publish(ctx, id, lease6_specs(spec, &lease, request_hostname)).await?;
            }
        }
        Ok(requeue)
    }
}

/// Publishes the address of every shared IP this node holds (k8sd's election says `leader`).
async fn vip(
    ctx: &mut Context,
    specs: &BTreeMap<String, OperatorSpecSpec>,
) -> Result<(), ReconcileError> {
    for spec in specs.values() {
        let Some(ip) = spec.vip.ip else { continue };
        let held = ctx
            .get::<VipElectionSpec>(VIP_NAMESPACE, &ip.to_string())
            .await?
            .is_some_and(|e| e.spec.leader);
        if !held {
            continue;
        }
        let a = vip_address(spec, ip);
        let prefix = format!("{}/{}", Operator::Vip, spec.link_name);
        ctx.apply(Resource::new(
            CONFIG_NAMESPACE,
            operator_prefixed_id(&prefix, &a.id()),
            a,
        ))
        .await?;
    }
    Ok(())
}

/// The address of a held shared IP (upstream's `VIP.AddressSpecs`).
fn vip_address(spec: &OperatorSpecSpec, ip: IpAddr) -> AddressSpecSpec {
    let (family, arp) = match ip {
        IpAddr::V4(_) => (Family::Inet4, spec.vip.gratuitous_arp),
        IpAddr::V6(_) => (Family::Inet6, false),
    };
    AddressSpecSpec {
        address: IpNet::from(ip),
        link_name: spec.link_name.clone(),
        family,
        scope: Scope::Global,
        flags: AddressFlags::PERMANENT,
        announce_with_arp: arp,
        priority: 0,
        layer: ConfigLayer::Operator,
    }
}

/// What the operator says about itself: MAC, client identifier, hostname sent or requested.
fn identity(
    spec: &OperatorSpecSpec,
    link: &LinkStatusSpec,
    hostname: Option<&HostnameStatusSpec>,
    lease: Option<&Lease>,
) -> Identity {
    let mac = link
        .hardware_addr
        .0
        .iter()
        .copied()
        .take(16)
        .collect::<Vec<u8>>();
    let client_id = match spec.dhcp4.client_identifier {
        ClientIdentifier::None => None,
        ClientIdentifier::Mac => Some([&[1u8][..], &mac].concat()),
        ClientIdentifier::Duid => match hex(&spec.dhcp4.duid_raw_hex) {
            Some(d) if !d.is_empty() => Some(d),
            _ => {
                tracing::warn!(link = %spec.link_name, "invalid DUID, no client identifier sent");
                None
            }
        },
    };
    // Never parrot: a hostname the node has from elsewhere is sent, not requested.
    let ours = |h: &HostnameStatusSpec| {
        lease.and_then(|l| l.hostname.as_deref()) == Some(h.hostname.as_str())
    };
    let foreign = hostname.filter(|h| !h.hostname.is_empty() && !ours(h));
    Identity {
        mac,
        client_id,
        request_hostname: !spec.dhcp4.skip_hostname_request && foreign.is_none(),
        send_hostname: foreign.map(|h| h.hostname.clone()),
        request_mtu: true,
    }
}

fn hex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| *c != ':' && *c != '-').collect();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
}

/// The operator-layer specs of a lease (IDs under the operator prefix).
pub(crate) struct LeaseSpecs {
    pub(crate) addresses: Vec<AddressSpecSpec>,
    pub(crate) routes: Vec<RouteSpecSpec>,
    pub(crate) link: Option<LinkSpecSpec>,
    pub(crate) hostname: Option<HostnameSpecSpec>,
    pub(crate) resolver: Option<ResolverSpecSpec>,
    pub(crate) time_servers: Option<TimeServerSpecSpec>,
}

/// Turns a lease into specs (networking.md §3.8).
pub(crate) fn lease_specs(
    spec: &OperatorSpecSpec,
    lease: &Lease,
    request_hostname: bool,
) -> LeaseSpecs {
    let link = &spec.link_name;
    let metric = if spec.dhcp4.route_metric == 0 {
        DEFAULT_ROUTE_METRIC
    } else {
        spec.dhcp4.route_metric
    };
    let address = IpAddr::V4(lease.address);
    let prefix = IpNet::new(address, lease.prefix_len).unwrap_or_else(|_| IpNet::from(address));
    let subnet = Ipv4Net::new(lease.address, lease.prefix_len)
        .map(|n| n.trunc())
        .unwrap_or_else(|_| Ipv4Net::from(lease.address));
    let addresses = vec![AddressSpecSpec {
        address: prefix,
        link_name: link.clone(),
        family: Family::Inet4,
        scope: Scope::Global,
        flags: AddressFlags::PERMANENT,
        announce_with_arp: false,
        priority: metric,
        layer: ConfigLayer::Operator,
    }];

    let route = |destination: Option<IpNet>, gateway: Option<Ipv4Addr>| {
        let mut r = RouteSpecSpec {
            family: Family::Inet4,
            destination,
            source: Some(address),
            gateway: gateway.map(IpAddr::V4),
            out_link_name: link.clone(),
            table: RoutingTable::MAIN,
            priority: metric,
            r#type: RouteType::Unicast,
            protocol: RouteProtocol::BOOT,
            layer: ConfigLayer::Operator,
            ..RouteSpecSpec::default()
        };
        r.normalize();
        r
    };
    let mut routes: Vec<RouteSpecSpec> = Vec::new();
    let push = |r: RouteSpecSpec, routes: &mut Vec<RouteSpecSpec>| {
        if !routes.iter().any(|x| x.id() == r.id()) {
            routes.push(r);
        }
    };
    if !spec.dhcp4.skip_routes {
        // Option 121 overrides option 3 (RFC 3442).
        let via: Vec<(Option<IpNet>, Option<Ipv4Addr>)> = if lease.classless_routes.is_empty() {
            lease.routers.iter().map(|gw| (None, Some(*gw))).collect()
        } else {
            lease
                .classless_routes
                .iter()
                .map(|c| {
                    let dst = (c.prefix_len != 0)
                        .then(|| IpNet::new(IpAddr::V4(c.destination), c.prefix_len).ok())
                        .flatten();
                    let gw = (!c.gateway.is_unspecified()).then_some(c.gateway);
                    (dst, gw)
                })
                .collect()
        };
        for (dst, gw) in via {
            if let Some(g) = gw {
                if !subnet.contains(&g) {
                    // The gateway is off-subnet: reach it on the link first (upstream #4320).
                    push(route(Some(IpNet::from(IpAddr::V4(g))), None), &mut routes);
                }
            }
            push(route(dst, gw), &mut routes);
        }
    }

    let link_spec = lease.mtu.map(|mtu| LinkSpecSpec {
        name: link.clone(),
        up: true,
        mtu: u32::from(mtu),
        // As upstream: the default layer, so any explicit MTU wins.
        layer: ConfigLayer::Default,
        ..LinkSpecSpec::default()
    });

    let hostname = if request_hostname {
        lease.hostname.as_deref().and_then(|h| {
            let mut s = HostnameSpecSpec::parse_fqdn(h, ConfigLayer::Operator).ok()?;
            if let Some(d) = &lease.domain {
                s.domainname.clone_from(d);
                s.validate().ok()?;
            }
            Some(s)
        })
    } else {
        None
    };

    let resolver = (!lease.dns.is_empty()).then(|| {
        let mut search = lease.search.clone();
        if let Some(d) = &lease.domain {
            if !search.contains(d) {
                search.push(d.clone());
            }
        }
        ResolverSpecSpec {
            dns_servers: lease.dns.iter().map(|a| IpAddr::V4(*a)).collect(),
            layer: ConfigLayer::Operator,
            search_domains: search,
            search_domains_overridden: false,
        }
    });
    let time_servers = (!lease.ntp.is_empty()).then(|| TimeServerSpecSpec {
        ntp_servers: lease.ntp.iter().map(ToString::to_string).collect(),
        use_nts: false,
        layer: ConfigLayer::Operator,
    });
    LeaseSpecs {
        addresses,
        routes,
        link: link_spec,
        hostname,
        resolver,
        time_servers,
    }
}

async fn publish(ctx: &mut Context, prefix: &str, out: LeaseSpecs) -> Result<(), ReconcileError> {
    let id = |natural: &str| operator_prefixed_id(prefix, natural);
    for a in out.addresses {
        ctx.apply(Resource::new(CONFIG_NAMESPACE, id(&a.id()), a))
            .await?;
    }
    for r in out.routes {
        ctx.apply(Resource::new(CONFIG_NAMESPACE, id(&r.id()), r))
            .await?;
    }
    if let Some(l) = out.link {
        ctx.apply(Resource::new(CONFIG_NAMESPACE, id(&l.name.clone()), l))
            .await?;
    }
    if let Some(h) = out.hostname {
        ctx.apply(Resource::new(CONFIG_NAMESPACE, id(HOSTNAME_ID), h))
            .await?;
    }
    if let Some(r) = out.resolver {
        ctx.apply(Resource::new(CONFIG_NAMESPACE, id(RESOLVER_ID), r))
            .await?;
    }
    if let Some(t) = out.time_servers {
        ctx.apply(Resource::new(CONFIG_NAMESPACE, id(TIME_SERVER_ID), t))
            .await?;
    }
    Ok(())
}

/// What a DHCPv6 operator says about itself: its DUID (the configured one if valid, else
/// DUID-LL of the MAC), the IAID of the link, and whether it asks for a hostname (never while
/// the node has a hostname from elsewhere, as DHCPv4).
fn identity6(
    spec: &OperatorSpecSpec,
    link: &LinkStatusSpec,
    hostname: Option<&HostnameStatusSpec>,
    lease: Option<&dhcp6::Lease>,
) -> dhcp6::Identity {
    let mac: Vec<u8> = link.hardware_addr.0.iter().copied().take(16).collect();
    let fallback = || {
        dhcp6::packet::duid_ll(&mac).unwrap_or_else(|| {
            // No hardware address (a point-to-point link): DUID-EN of the link name, with the
            // documentation enterprise number (RFC 5612).
            [&[0u8, 2, 0, 0, 0x7e, 0xd9][..], spec.link_name.as_bytes()].concat()
        })
    };
    let duid = match spec.dhcp6.client_identifier {
        ClientIdentifier::Duid => match dhcp6::lease::unhex(&spec.dhcp6.duid_raw_hex) {
            Some(d) if dhcp6::packet::valid_duid(&d) => d,
            _ => {
                tracing::warn!(link = %spec.link_name, duid = %spec.dhcp6.duid_raw_hex,
                    "invalid DHCPv6 DUID, using DUID-LL of the link's MAC instead");
                fallback()
            }
        },
        ClientIdentifier::None | ClientIdentifier::Mac => fallback(),
    };
    let ours = |h: &HostnameStatusSpec| {
        lease
            .and_then(|l| l.fqdn.as_deref())
            .is_some_and(|f| f.split('.').next() == Some(h.hostname.as_str()))
    };
    let foreign = hostname.filter(|h| !h.hostname.is_empty() && !ours(h));
    dhcp6::Identity {
        duid,
        iaid: dhcp6::packet::iaid(&spec.link_name, &mac),
        request_hostname: !spec.dhcp6.skip_hostname_request && foreign.is_none(),
    }
}

/// Turns a DHCPv6 lease into specs (upstream `DHCP6.parseReply`, plus the search domains of
/// option 24).
pub(crate) fn lease6_specs(
    spec: &OperatorSpecSpec,
    lease: &dhcp6::Lease,
    request_hostname: bool,
) -> LeaseSpecs {
    let link = &spec.link_name;
    let addresses = vec![AddressSpecSpec {
        address: IpNet::from(IpAddr::V6(lease.address)),
        link_name: link.clone(),
        family: Family::Inet6,
        scope: Scope::Global,
        flags: AddressFlags::PERMANENT,
        announce_with_arp: false,
        priority: 0,
        layer: ConfigLayer::Operator,
    }];
    let hostname = if request_hostname {
        lease
            .fqdn
            .as_deref()
            .and_then(|f| HostnameSpecSpec::parse_fqdn(f, ConfigLayer::Operator).ok())
    } else {
        None
    };
    let resolver = (!lease.dns.is_empty() || !lease.search.is_empty()).then(|| ResolverSpecSpec {
        dns_servers: lease.dns.iter().map(|a| IpAddr::V6(*a)).collect(),
        layer: ConfigLayer::Operator,
        search_domains: lease.search.clone(),
        search_domains_overridden: false,
    });
    let time_servers = (!lease.ntp.is_empty()).then(|| TimeServerSpecSpec {
        ntp_servers: lease.ntp.iter().map(Ipv6Addr::to_string).collect(),
        use_nts: false,
        layer: ConfigLayer::Operator,
    });
    LeaseSpecs {
        addresses,
        routes: Vec::new(),
        link: None,
        hostname,
        resolver,
        time_servers,
    }
}

#[cfg(test)]
fn tests_lease() -> Lease {
    tests::lease()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp::lease::ClasslessRoute;

    pub(super) fn lease() -> Lease {
        Lease {
            link_name: "eth0".into(),
            address: Ipv4Addr::new(10, 0, 0, 5),
            prefix_len: 24,
            server: Ipv4Addr::new(10, 0, 0, 1),
            routers: vec![Ipv4Addr::new(10, 0, 0, 1)],
            classless_routes: vec![],
            dns: vec![Ipv4Addr::new(10, 0, 0, 53)],
            search: vec!["corp.example".into()],
            hostname: Some("node-1".into()),
            domain: Some("example.org".into()),
            ntp: vec![Ipv4Addr::new(10, 0, 0, 123)],
            mtu: Some(1400),
            lease_time: 120,
            renewal: 60,
            rebinding: 105,
            acquired: 0,
        }
    }

    fn op() -> OperatorSpecSpec {
        OperatorSpecSpec {
            operator: Operator::Dhcp4,
            link_name: "eth0".into(),
            require_up: true,
            layer: ConfigLayer::Default,
            ..OperatorSpecSpec::default()
        }
    }

    pub(super) fn lease6() -> dhcp6::Lease {
        dhcp6::Lease {
            link_name: "eth0".into(),
            address: "fd00:213::150".parse().expect("ip"),
            iaid: 1,
            client_id: "00030001020000000001".into(),
            server_id: "0001000101020304020000000002".into(),
            dns: vec!["fd00:213::53".parse().expect("ip")],
            search: vec!["corp6.example".into()],
            ntp: vec!["fd00:213::123".parse().expect("ip")],
            fqdn: Some("node-6.example.org".into()),
            preferred_lifetime: 120,
            valid_lifetime: 120,
            renewal: 60,
            rebinding: 105,
            acquired: 0,
        }
    }

    #[test]
    fn specs_of_a_dhcpv6_lease() {
        let mut spec = op();
        spec.operator = Operator::Dhcp6;
        let out = lease6_specs(&spec, &lease6(), true);
        assert_eq!(out.addresses.len(), 1);
        let a = &out.addresses[0];
        assert_eq!(a.id(), "eth0/fd00:213::150/128");
        assert_eq!(
            (a.family, a.scope, a.layer),
            (Family::Inet6, Scope::Global, ConfigLayer::Operator)
        );
        assert_eq!(a.flags, AddressFlags::PERMANENT);
        assert!(
            out.routes.is_empty() && out.link.is_none(),
            "no routes, no MTU"
        );
        let r = out.resolver.expect("resolver");
        assert_eq!(
            r.dns_servers,
            [IpAddr::V6("fd00:213::53".parse().expect("ip"))]
        );
        assert_eq!(r.search_domains, ["corp6.example"]);
        assert_eq!(
            out.time_servers.expect("ntp").ntp_servers,
            ["fd00:213::123"]
        );
        let h = out.hostname.expect("hostname");
        assert_eq!(
            (h.hostname.as_str(), h.domainname.as_str()),
            ("node-6", "example.org")
        );
        assert!(lease6_specs(&spec, &lease6(), false).hostname.is_none());
    }

    #[test]
    fn dhcpv6_identity_uses_the_configured_duid_or_the_macs() {
        let link = LinkStatusSpec {
            hardware_addr: machinery::resources::network::HardwareAddr(vec![2, 0, 0, 0, 0, 1]),
            ..LinkStatusSpec::default()
        };
        let mut spec = op();
        spec.operator = Operator::Dhcp6;
        let i = identity6(&spec, &link, None, None);
        assert_eq!(i.duid, [0, 3, 0, 1, 2, 0, 0, 0, 0, 1]);
        assert_eq!(i.iaid, 0x0000_0001);
        assert!(i.request_hostname);
        spec.dhcp6.client_identifier = ClientIdentifier::Duid;
        spec.dhcp6.duid_raw_hex = "00:01:00:01:12:34:56:78:02:00:00:00:00:09".into();
        let i = identity6(&spec, &link, None, None);
        assert_eq!(
            i.duid,
            [0, 1, 0, 1, 0x12, 0x34, 0x56, 0x78, 2, 0, 0, 0, 0, 9]
        );
        spec.dhcp6.duid_raw_hex = "zz".into();
        let i = identity6(&spec, &link, None, None);
        assert_eq!(
            i.duid,
            [0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
            "an invalid DUID falls back"
        );
        // A hostname from elsewhere is not asked for; one from our own lease is.
        let configured = HostnameStatusSpec {
            hostname: "cp-1".into(),
            domainname: String::new(),
        };
        assert!(!identity6(&spec, &link, Some(&configured), Some(&lease6())).request_hostname);
        let ours = HostnameStatusSpec {
            hostname: "node-6".into(),
            domainname: "example.org".into(),
        };
        assert!(identity6(&spec, &link, Some(&ours), Some(&lease6())).request_hostname);
    }

    #[test]
    fn specs_of_a_lease() {
        let out = lease_specs(&op(), &lease(), true);
        assert_eq!(out.addresses[0].id(), "eth0/10.0.0.5/24");
        assert_eq!(out.addresses[0].priority, 1024);
        let ids: Vec<String> = out.routes.iter().map(RouteSpecSpec::id).collect();
        assert_eq!(ids, ["inet4/10.0.0.1//1024"]);
        assert_eq!(out.link.as_ref().map(|l| l.mtu), Some(1400));
        let h = out.hostname.expect("hostname");
        assert_eq!(
            (h.hostname.as_str(), h.domainname.as_str()),
            ("node-1", "example.org")
        );
        let r = out.resolver.expect("resolver");
        assert_eq!(r.search_domains, ["corp.example", "example.org"]);
        assert_eq!(out.time_servers.expect("ntp").ntp_servers, ["10.0.0.123"]);
        assert!(lease_specs(&op(), &lease(), false).hostname.is_none());
    }

    #[test]
    fn classless_routes_override_routers_and_reach_off_subnet_gateways() {
        let mut l = lease();
        l.classless_routes = vec![
            ClasslessRoute {
                destination: Ipv4Addr::new(0, 0, 0, 0),
                prefix_len: 0,
                gateway: Ipv4Addr::new(169, 254, 0, 1),
            },
            ClasslessRoute {
                destination: Ipv4Addr::new(192, 168, 0, 0),
                prefix_len: 16,
                gateway: Ipv4Addr::new(10, 0, 0, 254),
            },
        ];
        let out = lease_specs(&op(), &l, true);
        let ids: Vec<String> = out.routes.iter().map(RouteSpecSpec::id).collect();
        assert_eq!(
            ids,
            [
                "inet4//169.254.0.1/32/1024",
                "inet4/169.254.0.1//1024",
                "inet4/10.0.0.254/192.168.0.0/16/1024",
            ]
        );
        assert_eq!(out.routes[0].scope, Scope::Link);
        let mut skip = op();
        skip.dhcp4.skip_routes = true;
        assert!(lease_specs(&skip, &l, true).routes.is_empty());
    }

    #[test]
    fn identity_sends_a_foreign_hostname_and_requests_otherwise() {
        let link = LinkStatusSpec {
            hardware_addr: machinery::resources::network::HardwareAddr(vec![2, 0, 0, 0, 0, 1]),
            ..LinkStatusSpec::default()
        };
        let mut spec = op();
        spec.dhcp4.client_identifier = ClientIdentifier::Mac;
        let i = identity(&spec, &link, None, None);
        assert!(i.request_hostname);
        assert_eq!(i.client_id, Some(vec![1, 2, 0, 0, 0, 0, 1]));
        let configured = HostnameStatusSpec {
            hostname: "cp-1".into(),
            domainname: String::new(),
        };
        let i = identity(&spec, &link, Some(&configured), Some(&lease()));
        assert_eq!(i.send_hostname.as_deref(), Some("cp-1"));
        assert!(!i.request_hostname);
        let from_lease = HostnameStatusSpec {
            hostname: "node-1".into(),
            domainname: "example.org".into(),
        };
        let i = identity(&spec, &link, Some(&from_lease), Some(&lease()));
        assert!(i.request_hostname && i.send_hostname.is_none());
        assert_eq!(hex("00:01:ab"), Some(vec![0, 1, 0xab]));
        assert_eq!(hex("0"), None);
    }
}

#[cfg(test)]
mod runtime_tests {
    //! The controller on the real runtime and a real stated, without a kernel: the link is down,
    //! so no operator runs, and what is published comes from the stored lease alone.

    use std::time::{Duration, SystemTime};

    use cosi::runtime::Runtime;
    use cosi::{Query, Resource, ResourceSpec};
    use machinery::resources::network::{
        AddressSpecSpec, LinkStatusSpec, OperationalState, RouteSpecSpec, CONFIG_NAMESPACE,
        NAMESPACE,
    };

    use super::*;
    use crate::dhcp::lease::unix;

    async fn create<S: ResourceSpec>(client: &cosi::Client, r: Resource<S>, owner: &str) {
        client
            .create(&r.to_raw().expect("encode"), owner)
            .await
            .expect("create");
    }

    async fn ids<S: ResourceSpec>(client: &cosi::Client, ns: &str) -> Vec<String> {
        client
            .list(ns, S::TYPE, &Query::default())
            .await
            .expect("list")
            .into_iter()
            .map(|r| r.metadata.id)
            .collect()
    }

    async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !f().await {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_held_lease_is_published_until_it_expires() {
        let h = stated::testing::Harness::start().await;
        let client = h.client.clone();
        create(
            &client,
            Resource::new(
                NAMESPACE,
                "eth0",
                LinkStatusSpec {
                    operational_state: OperationalState::Down,
                    ..LinkStatusSpec::default()
                },
            ),
            "network.LinkStatusController",
        )
        .await;
        create(
            &client,
            Resource::new(NAMESPACE, "dhcp4/eth0", op()),
            "test",
        )
        .await;
        // A lease from an earlier run, 3 s before its expiry.
        let mut l = super::tests_lease();
        l.acquired = unix(SystemTime::now()) - u64::from(l.lease_time) + 3;
        create(&client, Resource::new(NAMESPACE, "dhcp4/eth0", l), NAME).await;

        let mut registry = cosi::runtime::Registry::new();
        registry
            .register(OperatorSpecController::default())
            .expect("register");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(Runtime::with_registry(client.clone(), registry).run(stopped));

        eventually("the held lease's address and route", async || {
            ids::<AddressSpecSpec>(&client, CONFIG_NAMESPACE).await
                == ["dhcp4/eth0/eth0/10.0.0.5/24"]
                && ids::<RouteSpecSpec>(&client, CONFIG_NAMESPACE).await
                    == ["dhcp4/eth0/inet4/10.0.0.1//1024"]
        })
        .await;
        eventually("everything gone after expiry", async || {
            ids::<AddressSpecSpec>(&client, CONFIG_NAMESPACE)
                .await
                .is_empty()
                && ids::<RouteSpecSpec>(&client, CONFIG_NAMESPACE)
                    .await
                    .is_empty()
                && ids::<Dhcp4LeaseSpec>(&client, NAMESPACE).await.is_empty()
        })
        .await;
        let _ = stop.send(());
        run.await.expect("no panic").expect("runtime");
    }

    #[tokio::test]
    async fn a_held_dhcpv6_lease_is_published_until_it_expires() {
        let h = stated::testing::Harness::start().await;
        let client = h.client.clone();
        create(
            &client,
            Resource::new(
                NAMESPACE,
                "eth0",
                LinkStatusSpec {
                    operational_state: OperationalState::Down,
                    ..LinkStatusSpec::default()
                },
            ),
            "network.LinkStatusController",
        )
        .await;
        let mut spec = op();
        spec.operator = Operator::Dhcp6;
        create(
            &client,
            Resource::new(NAMESPACE, "dhcp6/eth0", spec),
            "test",
        )
        .await;
        // A lease from an earlier run, 3 s before the end of its valid lifetime.
        let mut l = super::tests::lease6();
        l.acquired = unix(SystemTime::now()) - u64::from(l.valid_lifetime) + 3;
        create(&client, Resource::new(NAMESPACE, "dhcp6/eth0", l), NAME).await;

        let mut registry = cosi::runtime::Registry::new();
        registry
            .register(OperatorSpecController::default())
            .expect("register");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(Runtime::with_registry(client.clone(), registry).run(stopped));

        eventually("the held lease's /128 and resolvers", async || {
            ids::<AddressSpecSpec>(&client, CONFIG_NAMESPACE).await
                == ["dhcp6/eth0/eth0/fd00:213::150/128"]
                && ids::<ResolverSpecSpec>(&client, CONFIG_NAMESPACE).await
                    == ["dhcp6/eth0/resolvers"]
                && ids::<RouteSpecSpec>(&client, CONFIG_NAMESPACE)
                    .await
                    .is_empty()
        })
        .await;
        eventually("everything gone after expiry", async || {
            ids::<AddressSpecSpec>(&client, CONFIG_NAMESPACE)
                .await
                .is_empty()
                && ids::<ResolverSpecSpec>(&client, CONFIG_NAMESPACE)
                    .await
                    .is_empty()
                && ids::<Dhcp6LeaseSpec>(&client, NAMESPACE).await.is_empty()
        })
        .await;
        let _ = stop.send(());
        run.await.expect("no panic").expect("runtime");
    }

    fn op() -> OperatorSpecSpec {
        OperatorSpecSpec {
            operator: Operator::Dhcp4,
            link_name: "eth0".into(),
            require_up: true,
            layer: ConfigLayer::Default,
            ..OperatorSpecSpec::default()
        }
    }
}
