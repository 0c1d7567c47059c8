//! What the node tests that need a control plane's config share.

use machinery::config::generate::{generate, Input};
use machinery::config::MachineType;
use machinery::secrets::Bundle;

/// Upstream's own secrets bundle.
pub const UPSTREAM: &str = include_str!("../../../machinery/tests/data/upstream-secrets.yaml");

/// A control plane's config from `bundle` whose link `interface` gets `address` (`/24`; secretsd
/// issues apid's certificate once the node has an address), with 127.0.0.1 in the certSANs (as
/// `cluster create` sets it).
pub fn control_plane(bundle: &Bundle, interface: &str, address: &str) -> String {
    let config = generate(
        &Input::new("demo", &format!("https://{address}:6443"), bundle),
        MachineType::ControlPlane,
    )
    .expect("generate");
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&config.to_yaml().expect("yaml")).expect("parse");
    let machine = doc.get_mut("machine").expect("machine");
    machine["network"] = serde_yaml_ng::from_str(&format!(
        "interfaces: [{{interface: {interface}, addresses: [{address}/24]}}]"
    ))
    .expect("network");
    machine["certSANs"] = serde_yaml_ng::from_str("[127.0.0.1]").expect("certSANs");
    serde_yaml_ng::to_string(&doc).expect("yaml")
}
