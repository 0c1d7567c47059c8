//! HostnameStatus: the hostname the node has.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::hostname_spec::fqdn;
use super::NAMESPACE;

/// The hostname and domain name applied to the node (ID `hostname`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostnameStatusSpec {
    /// Short hostname.
    pub hostname: String,
    /// Domain name, possibly empty.
    pub domainname: String,
}

impl HostnameStatusSpec {
    /// `host.domain`, or `host`.
    pub fn fqdn(&self) -> String {
        fqdn(&self.hostname, &self.domainname)
    }

    /// The names the node answers to: the FQDN, then the short name if different.
    pub fn dns_names(&self) -> Vec<String> {
        let mut names = vec![self.fqdn()];
        if !self.domainname.is_empty() {
            names.push(self.hostname.clone());
        }
        names
    }
}

impl ResourceSpec for HostnameStatusSpec {
    const TYPE: &'static str = "HostnameStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["hostname"])
            .with_columns(&[("Hostname", "{.hostname}"), ("Domainname", "{.domainname}")])
    }
}

/// A `HostnameStatus` resource.
pub type HostnameStatus = Resource<HostnameStatusSpec>;
