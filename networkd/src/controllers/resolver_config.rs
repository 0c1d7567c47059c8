//! `network.ResolverConfigController`: DNS resolver candidates from the machine
//! configuration, the kernel command line (`ip=` fields 7 and 8) and the defaults.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use cosi::runtime::{Context, Input, ReconcileError};
use machinery::resources::network::{
    layered_id, ConfigLayer, HostnameStatusSpec, ResolverSpecSpec, HOSTNAME_ID, NAMESPACE,
    RESOLVER_ID,
};

use super::config::{ConfigController, ConfigPart, Derive};

/// The default resolvers (upstream `DefaultPrimaryResolver`, `DefaultSecondaryResolver`).
pub const DEFAULT_RESOLVERS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1)),
    IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)),
];

/// Resolver candidates.
#[derive(Debug)]
pub struct ResolverConfig;

/// `network.ResolverConfigController`.
pub type ResolverConfigController = ConfigController<ResolverConfig>;

impl ConfigPart for ResolverConfig {
    type Spec = ResolverSpecSpec;
    const NAME: &'static str = "network.ResolverConfigController";

    fn extra_inputs() -> Vec<Input> {
        vec![Input::weak::<HostnameStatusSpec>(NAMESPACE).with_id(HOSTNAME_ID)]
    }

    async fn desired(
        ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, ResolverSpecSpec>, ReconcileError> {
        let mut out = BTreeMap::new();
        let disable_search = from.machine.is_some_and(|m| m.disable_search_domain);
        let mut default = ResolverSpecSpec {
            dns_servers: DEFAULT_RESOLVERS.to_vec(),
            layer: ConfigLayer::Default,
            ..Default::default()
        };
        if !disable_search {
            if let Some(h) = ctx
                .get::<HostnameStatusSpec>(NAMESPACE, HOSTNAME_ID)
                .await?
            {
                if !h.spec.domainname.is_empty() {
                    default.search_domains.push(h.spec.domainname);
                }
            }
        }
        out.insert(layered_id(ConfigLayer::Default, RESOLVER_ID), default);

        let cmdline_dns: Vec<IpAddr> = from
            .cmdline
            .ips
            .iter()
            .flat_map(|ip| ip.dns.clone())
            .collect();
        if !cmdline_dns.is_empty() {
            out.insert(
                layered_id(ConfigLayer::Cmdline, RESOLVER_ID),
                ResolverSpecSpec {
                    dns_servers: cmdline_dns,
                    layer: ConfigLayer::Cmdline,
                    ..Default::default()
                },
            );
        }
        if let Some(m) = from.machine {
            if !m.nameservers.is_empty() || !m.search_domains.is_empty() {
                out.insert(
                    layered_id(ConfigLayer::Configuration, RESOLVER_ID),
                    ResolverSpecSpec {
                        dns_servers: m.nameservers.clone(),
                        layer: ConfigLayer::Configuration,
                        search_domains: m.search_domains.clone(),
                        search_domains_overridden: false,
                    },
                );
            }
        }
        Ok(out)
    }
}
