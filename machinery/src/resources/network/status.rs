//! The network Status: readiness of the network for the services that wait on it.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::NAMESPACE;

/// Network readiness (ID `status`). CRI, etcd and kubelet wait for address, hostname and etc
/// files; trustd for address and hostname.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusSpec {
    /// The node has at least one current address.
    pub address_ready: bool,
    /// A default route exists (or every probe succeeds, once probes exist).
    pub connectivity_ready: bool,
    /// A hostname is applied.
    pub hostname_ready: bool,
    /// `/etc/hosts` and `/etc/resolv.conf` are rendered.
    pub etc_files_ready: bool,
    /// What the machine configuration asks for that networkd accepts but does not apply, one
    /// `path: what` per setting (WireGuard links, VIPs, KubeSpan, multi-document network kinds;
    /// see `machinery::config::unapplied`). Not in upstream's Status: here nothing that is not
    /// applied is silent. Empty (and absent) when everything is applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unapplied: Vec<String>,
}

impl ResourceSpec for StatusSpec {
    const TYPE: &'static str = "NetworkStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // The automatic acronym `ns` is Namespace's (stated's): another owner's name.
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .without_aliases(&["ns", "nss"])
            .with_aliases(&["netstatus", "netstatuses"])
            .with_columns(&[
                ("Address", "{.addressReady}"),
                ("Connectivity", "{.connectivityReady}"),
                ("Hostname", "{.hostnameReady}"),
                ("Etc", "{.etcFilesReady}"),
            ])
    }
}

/// A network `Status` resource.
pub type Status = Resource<StatusSpec>;
