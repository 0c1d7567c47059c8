//! NodeAddress: the node's own addresses, in the sets other subsystems pick from.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::nethelpers::NodeAddressSortAlgorithm;
use super::text;
use super::NAMESPACE;

/// One set of node addresses: `default`, `current`, `routed`, `accumulative`, or a filtered
/// set such as `routed-no-k8s` (see [`filtered_node_address_id`](super::filtered_node_address_id)).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAddressSpec {
    /// The addresses with their prefix lengths, sorted by `sort_algorithm`.
    #[serde(with = "text::vec", default)]
    pub addresses: Vec<IpNet>,
    /// How they are sorted.
    #[serde(default)]
    pub sort_algorithm: NodeAddressSortAlgorithm,
}

impl ResourceSpec for NodeAddressSpec {
    const TYPE: &'static str = "NodeAddresses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[
            ("Addresses", "{.addresses}"),
            ("SortAlgorithm", "{.sortAlgorithm}"),
        ])
    }
}

/// A `NodeAddress` resource.
pub type NodeAddress = Resource<NodeAddressSpec>;
