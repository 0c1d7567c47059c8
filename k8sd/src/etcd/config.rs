//! `etcd.ConfigController` and `etcd.SpecController`, as upstream's: the machine configuration
//! → `EtcdConfig` (control planes with an etcd CA only) → with the hostname and the node's
//! addresses → `EtcdSpec`.

use std::net::IpAddr;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use ipnet::IpNet;
use machinery::config::Config;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::etcd::{EtcdConfigSpec, EtcdSpecSpec, ETCD_ID, NAMESPACE};
use machinery::resources::network::{
    filtered_node_address_id, HostnameStatusSpec, NodeAddressSpec, FILTER_NO_K8S, HOSTNAME_ID,
    NAMESPACE as NETWORK, NODE_ADDRESS_CURRENT_ID, NODE_ADDRESS_ROUTED_ID,
};

/// The etcd configuration of a machine configuration: `None` on a worker, or without an etcd
/// CA (upstream starts no etcd then).
pub fn etcd_config(config: &Config) -> Option<EtcdConfigSpec> {
    if !config.machine_type().is_some_and(|t| t.is_control_plane()) {
        return None;
    }
    let etcd = config.cluster()?.etcd.as_ref()?;
    etcd.ca.as_ref()?;
    let mut vips = Vec::new();
    if let Some(net) = config.machine().and_then(|m| m.network.as_ref()) {
        for dev in &net.interfaces {
            let dev_vips = dev
                .vip
                .iter()
                .chain(dev.vlans.iter().filter_map(|v| v.vip.as_ref()));
            for vip in dev_vips {
                if let Some(ip) = vip.ip.as_deref().and_then(|s| s.parse::<IpAddr>().ok()) {
                    vips.push(IpNet::from(ip).to_string());
                }
            }
        }
    }
    let mut advertise = etcd.advertised_subnets.clone();
    if advertise.is_empty() {
        if let Some(s) = etcd.subnet.as_ref().filter(|s| !s.is_empty()) {
            advertise.push(s.clone());
        }
    }
    Some(EtcdConfigSpec {
        advertise_valid_subnets: advertise,
        advertise_exclude_subnets: vips.clone(),
        listen_valid_subnets: etcd.listen_subnets.clone(),
        listen_exclude_subnets: vips,
        image: etcd.image.clone().unwrap_or_default(),
        extra_args: etcd.extra_args.clone(),
    })
}

/// `etcd.ConfigController`.
#[derive(Default)]
pub struct ConfigController {
    /// The text last refused (logged once).
    refused: Option<String>,
}

impl Controller for ConfigController {
    fn name(&self) -> &'static str {
        "etcd.ConfigController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<MachineConfigSpec>(REDACTED_NAMESPACE).with_id(ACTIVE_ID)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<EtcdConfigSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(mc) = ctx
            .get::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
            .await?
        else {
            return Ok(Action::AwaitChange);
        };
        let config = match Config::from_yaml(&mc.spec.0) {
            Ok(c) => c,
            Err(e) => {
                // init validated it before writing it: this is a bug, and nothing changes.
                if self.refused.as_deref() != Some(mc.spec.0.as_str()) {
                    tracing::error!(error = %e, "the machine configuration does not parse; etcd's configuration is kept");
                    self.refused = Some(mc.spec.0.clone());
                }
                super::keep::<EtcdConfigSpec>(ctx, NAMESPACE, ETCD_ID).await?;
                return Ok(Action::AwaitChange);
            }
        };
        if let Some(spec) = etcd_config(&config) {
            ctx.apply(Resource::new(NAMESPACE, ETCD_ID, spec)).await?;
        }
        Ok(Action::AwaitChange)
    }
}

fn parse_nets(list: &[String]) -> Vec<IpNet> {
    list.iter()
        .filter_map(|s| {
            s.parse::<IpNet>()
                .ok()
                .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
        })
        .collect()
}

/// The addresses in any of `valid` (all when empty) and in none of `exclude`.
fn filter(addresses: &[IpNet], valid: &[IpNet], exclude: &[IpNet]) -> Vec<IpAddr> {
    addresses
        .iter()
        .map(IpNet::addr)
        .filter(|a| valid.is_empty() || valid.iter().any(|n| n.contains(a)))
        .filter(|a| !exclude.iter().any(|n| n.contains(a)))
        .collect()
}

