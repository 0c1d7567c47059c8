//! `network.TimeServerConfigController`: NTP server candidates from the machine configuration
//! (`machine.time.servers`), the kernel command line (`ip=` field 9) and the default.

use std::collections::BTreeMap;

use cosi::runtime::{Context, ReconcileError};
use machinery::resources::network::{layered_id, ConfigLayer, TimeServerSpecSpec, TIME_SERVER_ID};

use super::config::{ConfigController, ConfigPart, Derive};

/// The default NTP server (upstream `DefaultNTPServer`).
pub const DEFAULT_NTP_SERVER: &str = "time.cloudflare.com";

/// Time server candidates.
#[derive(Debug)]
pub struct TimeServerConfig;

/// `network.TimeServerConfigController`.
pub type TimeServerConfigController = ConfigController<TimeServerConfig>;

impl ConfigPart for TimeServerConfig {
    type Spec = TimeServerSpecSpec;
    const NAME: &'static str = "network.TimeServerConfigController";

    async fn desired(
        _ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, TimeServerSpecSpec>, ReconcileError> {
        let mut out = BTreeMap::new();
        let mut add = |servers: Vec<String>, layer: ConfigLayer| {
            if !servers.is_empty() {
                out.insert(
                    layered_id(layer, TIME_SERVER_ID),
                    TimeServerSpecSpec {
                        ntp_servers: servers,
                        use_nts: false,
                        layer,
                    },
                );
            }
        };
        add(vec![DEFAULT_NTP_SERVER.to_string()], ConfigLayer::Default);
        add(
            from.cmdline
                .ips
                .iter()
                .flat_map(|ip| ip.ntp.clone())
                .collect(),
            ConfigLayer::Cmdline,
        );
        if let Some(m) = from.machine {
            add(m.time_servers.clone(), ConfigLayer::Configuration);
        }
        Ok(out)
    }
}
