//! NodeAddressFilter: a filter that derives filtered NodeAddress sets.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::text;
use super::NAMESPACE;

/// A filter (ID `no-k8s`, `only-k8s`): a filtered set keeps the addresses inside any of
/// `include_subnets` (all if empty), then drops those inside any of `exclude_subnets`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAddressFilterSpec {
    /// Keep only addresses in these subnets (all when empty).
    #[serde(with = "text::vec", default)]
    pub include_subnets: Vec<IpNet>,
    /// Drop addresses in these subnets.
    #[serde(with = "text::vec", default)]
    pub exclude_subnets: Vec<IpNet>,
}

impl NodeAddressFilterSpec {
    /// Whether `address` passes the filter.
    pub fn matches(&self, address: &IpNet) -> bool {
        let ip = address.addr();
        (self.include_subnets.is_empty() || self.include_subnets.iter().any(|s| s.contains(&ip)))
            && !self.exclude_subnets.iter().any(|s| s.contains(&ip))
    }
}

impl ResourceSpec for NodeAddressFilterSpec {
    const TYPE: &'static str = "NodeAddressFilters.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Include Subnets", "{.includeSubnets}"),
            ("Exclude Subnets", "{.excludeSubnets}"),
        ])
    }
}

/// A `NodeAddressFilter` resource.
pub type NodeAddressFilter = Resource<NodeAddressFilterSpec>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_then_exclude() {
        let f = NodeAddressFilterSpec {
            include_subnets: vec![],
            exclude_subnets: vec!["10.244.0.0/16".parse().expect("net")],
        };
        assert!(f.matches(&"192.168.1.2/24".parse().expect("net")));
        assert!(!f.matches(&"10.244.3.1/24".parse().expect("net")));
        let only = NodeAddressFilterSpec {
            include_subnets: vec!["10.244.0.0/16".parse().expect("net")],
            exclude_subnets: vec![],
        };
        assert!(!only.matches(&"192.168.1.2/24".parse().expect("net")));
    }
}
