//! Routes: list (both families, every table), add, delete.

use std::net::IpAddr;

use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric, RouteNextHop,
    RouteNextHopFlags, RouteProtocol, RouteScope, RouteType, RouteVia,
};
use netlink_packet_route::AddressFamily;

use super::{collect, request, Error, Netlink, OWN_PROTOCOL};

/// `AF_INET`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;

/// One hop of a multipath route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// Gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Output link index.
    pub oif: u32,
    /// Weight (1-based; the kernel stores weight − 1).
    pub weight: u32,
}

/// A route as the kernel reports it, or as networkd adds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Family (`AF_INET` = 2, `AF_INET6` = 10).
    pub family: u8,
    /// Destination (`None` for the default route).
    pub dst: Option<IpAddr>,
    /// Destination prefix length.
    pub dst_len: u8,
    /// Preferred source (`RTA_PREFSRC`).
    pub src: Option<IpAddr>,
    /// Gateway (`RTA_GATEWAY`, or `RTA_VIA` for an IPv6 gateway of an IPv4 route).
    pub gateway: Option<IpAddr>,
    /// Output link index, 0 if none.
    pub oif: u32,
    /// Routing table (`RTA_TABLE`, or the header's table).
    pub table: u32,
    /// Metric (`RTA_PRIORITY`).
    pub priority: u32,
    /// Scope (`RT_SCOPE_*`).
    pub scope: u8,
    /// Protocol (`RTPROT_*`).
    pub protocol: u8,
    /// Route type (`RTN_*`).
    pub kind: u8,
    /// `RTM_F_*` / `RTNH_F_*` flags.
    pub flags: u32,
    /// `RTAX_MTU`, 0 if none.
    pub mtu: u32,
    /// Multipath hops.
    pub multipath: Vec<NextHop>,
}

impl Route {
    /// Whether networkd added this route ([`OWN_PROTOCOL`]).
    pub fn is_owned(&self) -> bool {
        self.protocol == OWN_PROTOCOL
    }

    pub(crate) fn from_message(msg: RouteMessage) -> Self {
        let h = &msg.header;
        let mut r = Route {
            family: u8::from(h.address_family),
            dst: None,
            dst_len: h.destination_prefix_length,
            src: None,
            gateway: None,
            oif: 0,
            table: u32::from(h.table),
            priority: 0,
            scope: u8::from(h.scope),
            protocol: u8::from(h.protocol),
            kind: u8::from(h.kind),
            flags: h.flags.bits(),
            mtu: 0,
            multipath: Vec::new(),
        };
        for attr in msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => r.dst = ip(&a),
                RouteAttribute::PrefSource(a) => r.src = ip(&a),
                RouteAttribute::Gateway(a) => r.gateway = ip(&a),
                RouteAttribute::Via(v) => r.gateway = via(&v),
                RouteAttribute::Oif(i) => r.oif = i,
                RouteAttribute::Table(t) => r.table = t,
                RouteAttribute::Priority(p) => r.priority = p,
                RouteAttribute::Metrics(ms) => {
                    for m in ms {
                        if let RouteMetric::Mtu(mtu) = m {
                            r.mtu = mtu;
                        }
                    }
                }
                RouteAttribute::MultiPath(hops) => {
                    r.multipath = hops
                        .into_iter()
                        .map(|h| NextHop {
                            gateway: h.attributes.iter().find_map(|a| match a {
                                RouteAttribute::Gateway(g) => ip(g),
                                RouteAttribute::Via(v) => via(v),
                                _ => None,
                            }),
                            oif: h.interface_index,
                            weight: u32::from(h.hops) + 1,
                        })
                        .collect();
                }
                _ => {}
            }
        }
        r
    }

    fn to_message(&self, protocol: u8) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header = RouteHeader {
            address_family: AddressFamily::from(self.family),
            destination_prefix_length: self.dst_len,
            table: u8::try_from(self.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC),
            protocol: RouteProtocol::from(protocol),
            scope: RouteScope::from(self.scope),
            kind: RouteType::from(self.kind),
            flags: RouteFlags::from_bits_retain(self.flags),
            ..RouteHeader::default()
        };
        let a = &mut msg.attributes;
        if let Some(dst) = self.dst {
            a.push(RouteAttribute::Destination(RouteAddress::from(dst)));
        }
        if let Some(src) = self.src {
            a.push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        if let Some(gw) = self.gateway {
            a.push(gateway_attribute(self.family, gw));
        }
        if self.oif != 0 {
            a.push(RouteAttribute::Oif(self.oif));
        }
        a.push(RouteAttribute::Table(self.table));
        a.push(RouteAttribute::Priority(self.priority));
        if self.mtu != 0 {
            a.push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(self.mtu)]));
        }
        if !self.multipath.is_empty() {
            a.push(RouteAttribute::MultiPath(
                self.multipath
                    .iter()
                    .map(|h| {
                        let mut hop = RouteNextHop::default();
                        hop.flags = RouteNextHopFlags::empty();
                        hop.hops = u8::try_from(h.weight.saturating_sub(1)).unwrap_or(u8::MAX);
                        hop.interface_index = h.oif;
                        if let Some(gw) = h.gateway {
                            hop.attributes.push(gateway_attribute(self.family, gw));
                        }
                        hop
                    })
                    .collect(),
            ));
        }
        msg
    }
}

/// `RTA_GATEWAY` when the families agree, `RTA_VIA` otherwise (RFC 8950).
fn gateway_attribute(family: u8, gw: IpAddr) -> RouteAttribute {
    match (family, gw) {
        (AF_INET, IpAddr::V6(v6)) => RouteAttribute::Via(RouteVia::Inet6(v6)),
        _ => RouteAttribute::Gateway(RouteAddress::from(gw)),
    }
}

fn ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn via(v: &RouteVia) -> Option<IpAddr> {
    match v {
        RouteVia::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteVia::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

impl Netlink {
    /// Every IPv4 and IPv6 route of every table.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if a dump fails.
    pub async fn routes(&self) -> Result<Vec<Route>, Error> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family;
            msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
            let msgs = collect("list routes", self.handle().route().get(msg).execute()).await?;
            out.extend(msgs.into_iter().map(Route::from_message));
        }
        Ok(out)
    }

    /// Adds `route` marked with [`OWN_PROTOCOL`] (its `protocol` field is ignored).
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses (EEXIST, ENETUNREACH ...).
    pub async fn add_route(&self, route: &Route) -> Result<(), Error> {
        let msg = route.to_message(OWN_PROTOCOL);
        request(self.handle().route().add(msg).execute().await, || {
            format!("add route {route:?}")
        })
    }

    /// Deletes `route` as listed (matched by family, destination, table, metric, gateway, link
    /// and protocol).
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses (ESRCH if absent).
    pub async fn delete_route(&self, route: &Route) -> Result<(), Error> {
        let mut r = route.clone();
        r.src = None;
        r.mtu = 0;
        // As `ip route del`: any scope.
        r.scope = u8::from(RouteScope::NoWhere);
        let msg = r.to_message(route.protocol);
        request(self.handle().route().del(msg).execute().await, || {
            format!("delete route {route:?}")
        })
    }
}