/// The spec of `config` for this hostname and these addresses (upstream `etcd.SpecController`):
/// `None` while there is no routed address to advertise.
pub fn etcd_spec(
    config: &EtcdConfigSpec,
    hostname: &str,
    routed: &[IpNet],
    current: &[IpNet],
) -> Option<EtcdSpecSpec> {
    let exclude = parse_nets(&config.advertise_exclude_subnets);
    let advertised: Vec<IpAddr> = if config.advertise_valid_subnets.is_empty() {
        // The first routed address only.
        filter(routed, &[], &exclude).into_iter().take(1).collect()
    } else {
        filter(
            current,
            &parse_nets(&config.advertise_valid_subnets),
            &exclude,
        )
    };
    if advertised.is_empty() {
        return None;
    }
    let any: IpAddr = [0, 0, 0, 0].into();
    let (peer, client) = if config.listen_valid_subnets.is_empty() {
        (vec![any], vec![any])
    } else {
        let peer = filter(
            routed,
            &parse_nets(&config.listen_valid_subnets),
            &parse_nets(&config.listen_exclude_subnets),
        );
        let mut client = vec![IpAddr::from([127, 0, 0, 1])];
        client.extend(peer.iter().copied());
        (peer, client)
    };
    Some(EtcdSpecSpec {
        name: hostname.to_string(),
        advertised_addresses: advertised,
        listen_peer_addresses: peer,
        listen_client_addresses: client,
        image: config.image.clone(),
        extra_args: config.extra_args.clone(),
    })
}

/// `etcd.SpecController`.
pub struct SpecController;

fn routed_id() -> String {
    filtered_node_address_id(NODE_ADDRESS_ROUTED_ID, FILTER_NO_K8S)
}

fn current_id() -> String {
    filtered_node_address_id(NODE_ADDRESS_CURRENT_ID, FILTER_NO_K8S)
}

impl Controller for SpecController {
    fn name(&self) -> &'static str {
        "etcd.SpecController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<EtcdConfigSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<HostnameStatusSpec>(NETWORK).with_id(HOSTNAME_ID),
            Input::weak::<NodeAddressSpec>(NETWORK).with_id(routed_id()),
            Input::weak::<NodeAddressSpec>(NETWORK).with_id(current_id()),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<EtcdSpecSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(config) = ctx.get::<EtcdConfigSpec>(NAMESPACE, ETCD_ID).await? else {
            return Ok(Action::AwaitChange);
        };
        let hostname = ctx.get::<HostnameStatusSpec>(NETWORK, HOSTNAME_ID).await?;
        let routed = ctx.get::<NodeAddressSpec>(NETWORK, &routed_id()).await?;
        let current = ctx.get::<NodeAddressSpec>(NETWORK, &current_id()).await?;
        let (Some(hostname), Some(routed)) = (hostname, routed) else {
            // Not ready: whatever was written stays (upstream's SkipReconcile).
            super::keep::<EtcdSpecSpec>(ctx, NAMESPACE, ETCD_ID).await?;
            return Ok(Action::AwaitChange);
        };
        let current = current.map(|c| c.spec.addresses).unwrap_or_default();
        match etcd_spec(
            &config.spec,
            &hostname.spec.hostname,
            &routed.spec.addresses,
            &current,
        ) {
            Some(spec) => {
                ctx.apply(Resource::new(NAMESPACE, ETCD_ID, spec)).await?;
                Ok(Action::AwaitChange)
            }
            None => {
                super::keep::<EtcdSpecSpec>(ctx, NAMESPACE, ETCD_ID).await?;
                Ok(Action::AwaitChange)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|x| x.parse().unwrap()).collect()
    }

    #[test]
    fn the_first_routed_address_is_advertised_never_a_vip() {
        let config = EtcdConfigSpec {
            advertise_exclude_subnets: vec!["10.5.0.100/32".into()],
            ..Default::default()
        };
        let s = etcd_spec(
            &config,
            "cp-1",
            &nets(&["10.5.0.100/24", "10.5.0.2/24", "10.5.0.9/24"]),
            &[],
        )
        .unwrap();
        assert_eq!(
            s.advertised_addresses,
            vec!["10.5.0.2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            s.listen_peer_addresses,
            vec!["0.0.0.0".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(s.name, "cp-1");
        assert!(etcd_spec(&config, "cp-1", &nets(&["10.5.0.100/24"]), &[]).is_none());
    }

    #[test]
    fn configured_subnets_pick_every_match_and_listen_narrowly() {
        let config = EtcdConfigSpec {
            advertise_valid_subnets: vec!["192.168.0.0/16".into()],
            listen_valid_subnets: vec!["192.168.0.0/16".into()],
            ..Default::default()
        };
        let s = etcd_spec(
            &config,
            "cp",
            &nets(&["10.0.0.1/8", "192.168.1.1/24"]),
            &nets(&["10.0.0.1/8", "192.168.1.1/24", "192.168.2.1/24"]),
        )
        .unwrap();
        assert_eq!(s.advertised_addresses.len(), 2);
        assert_eq!(
            s.listen_client_addresses,
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "192.168.1.1".parse().unwrap()
            ]
        );
    }
}
