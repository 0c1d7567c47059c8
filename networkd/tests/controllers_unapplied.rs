//! What networkd accepts but does not apply is never silent: the network Status lists it
//! (`unapplied`, the same list `talosctl validate` warns about), and what it does apply
//! (DHCPv6 included, with the configured DUID) is not listed. Against a real stated and the
//! real runtime.

mod controllers_support;

use controllers_support::Node;
use machinery::resources::network::{
    ClientIdentifier, Operator, OperatorSpecSpec, StatusSpec, NAMESPACE, STATUS_ID,
};

const UNAPPLIED: &str = r#"
version: v1alpha1
machine:
  type: controlplane
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        dhcpOptions: {ipv4: true, ipv6: true, duidv6: "00:03:00:01:02:00:00:00:00:09"}
        vip: {ip: 10.0.0.100, hcloud: {apiToken: x}}
      - interface: wg0
        addresses: [10.10.0.1/24]
        wireguard:
          privateKey: GA1E1VB+g41Dl0+UH2TMW9C5953y+moVg6JIIqkJbmw=
          listenPort: 51820
    kubespan: {enabled: true}
---
apiVersion: v1alpha1
kind: RoutingRuleConfig
name: "1000"
table: 100
"#;

const APPLIED: &str = r#"
version: v1alpha1
machine:
  type: controlplane
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        dhcpOptions: {ipv4: true, ipv6: true}
"#;

#[tokio::test]
async fn unapplied_settings_are_listed_in_the_network_status() {
    let node = Node::start().await;
    node.physical_link("eth0", "52:54:00:00:00:01").await;
    node.config(UNAPPLIED).await;

    let status = node
        .expect::<StatusSpec>(NAMESPACE, STATUS_ID, |s| !s.unapplied.is_empty())
        .await;
    let paths: Vec<&str> = status
        .spec
        .unapplied
        .iter()
        .map(|u| u.split(": ").next().unwrap_or_default())
        .collect();
    assert_eq!(
        paths,
        [
            "machine.network.interfaces[0].vip",
            "machine.network.interfaces[1].wireguard",
            "machine.network.kubespan",
            "v1alpha1/RoutingRuleConfig/1000",
        ],
        "{:?}",
        status.spec.unapplied
    );
    assert!(
        status.spec.unapplied[1].contains("WireGuard links are not supported"),
        "{:?}",
        status.spec.unapplied
    );

    // DHCPv6 is applied: an operator with the configured DUID, not listed.
    let op = node
        .expect::<OperatorSpecSpec>(NAMESPACE, "dhcp6/eth0", |_| true)
        .await;
    assert_eq!(op.spec.operator, Operator::Dhcp6);
    assert_eq!(op.spec.dhcp6.client_identifier, ClientIdentifier::Duid);
    assert_eq!(op.spec.dhcp6.duid_raw_hex, "00:03:00:01:02:00:00:00:00:09");

    // Once everything in the configuration is applied, the list is empty.
    node.config(APPLIED).await;
    node.expect::<StatusSpec>(NAMESPACE, STATUS_ID, |s| s.unapplied.is_empty())
        .await;
    let op = node
        .expect::<OperatorSpecSpec>(NAMESPACE, "dhcp6/eth0", |o| o.dhcp6.duid_raw_hex.is_empty())
        .await;
    assert_eq!(op.spec.dhcp6.client_identifier, ClientIdentifier::Mac);
}
