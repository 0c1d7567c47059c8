//! Validation of machine configurations: the samples are valid, and every problem is listed with
//! its path.

use machinery::config::{Config, ConfigErrors, ValidationMode, Warning};

const CONTROLPLANE: &str = include_str!("../testdata/controlplane.yaml");
const WORKER: &str = include_str!("../testdata/worker.yaml");
const NETWORK: &str = include_str!("../testdata/network.yaml");

fn decode(text: &str) -> Config {
    match Config::from_yaml(text) {
        Ok(cfg) => cfg,
        Err(e) => panic!("decode failed:\n{e}"),
    }
}

fn validate(text: &str, mode: ValidationMode) -> Result<Vec<Warning>, ConfigErrors> {
    decode(text).validate(mode)
}

fn invalid(text: &str, mode: ValidationMode) -> ConfigErrors {
    match validate(text, mode) {
        Ok(w) => panic!("expected validation errors, got warnings {w:?}"),
        Err(e) => e,
    }
}

fn paths(errs: &ConfigErrors) -> Vec<&str> {
    errs.errors.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn samples_are_valid_in_every_mode() {
    // Valid, with a warning for every setting talos-rs accepts but does not apply (a layer 2
    // VIP is applied: not listed).
    for (sample, unapplied) in [
        (CONTROLPLANE, &["v1alpha1/HostnameConfig"][..]),
        (WORKER, &["v1alpha1/HostnameConfig"][..]),
        (
            NETWORK,
            &[
                "machine.network.interfaces[3].wireguard",
                "machine.network.kubespan",
                "v1alpha1/WireguardConfig/wg1",
                "v1alpha1/TCPProbeConfig/gw-check",
            ][..],
        ),
    ] {
        for mode in [
            ValidationMode::Metal,
            ValidationMode::Cloud,
            ValidationMode::Container,
        ] {
            let warnings = validate(sample, mode).unwrap_or_else(|e| panic!("{mode}: {e}"));
            let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
            assert_eq!(paths, unapplied, "{warnings:?}");
            assert!(
                warnings
                    .iter()
                    .all(|w| w.message.starts_with("not applied by talos-rs: ")),
                "{warnings:?}"
            );
        }
    }
}

#[test]
fn unapplied_settings_fail_strict_validation() {
    let errs = decode(NETWORK)
        .validate_strict(ValidationMode::Metal)
        .expect_err("strict");
    let all = errs.to_string();
    assert!(
        all.contains("machine.network.interfaces[3].wireguard: warning: not applied by talos-rs: WireGuard links are not supported"),
        "{all}"
    );
}

#[test]
fn an_unusable_duid_is_a_warning() {
    let text = NETWORK.replace(
        "dhcpOptions: {ipv4: true, ipv6: true}",
        "dhcpOptions: {ipv4: true, ipv6: true, duidv6: \"zz:01\"}",
    );
    let warnings = validate(&text, ValidationMode::Metal).expect("valid");
    let w = warnings
        .iter()
        .find(|w| w.path == "machine.network.interfaces[1].dhcpOptions.duidv6")
        .unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(w.message.contains("not a valid DUID"), "{w}");
    let text = NETWORK.replace(
        "dhcpOptions: {ipv4: true, ipv6: true}",
        "dhcpOptions: {ipv4: true, ipv6: true, duidv6: \"00:03:00:01:02:00:00:00:00:09\"}",
    );
    let warnings = validate(&text, ValidationMode::Metal).expect("valid");
    assert!(
        !warnings.iter().any(|w| w.path.ends_with("duidv6")),
        "{warnings:?}"
    );
}

#[test]
fn install_disk_is_required_on_metal_only() {
    let text = CONTROLPLANE.replace(
        "        disk: /dev/sda # The disk used for installations.\n",
        "",
    );
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(paths(&errs), ["machine.install.disk"]);
    assert!(validate(&text, ValidationMode::Container).is_ok());
    assert!(validate(&text, ValidationMode::Cloud).is_ok());
}

#[test]
fn all_validation_errors_are_listed() {
    let text = CONTROLPLANE
        .replace("persist: true", "persist: false")
        .replace("endpoint: https://10.5.0.2:6443", "endpoint: 10.5.0.2:6443")
        .replace("dnsDomain: cluster.local", "dnsDomain: -cluster..local")
        .replace("            - 10.244.0.0/16", "            - 10.244.0.0/33")
        .replace(
            "    inlineManifests: []",
            "    inlineManifests:\n        - {name: a, contents: x}\n        - {name: a, contents: y}\n    externalCloudProvider:\n        manifests: [https://example.com/ccm.yaml]",
        )
        + "---\n";
    let text = text.replace(
        "    network: {}\n",
        "    network:\n        interfaces:\n            - interface: eth0\n              mtu: 20\n              addresses: [10.0.0.300/24]\n              routes:\n                - network: 10.0.0.0\n                  gateway: nope\n              vlans:\n                - vlanId: 5000\n            - interface: bond0\n              bond: {mode: 802.3ad, interfaces: [eth1]}\n              bridge: {interfaces: [eth2]}\n            - interface: bond1\n              bond: {mode: active-backup, interfaces: [eth1]}\n            - dhcp: true\n",
    );
    let errs = invalid(&text, ValidationMode::Metal);
    let got = paths(&errs);
    for expected in [
        "persist",
        "cluster.controlPlane.endpoint",
        "cluster.network.dnsDomain",
        "cluster.network.podSubnets[0]",
        "cluster.externalCloudProvider.manifests",
        "cluster.inlineManifests[1].name",
        "machine.network.interfaces[1]",
        "machine.network.interfaces[2].bond.interfaces[0]",
        "machine.network.interfaces[0].addresses[0]",
        "machine.network.interfaces[0].routes[0].network",
        "machine.network.interfaces[0].routes[0].gateway",
        "machine.network.interfaces[0].mtu",
        "machine.network.interfaces[0].vlans[0].vlanId",
        "machine.network.interfaces[3]",
    ] {
        assert!(got.contains(&expected), "missing {expected} in:\n{errs}");
    }
    assert_eq!(errs.to_string().lines().count(), errs.len());
    let text = errs.to_string();
    assert!(
        text.contains("persist: persist should be enabled"),
        "{text}"
    );
    assert!(
        text.contains("inline manifest name \"a\" is duplicate"),
        "{text}"
    );
    assert!(
        text.contains(
            "interface \"eth1\" is declared as part of two separate links: \"bond0\" and \"bond1\""
        ),
        "{text}"
    );
    assert!(
        text.contains("vlan ID 5000 is out of range 1..4095"),
        "{text}"
    );
    assert!(
        text.contains("has both bridge and bond sections set"),
        "{text}"
    );
}

#[test]
fn worker_must_not_carry_control_plane_secrets() {
    let text = WORKER
        .replace("        key: \"\"\n    # Extra", "        key: Zm9v\n    # Extra")
        .replace(
            "    network: {}\n",
            "    network:\n        interfaces:\n            - interface: eth0\n              dhcp: true\n              vip: {ip: 10.5.0.100}\n",
        )
        + "";
    let text = text.replacen(
        "    discovery:",
        "    etcd:\n        ca: {crt: Zm9v, key: Zm9v}\n    discovery:",
        1,
    );
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        [
            "machine.ca.key",
            "machine.network.interfaces[0].vip",
            "cluster.etcd"
        ],
        "{errs}"
    );
}

