//! Settings a valid machine configuration may carry that talos-rs accepts but does not apply.
//!
//! Upstream's schema is accepted whole, so a configuration written for Talos decodes and
//! validates here. What talos-rs does not implement is never ignored silently: every such
//! setting is a validation [`Warning`] (printed by `talosctl validate` and `talosctl apply`,
//! an error under `--strict`), and networkd publishes the same list in the network `Status`
//! resource (`talosctl get netstatus -o yaml`, field `unapplied`).
//!
//! This module is the one list of what networkd does not apply: keep it in step with networkd
//! (a setting networkd learns to apply leaves this list, as DHCPv6 did).

use super::document::Config;
use super::error::{join_index, join_key, Warning};
use super::v1alpha1::{Device, NetworkConfig};

/// Multi-document network kinds networkd does not implement, with what is therefore not done.
pub const UNAPPLIED_NETWORK_DOCUMENTS: &[(&str, &str)] = &[
    ("LinkConfig", "link configuration documents are not applied"),
    ("DummyLinkConfig", "the dummy link is not created"),
    ("VLANConfig", "the VLAN link is not created"),
    ("BondConfig", "the bond is not created"),
    ("BridgeConfig", "the bridge is not created"),
    ("VRFConfig", "VRF links are not supported: the link is not created"),
    ("VethConfig", "veth links are not supported: the pair is not created"),
    (
        "WireguardConfig",
        "WireGuard links are not supported: the link is not created",
    ),
    (
        "DHCPv4Config",
        "DHCPv4 documents are not applied (use machine.network.interfaces[].dhcp)",
    ),
    (
        "DHCPv6Config",
        "DHCPv6 documents are not applied (use machine.network.interfaces[].dhcpOptions.ipv6)",
    ),
    (
        "Layer2VIPConfig",
        "Layer2VIPConfig documents are not applied (use machine.network.interfaces[].vip)",
    ),
    (
        "HCloudVIPConfig",
        "Hetzner Cloud VIPs are not implemented: the address is never assigned",
    ),
    ("LinkAliasConfig", "link aliases are not supported"),
    ("RoutingRuleConfig", "routing rules are not supported"),
    ("BlackholeRouteConfig", "blackhole routes are not applied"),
    (
        "HostnameConfig",
        "hostname documents are not applied (use machine.network.hostname or machine.features.stableHostname)",
    ),
    (
        "ResolverConfig",
        "resolver documents are not applied (use machine.network.nameservers)",
    ),
    (
        "StaticHostConfig",
        "static host documents are not applied (use machine.network.extraHostEntries)",
    ),
    (
        "TimeSyncConfig",
        "time sync documents are not applied (use machine.time.servers)",
    ),
    ("EthernetConfig", "ethernet (ethtool) settings are not applied"),
    ("TCPProbeConfig", "network probes are not run"),
    ("HTTPProbeConfig", "network probes are not run"),
    ("KubeSpanConfig", "KubeSpan is not implemented"),
    ("KubeSpanEndpointsConfig", "KubeSpan is not implemented"),
    (
        "NetworkRuleConfig",
        "the host firewall is not implemented: the rule is not enforced",
    ),
    (
        "NetworkDefaultActionConfig",
        "the host firewall is not implemented: the default action is not enforced",
    ),
    ("BGPInstanceConfig", "BGP is not implemented"),
];

/// The prefix of every message, so that a reader knows it is about this implementation.
const PREFIX: &str = "not applied by talos-rs";

const WIREGUARD: &str = "WireGuard links are not supported: the link is not created";
const VIP_CLOUD: &str = "the cloud API of a shared IP (equinixMetal, hcloud) is not called: the IP is shared on layer 2 only";
const KUBESPAN: &str = "KubeSpan is not implemented";

fn warning(path: impl Into<String>, what: &str) -> Warning {
    Warning::new(path, format!("{PREFIX}: {what}"))
}

