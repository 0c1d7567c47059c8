//! RouteSpec: the desired state of one route.

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::id::route_id;
use super::nethelpers::{Family, RouteFlags, RouteProtocol, RouteType, RoutingTable, Scope};
use super::text;
use super::NAMESPACE;

/// Desired state of one route: a candidate of one layer in `network-config`, or the merged
/// winner in `network` that the RouteSpec controller applies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpecSpec {
    /// Family.
    pub family: Family,
    /// Destination; `None` is the default route (`0.0.0.0/0`, `::/0`).
    #[serde(with = "text::opt", rename = "dst", default)]
    pub destination: Option<IpNet>,
    /// Preferred source address.
    #[serde(with = "text::opt", rename = "src", default)]
    pub source: Option<IpAddr>,
    /// Gateway; `None` for a link-scope route.
    #[serde(with = "text::opt", default)]
    pub gateway: Option<IpAddr>,
    /// Out link (name or alias).
    pub out_link_name: String,
    /// Table.
    pub table: RoutingTable,
    /// Metric.
    pub priority: u32,
    /// Scope.
    pub scope: Scope,
    /// Route type.
    #[serde(rename = "type")]
    pub r#type: RouteType,
    /// Flags.
    pub flags: RouteFlags,
    /// Protocol (who installed it).
    pub protocol: RouteProtocol,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
    /// Route MTU (`RTAX_MTU`); 0 is unset.
    pub mtu: u32,
}

impl RouteSpecSpec {
    /// The natural ID ([`route_id`]).
    pub fn id(&self) -> String {
        route_id(
            self.table,
            self.family,
            self.destination.as_ref(),
            self.gateway.as_ref(),
            self.priority,
            &self.out_link_name,
        )
    }

    /// Canonicalizes as upstream `Normalize`: a `0.0.0.0/0` or `::/0` destination becomes the
    /// default route (`None`), unspecified gateway and source addresses become `None`, the
    /// family is taken from the addresses if unset, and the scope follows: link without a
    /// gateway for a destination, else host for a loopback destination, global otherwise.
    pub fn normalize(&mut self) {
        if self.destination.is_some_and(|d| d.prefix_len() == 0) {
            self.destination = None;
        }
        if self.gateway.is_some_and(|g| g.is_unspecified()) {
            self.gateway = None;
        }
        if self.source.is_some_and(|s| s.is_unspecified()) {
            self.source = None;
        }
        if self.family == Family::Unspec {
            self.family = self
                .destination
                .map(|d| Family::of(&d.addr()))
                .or_else(|| self.gateway.as_ref().map(Family::of))
                .or_else(|| self.source.as_ref().map(Family::of))
                .unwrap_or(Family::Unspec);
        }
        self.scope = match (&self.destination, &self.gateway) {
            (Some(_), None) => Scope::Link,
            (Some(d), _) if d.addr().is_loopback() => Scope::Host,
            _ => Scope::Global,
        };
    }
}

impl ResourceSpec for RouteSpecSpec {
    const TYPE: &'static str = "RouteSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

impl cosi::generic::Layered for RouteSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        self.id()
    }
}

/// A `RouteSpec` resource.
pub type RouteSpec = Resource<RouteSpecSpec>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_as_upstream() {
        let mut r = RouteSpecSpec {
            destination: Some("0.0.0.0/0".parse().expect("net")),
            gateway: Some("10.0.0.1".parse().expect("ip")),
            source: Some("0.0.0.0".parse().expect("ip")),
            priority: 1024,
            ..Default::default()
        };
        r.normalize();
        assert_eq!(r.destination, None);
        assert_eq!(r.source, None);
        assert_eq!(r.family, Family::Inet4);
        assert_eq!(r.scope, Scope::Global);
        assert_eq!(r.id(), "inet4/10.0.0.1//1024");

        let mut r = RouteSpecSpec {
            destination: Some("10.0.0.1/32".parse().expect("net")),
            ..Default::default()
        };
        r.normalize();
        assert_eq!(r.scope, Scope::Link);
    }
}