#[test]
fn control_plane_needs_ca_key() {
    let mut cfg = decode(CONTROLPLANE);
    if let Some(ca) = cfg
        .v1alpha1
        .as_mut()
        .and_then(|d| d.machine.as_mut())
        .and_then(|m| m.ca.as_mut())
    {
        ca.key = None;
    }
    let errs = cfg
        .validate(ValidationMode::Metal)
        .expect_err("key required");
    assert_eq!(paths(&errs), ["machine.ca.key"]);
}

#[test]
fn unknown_machine_type_and_cni_are_errors_init_is_a_warning() {
    let errs = invalid(
        &CONTROLPLANE.replace("type: controlplane", "type: master"),
        ValidationMode::Metal,
    );
    assert!(paths(&errs).contains(&"machine.type"), "{errs}");

    let warnings = validate(
        &CONTROLPLANE.replace("type: controlplane", "type: init"),
        ValidationMode::Metal,
    )
    .expect("init is accepted");
    // The other one: the sample's HostnameConfig, not applied by talos-rs.
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert_eq!(warnings[0].path, "machine.type");

    let cfg = decode(&CONTROLPLANE.replace("type: controlplane", "type: init"));
    let errs = cfg
        .validate_strict(ValidationMode::Metal)
        .expect_err("strict");
    assert!(
        errs.to_string().contains("warning: use \"controlplane\""),
        "{errs}"
    );

    let text = CONTROLPLANE.replace(
        "        dnsDomain: cluster.local",
        "        cni:\n            name: calico\n        dnsDomain: cluster.local",
    );
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(paths(&errs), ["cluster.network.cni.name"]);
}