/// Every setting of `config` that talos-rs accepts but does not apply, each with its path
/// (`machine.network.interfaces[2].wireguard`, `v1alpha1/RoutingRuleConfig/1000`).
pub fn unapplied(config: &Config) -> Vec<Warning> {
    let mut out = Vec::new();
    if let Some(network) = config
        .v1alpha1
        .as_ref()
        .and_then(|d| d.machine.as_ref())
        .and_then(|m| m.network.as_ref())
    {
        network_section(network, &mut out);
    }
    for doc in &config.documents {
        if let Some((_, what)) = UNAPPLIED_NETWORK_DOCUMENTS
            .iter()
            .find(|(kind, _)| *kind == doc.kind)
        {
            out.push(warning(doc.id().to_string(), what));
        }
    }
    out
}

fn network_section(network: &NetworkConfig, out: &mut Vec<Warning>) {
    let base = "machine.network";
    for (i, device) in network.interfaces.iter().enumerate() {
        let path = join_index(&format!("{base}.interfaces"), i);
        device_settings(device, &path, out);
    }
    if network
        .kubespan
        .as_ref()
        .is_some_and(|k| k.enabled == Some(true))
    {
        out.push(warning(format!("{base}.kubespan"), KUBESPAN));
    }
}

fn device_settings(device: &Device, path: &str, out: &mut Vec<Warning>) {
    if device.is_ignored() {
        return;
    }
    if device.wireguard.is_some() {
        out.push(warning(join_key(path, "wireguard"), WIREGUARD));
    }
    let cloud = |v: &Option<super::v1alpha1::DeviceVipConfig>| {
        v.as_ref()
            .is_some_and(|v| v.equinix_metal.is_some() || v.hcloud.is_some())
    };
    if cloud(&device.vip) {
        out.push(warning(join_key(path, "vip"), VIP_CLOUD));
    }
    for (j, vlan) in device.vlans.iter().enumerate() {
        if cloud(&vlan.vip) {
            let vlan_path = join_index(&join_key(path, "vlans"), j);
            out.push(warning(join_key(&vlan_path, "vip"), VIP_CLOUD));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(yaml: &str) -> Vec<String> {
        let config = Config::from_yaml(yaml).expect("decodes");
        unapplied(&config).into_iter().map(|w| w.path).collect()
    }

    #[test]
    fn wireguard_vip_kubespan_and_documents_are_listed() {
        let yaml = r#"
version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        dhcpOptions: {ipv4: true, ipv6: true}
        vip: {ip: 10.0.0.100, hcloud: {apiToken: x}}
        vlans:
          - {vlanId: 10, vip: {ip: 10.0.10.100, equinixMetal: {apiToken: x}}}
          - {vlanId: 11, vip: {ip: 10.0.11.100}}
      - interface: wg0
        wireguard: {privateKey: x}
      - interface: wg1
        ignore: true
        wireguard: {privateKey: x}
    kubespan: {enabled: true}
---
apiVersion: v1alpha1
kind: RoutingRuleConfig
name: "1000"
---
apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: x
"#;
        assert_eq!(
            paths(yaml),
            [
                "machine.network.interfaces[0].vip",
                "machine.network.interfaces[0].vlans[0].vip",
                "machine.network.interfaces[1].wireguard",
                "machine.network.kubespan",
                "v1alpha1/RoutingRuleConfig/1000",
            ]
        );
    }

    #[test]
    fn what_networkd_applies_is_not_listed() {
        let yaml = r#"
version: v1alpha1
machine:
  network:
    hostname: n1
    interfaces:
      - interface: eth0
        addresses: [10.0.0.2/24]
        routes: [{network: 0.0.0.0/0, gateway: 10.0.0.1, mtu: 1400}]
        dhcp: true
        dhcpOptions: {ipv4: true, ipv6: true, duidv6: "000100011234"}
        vlans: [{vlanId: 10, dhcp: true}]
      - interface: bond0
        bond: {mode: active-backup, interfaces: [eth1, eth2]}
      - interface: br0
        bridge: {interfaces: [eth3], stp: {enabled: true}}
      - interface: dummy0
        dummy: true
    kubespan: {enabled: false}
"#;
        assert!(paths(yaml).is_empty());
    }
}
