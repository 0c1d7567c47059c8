//! `gen config`: a control plane's and a worker's configuration from one bundle (upstream's own
//! and a generated one) decode, validate, carry the bundle's certificates and tokens, and a
//! worker's carries no CA key at all.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::SystemTime;

use machinery::config::generate::{generate, GenerateError, Input};
use machinery::config::{Config, MachineType, ValidationMode};
use machinery::secrets::Bundle;

const UPSTREAM: &str = include_str!("data/upstream-secrets.yaml");

/// Every private key of the bundle, base64 as the configs carry them.
fn keys(b: &Bundle) -> Vec<(&'static str, String)> {
    let c = b.certs.as_ref().unwrap();
    vec![
        ("os", c.os.as_ref().unwrap().key.clone()),
        ("etcd", c.etcd.as_ref().unwrap().key.clone()),
        ("k8s", c.k8s.as_ref().unwrap().key.clone()),
        (
            "k8saggregator",
            c.k8saggregator.as_ref().unwrap().key.clone(),
        ),
        (
            "k8sserviceaccount",
            c.k8sserviceaccount.as_ref().unwrap().key.clone(),
        ),
    ]
}

fn check(bundle: &Bundle) {
    let input = Input::new("demo", "https://10.5.0.2:6443", bundle);
    let cp = generate(&input, MachineType::ControlPlane)
        .unwrap()
        .to_yaml()
        .unwrap();
    let worker = generate(&input, MachineType::Worker)
        .unwrap()
        .to_yaml()
        .unwrap();
    for (role, text) in [("controlplane", &cp), ("worker", &worker)] {
        let config = Config::from_yaml(text).unwrap_or_else(|e| panic!("{role}: {e}\n{text}"));
        for mode in [
            ValidationMode::Metal,
            ValidationMode::Container,
            ValidationMode::Cloud,
        ] {
            config
                .validate(mode)
                .unwrap_or_else(|e| panic!("{role} in {mode:?}: {e}\n{text}"));
        }
        assert_eq!(config.machine_type().unwrap().as_str(), role);
        let m = config.machine().unwrap();
        let c = config.cluster().unwrap();
        assert_eq!(
            m.token.as_deref(),
            Some(bundle.trustdinfo.as_ref().unwrap().token.as_str())
        );
        let certs = bundle.certs.as_ref().unwrap();
        assert_eq!(
            m.ca.as_ref().unwrap().crt,
            Some(certs.os.as_ref().unwrap().crt.clone())
        );
        assert_eq!(
            c.ca.as_ref().unwrap().crt,
            Some(certs.k8s.as_ref().unwrap().crt.clone())
        );
        assert_eq!(
            c.token.as_deref(),
            Some(bundle.secrets.as_ref().unwrap().bootstraptoken.as_str())
        );
        assert_eq!(
            c.id.as_deref(),
            Some(bundle.cluster.as_ref().unwrap().id.as_str())
        );
        assert_eq!(
            c.control_plane.as_ref().unwrap().endpoint.as_deref(),
            Some("https://10.5.0.2:6443")
        );
    }
    // The control plane has every key; the worker none, under any field.
    for (name, key) in keys(bundle) {
        assert!(
            cp.contains(&key),
            "the control plane's config has the {name} key"
        );
        assert!(
            !worker.contains(&key),
            "the worker's config has the {name} key:\n{worker}"
        );
    }
    assert!(
        !worker.contains("key:"),
        "no key field in a worker's config:\n{worker}"
    );
    let cp = Config::from_yaml(&cp).unwrap();
    let api = cp.cluster().unwrap().api_server.as_ref().unwrap();
    assert_eq!(api.cert_sans, ["10.5.0.2"]);
    assert_eq!(
        api.image.as_deref(),
        Some("registry.k8s.io/kube-apiserver:v1.33.1")
    );
    assert_eq!(cp.cluster().unwrap().cluster_name.as_deref(), Some("demo"));
}

#[test]
fn configs_from_upstreams_bundle_validate_and_a_worker_gets_no_key() {
    check(&Bundle::from_yaml(UPSTREAM).unwrap());
}

#[test]
fn configs_from_a_generated_bundle_validate_and_a_worker_gets_no_key() {
    check(&Bundle::generate(SystemTime::now()).unwrap());
}

#[test]
fn bad_inputs_are_refused() {
    let bundle = Bundle::from_yaml(UPSTREAM).unwrap();
    for endpoint in ["10.5.0.2:6443", "https://", "https://:6443", ""] {
        let err =
            generate(&Input::new("demo", endpoint, &bundle), MachineType::Worker).unwrap_err();
        assert!(
            matches!(&err, GenerateError::Input(m) if m.contains("invalid control plane endpoint")),
            "{endpoint}: {err}"
        );
    }
    let err = generate(
        &Input::new("", "https://a:6443", &bundle),
        MachineType::Worker,
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "the cluster name is empty");
    let mut broken = bundle.clone();
    broken.trustdinfo = None;
    let err = generate(
        &Input::new("demo", "https://a:6443", &broken),
        MachineType::Worker,
    )
    .unwrap_err();
    assert!(err.to_string().contains("trustdinfo is required"), "{err}");
    // IPv6 endpoints: the host is in the SANs without brackets.
    let cp = generate(
        &Input::new("demo", "https://[fd00::2]:6443", &bundle),
        MachineType::ControlPlane,
    )
    .unwrap();
    assert_eq!(
        cp.cluster().unwrap().api_server.as_ref().unwrap().cert_sans,
        ["fd00::2"]
    );
}
