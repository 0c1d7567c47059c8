//! ResolverStatus: the DNS resolvers the node uses.

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::text;
use super::NAMESPACE;

/// The DNS servers and search domains in effect (ID `resolvers`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolverStatusSpec {
    /// DNS servers.
    #[serde(with = "text::vec", default)]
    pub dns_servers: Vec<IpAddr>,
    /// Search domains.
    #[serde(default)]
    pub search_domains: Vec<String>,
}

impl ResourceSpec for ResolverStatusSpec {
    const TYPE: &'static str = "ResolverStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["resolvers"])
            .with_columns(&[
                ("Resolvers", "{.dnsServers}"),
                ("Search Domains", "{.searchDomains}"),
            ])
    }
}

/// A `ResolverStatus` resource.
pub type ResolverStatus = Resource<ResolverStatusSpec>;