#[test]
fn missing_sections_are_errors() {
    let errs = invalid(
        "version: v1alpha1\ncluster: {}\n",
        ValidationMode::Container,
    );
    assert_eq!(paths(&errs), ["machine"]);
    let errs = invalid(
        "version: v1alpha1\nmachine:\n  type: worker\n  ca: {crt: Zm9v}\n",
        ValidationMode::Container,
    );
    assert_eq!(paths(&errs), ["cluster"]);
    let errs = invalid(
        "version: v1alpha1\nmachine:\n  type: worker\n  ca: {crt: Zm9v}\ncluster:\n  controlPlane: {}\n",
        ValidationMode::Container,
    );
    assert_eq!(paths(&errs), ["cluster.controlPlane.endpoint"]);
    let errs = invalid(
        "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n",
        ValidationMode::Container,
    );
    assert_eq!(paths(&errs), ["machine"]);
}

#[test]
fn network_sample_errors_when_broken() {
    let text = NETWORK
        .replace("          miimon: 100\n", "")
        .replace(
            "privateKey: GA1E1VB+g41Dl0+UH2TMW9C5953y+moVg6JIIqkJbmw=\n          listenPort",
            "privateKey: c2hvcnQ=\n          listenPort",
        )
        .replace(
            "    nameservers: [10.0.0.53, 1.1.1.1]",
            "    nameservers: [10.0.0.53, one]",
        );
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        [
            "machine.network.nameservers[1]",
            "machine.network.interfaces[0].bond.updelay",
            "machine.network.interfaces[0].bond.downdelay",
            "machine.network.interfaces[3].wireguard.privateKey",
        ],
        "{errs}"
    );
}

#[test]
fn kubespan_requires_discovery() {
    let text = NETWORK.replace("  discovery:\n    enabled: true\n", "");
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(paths(&errs), ["cluster.discovery.enabled"]);
}

#[test]
fn node_labels_and_taints_are_checked() {
    let text = CONTROLPLANE.replace(
        "        node.kubernetes.io/exclude-from-external-load-balancers: \"\"\n",
        "        node.kubernetes.io/exclude-from-external-load-balancers: \"\"\n        bad key: x\n    nodeTaints:\n        dedicated: gpu:Sometimes\n",
    );
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        [
            "machine.nodeLabels[\"bad key\"]",
            "machine.nodeTaints.dedicated"
        ],
        "{errs}"
    );
}

#[test]
fn kernel_modules_are_said_unapplied_in_container_mode_only() {
    assert!(CONTROLPLANE.contains("\nmachine:\n"));
    let text = CONTROLPLANE.replacen(
        "\nmachine:\n",
        "\nmachine:\n    kernel:\n        modules:\n            - name: br_netfilter\n",
        1,
    );
    let container = validate(&text, ValidationMode::Container).unwrap();
    let w = container
        .iter()
        .find(|w| w.path == "machine.kernel.modules")
        .unwrap_or_else(|| panic!("no warning: {container:?}"));
    assert!(w.message.contains("container mode"), "{w:?}");
    let metal = validate(&text, ValidationMode::Metal).unwrap();
    assert!(
        !metal.iter().any(|w| w.path == "machine.kernel.modules"),
        "{metal:?}"
    );
}

#[test]
fn etcd_extra_args_may_not_override_a_pinned_flag_and_an_image_is_said_unapplied() {
    let text = CONTROLPLANE.replacen(
        "        # image: gcr.io/etcd-development/etcd:v3.5.21\n",
        "        image: gcr.io/etcd-development/etcd:v3.5.21\n        extraArgs:\n            client-cert-auth: \"false\"\n            data-dir: /tmp/x\n            election-timeout: \"5000\"\n            advertise-client-urls: https://10.0.0.1:2379\n",
        1,
    );
    assert_ne!(text, CONTROLPLANE, "the sample's etcd section moved");
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        [
            "cluster.etcd.extraArgs.client-cert-auth",
            "cluster.etcd.extraArgs.data-dir"
        ],
        "{errs}"
    );
    let allowed = text
        .replace("            client-cert-auth: \"false\"\n", "")
        .replace("            data-dir: /tmp/x\n", "");
    let warnings = validate(&allowed, ValidationMode::Metal).unwrap();
    assert!(
        warnings.iter().any(|w| w.path == "cluster.etcd.image"),
        "{warnings:?}"
    );
}

