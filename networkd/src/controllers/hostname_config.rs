//! `network.HostnameConfigController`: hostname candidates from the machine configuration,
//! the kernel command line (`talos.hostname=`, `ip=` field 4) and the default `talos-<ip>`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cosi::runtime::{Context, Input, ReconcileError};
use machinery::resources::network::{
    layered_id, ConfigLayer, HostnameSpecSpec, NodeAddressSpec, HOSTNAME_ID, NAMESPACE,
    NODE_ADDRESS_DEFAULT_ID,
};

use super::config::{ConfigController, ConfigPart, Derive};

/// Hostname candidates.
#[derive(Debug)]
pub struct HostnameConfig;

/// `network.HostnameConfigController`.
pub type HostnameConfigController = ConfigController<HostnameConfig>;

/// The default hostname for a node address (upstream `talos-addr`): `talos-10-0-0-2`,
/// `talos-2001db8--1` (dots become dashes, colons are dropped).
pub fn default_hostname(addr: &IpAddr) -> String {
    let text = match addr {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', ""),
    };
    format!("talos-{text}")
}

impl ConfigPart for HostnameConfig {
    type Spec = HostnameSpecSpec;
    const NAME: &'static str = "network.HostnameConfigController";

    fn extra_inputs() -> Vec<Input> {
        vec![Input::weak::<NodeAddressSpec>(NAMESPACE).with_id(NODE_ADDRESS_DEFAULT_ID)]
    }

    async fn desired(
        ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, HostnameSpecSpec>, ReconcileError> {
        let mut out = BTreeMap::new();
        let mut add =
            |name: &str, layer: ConfigLayer| match HostnameSpecSpec::parse_fqdn(name, layer) {
                Ok(spec) => {
                    out.insert(layered_id(layer, HOSTNAME_ID), spec);
                }
                Err(e) => tracing::warn!(layer = %layer, error = %e, "hostname ignored"),
            };
        // The stable hostname (`features.stableHostname`) needs the node identity, which
        // networkd does not have: such nodes get the address-based default.
        if let Some(default) = ctx
            .get::<NodeAddressSpec>(NAMESPACE, NODE_ADDRESS_DEFAULT_ID)
            .await?
        {
            if let [only] = default.spec.addresses.as_slice() {
                add(&default_hostname(&only.addr()), ConfigLayer::Default);
            }
        }
        if let Some(name) = from.cmdline.effective_hostname() {
            add(name, ConfigLayer::Cmdline);
        }
        if let Some(name) = from.machine.and_then(|m| m.hostname.as_deref()) {
            add(name, ConfigLayer::Configuration);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_hostnames() {
        assert_eq!(
            default_hostname(&"10.0.0.2".parse().expect("ip")),
            "talos-10-0-0-2"
        );
        assert_eq!(
            default_hostname(&"2001:db8::1".parse().expect("ip")),
            "talos-2001db81"
        );
    }
}
