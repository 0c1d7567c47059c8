//! AddressStatus: one address as the kernel reports it.

use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::nethelpers::{AddressFlags, Family, Scope};
use super::text;
use super::NAMESPACE;

/// One address as the kernel reports it (ID [`address_id`](super::address_id) of
/// `IFA_ADDRESS`/prefix length and the link name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressStatusSpec {
    /// `IFA_ADDRESS` with the prefix length.
    #[serde(with = "text")]
    pub address: IpNet,
    /// `IFA_LOCAL`.
    #[serde(with = "text::opt", default)]
    pub local: Option<IpAddr>,
    /// `IFA_BROADCAST`.
    #[serde(with = "text::opt", default)]
    pub broadcast: Option<IpAddr>,
    /// `IFA_ANYCAST`.
    #[serde(with = "text::opt", default)]
    pub anycast: Option<IpAddr>,
    /// `IFA_MULTICAST`.
    #[serde(with = "text::opt", default)]
    pub multicast: Option<IpAddr>,
    /// Index of the link.
    pub link_index: u32,
    /// Name of the link (`external` for cloud external IPs).
    pub link_name: String,
    /// Family.
    pub family: Family,
    /// Scope.
    pub scope: Scope,
    /// Flags (all of them, kernel-owned ones included).
    pub flags: AddressFlags,
    /// `IFA_RT_PRIORITY`.
    pub priority: u32,
}

impl ResourceSpec for AddressStatusSpec {
    const TYPE: &'static str = "AddressStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["address", "addresses"])
            .with_columns(&[("Address", "{.address}"), ("Link", "{.linkName}")])
    }
}

/// An `AddressStatus` resource.
pub type AddressStatus = Resource<AddressStatusSpec>;