#[test]
fn control_plane_extra_args_may_not_override_a_pinned_flag() {
    let text = CONTROLPLANE
        .replacen(
            "        image: registry.k8s.io/kube-apiserver:v1.33.1 # The container image used in the API server manifest.\n",
            "        image: registry.k8s.io/kube-apiserver:v1.33.1\n        extraArgs:\n            etcd-servers: https://evil:2379\n            tls-min-version: VersionTLS10\n            feature-gates: Foo=true\n",
            1,
        )
        .replacen(
            "        image: registry.k8s.io/kube-scheduler:v1.33.1 # The container image used in the scheduler manifest.\n",
            "        image: registry.k8s.io/kube-scheduler:v1.33.1\n        extraArgs:\n            kubeconfig: /tmp/mine\n",
            1,
        );
    assert_ne!(
        text, CONTROLPLANE,
        "the sample's control plane sections moved"
    );
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        [
            "cluster.apiServer.extraArgs.etcd-servers",
            "cluster.apiServer.extraArgs.tls-min-version",
            "cluster.scheduler.extraArgs.kubeconfig"
        ],
        "{errs}"
    );
}

#[test]
fn authorization_by_flags_and_an_authorization_config_are_one_or_the_other() {
    let api = "        image: registry.k8s.io/kube-apiserver:v1.33.1 # The container image used in the API server manifest.\n";
    let config =
        "        authorizationConfig:\n            - type: Webhook\n              name: webhook\n";
    let both = CONTROLPLANE.replacen(
        api,
        &format!("        image: registry.k8s.io/kube-apiserver:v1.33.1\n        extraArgs:\n            authorization-mode: Webhook\n{config}"),
        1,
    );
    assert_ne!(both, CONTROLPLANE, "the sample's apiServer section moved");
    let errs = invalid(&both, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        ["cluster.apiServer.authorizationConfig"],
        "{errs}"
    );
    // Either alone is valid; the configuration alone is said not to be applied.
    let flags = CONTROLPLANE.replacen(
        api,
        "        image: registry.k8s.io/kube-apiserver:v1.33.1\n        extraArgs:\n            authorization-mode: Webhook\n",
        1,
    );
    Config::from_yaml(&flags)
        .unwrap()
        .validate(ValidationMode::Metal)
        .unwrap();
    let alone = CONTROLPLANE.replacen(
        api,
        &format!("        image: registry.k8s.io/kube-apiserver:v1.33.1\n{config}"),
        1,
    );
    let warnings = Config::from_yaml(&alone)
        .unwrap()
        .validate(ValidationMode::Metal)
        .unwrap();
    assert!(
        warnings.iter().any(|w| w
            .to_string()
            .contains("cluster.apiServer.authorizationConfig")),
        "{warnings:?}"
    );
}

#[test]
fn kubelet_extra_args_and_config_may_not_touch_what_the_node_pins() {
    let text = CONTROLPLANE.replacen(
        "        defaultRuntimeSeccompProfileEnabled: true # Enable container runtime default Seccomp profile.\n",
        "        defaultRuntimeSeccompProfileEnabled: true\n        extraArgs:\n            kubeconfig: /tmp/mine\n            v: \"2\"\n        extraConfig:\n            port: 1234\n            serializeImagePulls: true\n",
        1,
    );
    assert_ne!(text, CONTROLPLANE, "the sample's kubelet section moved");
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        [
            "machine.kubelet.extraConfig.port",
            "machine.kubelet.extraArgs.kubeconfig"
        ],
        "{errs}"
    );
}

#[test]
fn kube_proxy_may_not_be_given_another_kubeconfig_and_unrendered_manifests_are_said() {
    let text = CONTROLPLANE
        .replacen(
            "        image: registry.k8s.io/kube-proxy:v1.33.1 # The container image used in the kube-proxy manifest.\n",
            "        image: registry.k8s.io/kube-proxy:v1.33.1\n        extraArgs:\n            kubeconfig: /tmp/mine\n            v: \"2\"\n",
            1,
        );
    assert_ne!(text, CONTROLPLANE, "the sample's proxy section moved");
    let errs = invalid(&text, ValidationMode::Metal);
    assert_eq!(
        paths(&errs),
        ["cluster.proxy.extraArgs.kubeconfig"],
        "{errs}"
    );

    let text = CONTROLPLANE.replacen(
        "    extraManifests: []",
        "    extraManifests: [\"https://example.com/x.yaml\"]",
        1,
    );
    assert_ne!(text, CONTROLPLANE, "the sample's extraManifests moved");
    let warnings = validate(&text, ValidationMode::Metal).unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.path == "cluster.extraManifests" && w.message.contains("not applied")),
        "{warnings:?}"
    );
}
