//! RouteStatus: one route as the kernel reports it.

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::nethelpers::{Family, RouteFlags, RouteProtocol, RouteType, RoutingTable, Scope};
use super::text;
use super::NAMESPACE;

/// One route as observed (ID [`route_id`](super::route_id) of the kernel's data; an `RTA_VIA`
/// address is surfaced as the gateway).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatusSpec {
    /// Family.
    pub family: Family,
    /// Destination; `None` for a default route.
    #[serde(with = "text::opt", rename = "dst", default)]
    pub destination: Option<IpNet>,
    /// Preferred source.
    #[serde(with = "text::opt", rename = "src", default)]
    pub source: Option<IpAddr>,
    /// Gateway.
    #[serde(with = "text::opt", default)]
    pub gateway: Option<IpAddr>,
    /// Out link index.
    pub out_link_index: u32,
    /// Out link name.
    pub out_link_name: String,
    /// Table.
    pub table: RoutingTable,
    /// Metric.
    pub priority: u32,
    /// Scope.
    pub scope: Scope,
    /// Type.
    #[serde(rename = "type")]
    pub r#type: RouteType,
    /// Flags.
    pub flags: RouteFlags,
    /// Protocol.
    pub protocol: RouteProtocol,
    /// Route MTU.
    pub mtu: u32,
}

impl ResourceSpec for RouteStatusSpec {
    const TYPE: &'static str = "RouteStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["route", "routes"])
            .with_columns(&[
                ("Destination", "{.dst}"),
                ("Gateway", "{.gateway}"),
                ("Link", "{.outLinkName}"),
                ("Metric", "{.priority}"),
            ])
    }
}

/// A `RouteStatus` resource.
pub type RouteStatus = Resource<RouteStatusSpec>;
