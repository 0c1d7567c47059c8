//! `talosctl validate` and `talosctl machineconfig patch`: offline operations on machine
//! configuration files, run through the real binary.

use std::path::Path;
use std::process::{Command, Output};

const WORKER: &str = include_str!("testdata/worker.yaml");

fn talosctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talosctl"))
        .args(args)
        .output()
        .expect("run talosctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write test file");
    path.to_str().expect("UTF-8 temporary path").to_string()
}

/// The v1alpha1 document alone (JSON patches need a single-document configuration).
fn single_document() -> String {
    let (first, _) = WORKER
        .split_once("\n---\n")
        .expect("worker.yaml has two documents");
    format!("{first}\n")
}

#[test]
fn valid_config_is_reported_valid() {
    let dir = tempfile::tempdir().unwrap();
    // Strict: the v1alpha1 document alone (the sample's HostnameConfig is not applied by
    // talos-rs, a warning, see below).
    let file = write(dir.path(), "worker.yaml", &single_document());
    for mode in ["metal", "cloud", "container"] {
        let out = talosctl(&["validate", "--config", &file, "--mode", mode, "--strict"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            format!("{file} is valid for {mode} mode\n")
        );
    }
    // The mode defaults to metal.
    let out = talosctl(&["validate", "-c", &file]);
    assert_eq!(
        text(&out.stdout),
        format!("{file} is valid for metal mode\n")
    );
}

#[test]
fn settings_not_applied_are_warnings_and_fail_strict() {
    let dir = tempfile::tempdir().unwrap();
    let config = single_document().replace(
        "    network: {}\n",
        "    network:\n        interfaces:\n            - interface: wg0\n              addresses: [10.10.0.1/24]\n              wireguard:\n                  privateKey: GA1E1VB+g41Dl0+UH2TMW9C5953y+moVg6JIIqkJbmw=\n            - interface: eth0\n              dhcp: true\n              dhcpOptions: {ipv6: true}\n",
    ) + "---\napiVersion: v1alpha1\nkind: RoutingRuleConfig\nname: \"1000\"\ntable: 100\n";
    let file = write(dir.path(), "wg.yaml", &config);
    let out = talosctl(&["validate", "--config", &file, "--mode", "container"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{file} is valid for container mode\n")
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("warning: machine.network.interfaces[0].wireguard: not applied by talos-rs: WireGuard links are not supported"),
        "{err}"
    );
    assert!(
        err.contains("warning: v1alpha1/RoutingRuleConfig/1000: not applied by talos-rs: routing rules are not supported"),
        "{err}"
    );
    assert!(!err.contains("interfaces[1]"), "DHCPv6 is applied: {err}");
    let out = talosctl(&[
        "validate",
        "--config",
        &file,
        "--mode",
        "container",
        "--strict",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("2 problems"), "{err}");
    assert!(
        err.contains("machine.network.interfaces[0].wireguard: warning: not applied"),
        "{err}"
    );
}

#[test]
fn every_problem_is_printed_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    // Validation problems.
    let bad = WORKER
        .replace("    type: worker", "    type: wrker")
        .replace("endpoint: https://10.5.0.2:6443", "endpoint: 10.5.0.2:6443");
    let file = write(dir.path(), "bad.yaml", &bad);
    let out = talosctl(&["validate", "--config", &file, "--mode", "cloud"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.contains("is not valid for cloud mode"), "{err}");
    assert!(err.contains("machine.type: "), "{err}");
    assert!(err.contains("cluster.controlPlane.endpoint: "), "{err}");

    // Decoding problems: unknown fields anywhere.
    let bad = WORKER
        .replace("dnsDomain:", "dnsDomian:")
        .replace("        wipe: false", "        wype: false");
    let file = write(dir.path(), "typos.yaml", &bad);
    let out = talosctl(&["validate", "--config", &file]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cluster.network.dnsDomian"), "{err}");
    assert!(err.contains("machine.install.wype"), "{err}");

    // A missing file.
    let out = talosctl(&["validate", "--config", "/nonexistent/x.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/x.yaml"));

    // An unknown mode is a usage error.
    let out = talosctl(&["validate", "--config", &file, "--mode", "moon"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn strategic_merge_patch_from_file_and_inline() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "worker.yaml", WORKER);
    let patch = write(
        dir.path(),
        "hostname.yaml",
        "machine:\n  network:\n    hostname: worker-1\n",
    );
    let out = talosctl(&[
        "machineconfig",
        "patch",
        &file,
        "--patch",
        &format!("@{patch}"),
        "-p",
        "machine: {env: {FOO: bar}}",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let patched = text(&out.stdout);
    let docs: Vec<serde_yaml_ng::Value> = patched
        .split("---\n")
        .map(|d| serde_yaml_ng::from_str(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{patched}");
    assert_eq!(docs[0]["machine"]["network"]["hostname"], "worker-1");
    assert_eq!(docs[0]["machine"]["env"]["FOO"], "bar");
    assert_eq!(docs[0]["machine"]["install"]["disk"], "/dev/sda");
    assert_eq!(docs[1]["kind"], "HostnameConfig");

    // The result is a valid configuration (with a warning: talos-rs does not apply the
    // HostnameConfig document).
    let result = write(dir.path(), "result.yaml", &patched);
    let out = talosctl(&["validate", "--config", &result]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("warning: v1alpha1/HostnameConfig: not applied by talos-rs"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn json6902_patch_to_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "single.yaml", &single_document());
    let output = dir.path().join("out.yaml");
    let out = talosctl(&[
        "mc",
        "patch",
        &file,
        "-p",
        r#"[{"op": "replace", "path": "/machine/install/disk", "value": "/dev/vda"}]"#,
        "-p",
        "- op: add\n  path: /machine/env\n  value: {A: b}\n",
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let patched: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(patched["machine"]["install"]["disk"], "/dev/vda");
    assert_eq!(patched["machine"]["env"]["A"], "b");
    assert_eq!(patched["cluster"]["network"]["dnsDomain"], "cluster.local");
}

#[test]
fn invalid_patch_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "single.yaml", &single_document());
    let output = dir.path().join("out.yaml");
    let cases = [
        // Not a valid strategic merge patch: unknown field.
        "machine: {netwrk: {hostname: x}}",
        // A valid JSON patch whose result does not decode.
        r#"[{"op": "add", "path": "/machine/bogus", "value": 1}]"#,
        // A JSON patch whose operation fails.
        r#"[{"op": "remove", "path": "/machine/nothing"}]"#,
        // A patch file that does not exist.
        "@/nonexistent/patch.yaml",
    ];
    for patch in cases {
        let out = talosctl(&[
            "machineconfig",
            "patch",
            &file,
            "-p",
            patch,
            "-o",
            output.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{patch}");
        assert!(!text(&out.stderr).is_empty());
        assert!(!output.exists(), "{patch}: output written");
        // No temporary file left behind either.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("single.yaml")], "{patch}");
    }
    let out = talosctl(&[
        "machineconfig",
        "patch",
        &file,
        "-p",
        "machine: {netwrk: {hostname: x}}",
    ]);
    let err = text(&out.stderr);
    assert!(err.contains("machine.netwrk"), "{err}");
}
