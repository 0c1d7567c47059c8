//! TimeServerSpec: the desired NTP servers.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::NAMESPACE;

/// Desired NTP servers: a candidate per source in `network-config`, the winner `timeservers`
/// in `network`. Networking only publishes them; the time subsystem consumes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeServerSpecSpec {
    /// NTP servers (names or addresses).
    #[serde(rename = "timeServers")]
    pub ntp_servers: Vec<String>,
    /// Use NTS.
    #[serde(rename = "useNTS", default)]
    pub use_nts: bool,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
}

impl ResourceSpec for TimeServerSpecSpec {
    const TYPE: &'static str = "TimeServerSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

impl cosi::generic::Layered for TimeServerSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        super::id::TIME_SERVER_ID.to_string()
    }
}

/// A `TimeServerSpec` resource.
pub type TimeServerSpec = Resource<TimeServerSpecSpec>;
