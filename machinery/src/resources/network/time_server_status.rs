//! TimeServerStatus: the NTP servers in effect.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::NAMESPACE;

/// The NTP servers in effect (ID `timeservers`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeServerStatusSpec {
    /// NTP servers.
    #[serde(rename = "timeServers")]
    pub ntp_servers: Vec<String>,
    /// Use NTS.
    #[serde(rename = "useNTS", default)]
    pub use_nts: bool,
}

impl ResourceSpec for TimeServerStatusSpec {
    const TYPE: &'static str = "TimeServerStatuses.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_aliases(&["timeserver", "timeservers"])
            .with_columns(&[("Timeservers", "{.timeServers}"), ("UseNTS", "{.useNTS}")])
    }
}

/// A `TimeServerStatus` resource.
pub type TimeServerStatus = Resource<TimeServerStatusSpec>;
