//! ResolverSpec: the desired DNS resolvers and search domains.

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::text;
use super::NAMESPACE;

/// Desired DNS servers and search domains: a candidate per source in `network-config`
/// (`<layer>/resolvers`, `dhcp4/eth0/resolvers`), the winner `resolvers` in `network`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolverSpecSpec {
    /// DNS servers, in order of preference.
    #[serde(with = "text::vec", default)]
    pub dns_servers: Vec<IpAddr>,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
    /// Search domains.
    #[serde(default)]
    pub search_domains: Vec<String>,
    /// The search domains were set explicitly (an empty list then clears lower layers').
    #[serde(default)]
    pub search_domains_overridden: bool,
}

impl ResourceSpec for ResolverSpecSpec {
    const TYPE: &'static str = "ResolverSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Layer", "{.layer}"),
            ("Resolvers", "{.dnsServers}"),
            ("Search Domains", "{.searchDomains}"),
        ])
    }
}

impl cosi::generic::Layered for ResolverSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        super::id::RESOLVER_ID.to_string()
    }
}

/// A `ResolverSpec` resource.
pub type ResolverSpec = Resource<ResolverSpecSpec>;
