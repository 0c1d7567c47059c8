//! `talosctl gen secrets` and `talosctl gen config`, run as a user runs them: files and their
//! modes, upstream's bundle taken as is, a worker's config without any key, patches per role,
//! and nothing written when anything is wrong.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use machinery::config::{Config, ValidationMode};
use machinery::secrets::Bundle;

const UPSTREAM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../machinery/tests/data/upstream-secrets.yaml"
);
const UPSTREAM_INVALID: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../machinery/tests/data/upstream-invalid-secrets.yaml"
);

fn talosctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talosctl"))
        .current_dir(dir)
        .args(args)
        .env_remove("TALOSCONFIG")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "talosctl failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "talosctl succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn gen_secrets_writes_a_private_bundle_and_never_overwrites_without_force() {
    let dir = tempfile::tempdir().unwrap();
    ok(&talosctl(dir.path(), &["gen", "secrets"]));
    let path = dir.path().join("secrets.yaml");
    assert_eq!(mode(&path), 0o600);
    let first = std::fs::read_to_string(&path).unwrap();
    Bundle::from_yaml(&first).unwrap().validate().unwrap();
    let err = failed(&talosctl(dir.path(), &["gen", "secrets"]));
    assert!(err.contains("already exists, use --force"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), first, "unchanged");
    ok(&talosctl(
        dir.path(),
        &["gen", "secrets", "--force", "-o", "secrets.yaml"],
    ));
    assert_ne!(
        std::fs::read_to_string(&path).unwrap(),
        first,
        "a new bundle"
    );
}

#[test]
fn gen_config_from_upstreams_bundle_writes_upstreams_layout() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = ok(&talosctl(
        dir.path(),
        &[
            "gen",
            "config",
            "demo",
            "https://10.5.0.2:6443",
            "--with-secrets",
            UPSTREAM,
            "-o",
            "out",
            "--config-patch",
            r#"{"machine": {"sysctls": {"vm.swappiness": "1"}}}"#,
            "--config-patch-worker",
            "machine:\n  nodeLabels:\n    role: worker\n",
        ],
    ));
    let out = dir.path().join("out");
    for f in ["controlplane.yaml", "worker.yaml", "talosconfig"] {
        assert!(stdout.contains(&format!("created out/{f}")), "{stdout}");
        assert_eq!(mode(&out.join(f)), 0o600, "{f}");
    }
    let bundle = Bundle::from_yaml(&std::fs::read_to_string(UPSTREAM).unwrap()).unwrap();
    let os = bundle.certs.as_ref().unwrap().os.as_ref().unwrap();
    let cp = Config::from_yaml(&std::fs::read_to_string(out.join("controlplane.yaml")).unwrap())
        .unwrap();
    let worker_text = std::fs::read_to_string(out.join("worker.yaml")).unwrap();
    let worker = Config::from_yaml(&worker_text).unwrap();
    for c in [&cp, &worker] {
        c.validate(ValidationMode::Metal).unwrap();
        assert_eq!(
            c.machine().unwrap().sysctls["vm.swappiness"],
            "1",
            "common patch"
        );
        assert_eq!(
            c.machine().unwrap().token.as_deref(),
            Some("oamejv.9tk1nhuwnlc2nghf")
        );
    }
    assert_eq!(worker.machine().unwrap().node_labels["role"], "worker");
    assert!(!cp.machine().unwrap().node_labels.contains_key("role"));
    assert_eq!(
        cp.machine().unwrap().ca.as_ref().unwrap().key,
        Some(os.key.clone())
    );
    assert!(worker.machine().unwrap().ca.as_ref().unwrap().key.is_none());
    assert!(!worker_text.contains("key:"), "{worker_text}");

    // The talosconfig: upstream's format, the OS CA, an os:admin certificate of that CA.
    let tc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(out.join("talosconfig")).unwrap())
            .unwrap();
    assert_eq!(tc["context"], "demo");
    let ctx = &tc["contexts"]["demo"];
    assert_eq!(ctx["endpoints"][0], "127.0.0.1");
    assert_eq!(ctx["ca"].as_str(), Some(os.crt.as_str()));
    let client = machinery::secrets::CertAndKey {
        crt: ctx["crt"].as_str().unwrap().into(),
        key: ctx["key"].as_str().unwrap().into(),
    };
    client.parse().unwrap();

    // gen secrets --from-controlplane-config gives the bundle back.
    ok(&talosctl(
        dir.path(),
        &[
            "gen",
            "secrets",
            "--from-controlplane-config",
            "out/controlplane.yaml",
        ],
    ));
    let back =
        Bundle::from_yaml(&std::fs::read_to_string(dir.path().join("secrets.yaml")).unwrap())
            .unwrap();
    assert_eq!(back, bundle);
    // A worker's config holds no CA key: it is no source of a bundle.
    let err = failed(&talosctl(
        dir.path(),
        &[
            "gen",
            "secrets",
            "--force",
            "--from-controlplane-config",
            "out/worker.yaml",
        ],
    ));
    assert!(
        err.contains("does not hold a control plane's secrets"),
        "{err}"
    );
    assert!(err.contains("certs.os is invalid"), "{err}");
}

#[test]
fn gen_config_writes_nothing_when_anything_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "gen",
        "config",
        "demo",
        "https://10.5.0.2:6443",
        "-o",
        "out",
    ];
    // A bundle with missing parts: every part named.
    let mut args = base.to_vec();
    args.extend(["--with-secrets", UPSTREAM_INVALID]);
    let err = failed(&talosctl(dir.path(), &args));
    for part in [
        "6 errors occurred",
        "cluster.secret is required",
        "trustdinfo is required",
        "certs.k8saggregator is required",
        "certs.os is invalid: unsupported key type: \"CERTIFICATE\"",
    ] {
        assert!(err.contains(part), "{part} in {err}");
    }
    // A patch that makes the worker invalid: nothing of the three files is written.
    let mut args = base.to_vec();
    args.extend(["--config-patch-worker", "machine:\n  type: nonsense\n"]);
    let err = failed(&talosctl(dir.path(), &args));
    assert!(err.contains("the worker configuration is invalid"), "{err}");
    // A patch that does not parse.
    let mut args = base.to_vec();
    args.extend(["--config-patch", "@does-not-exist.yaml"]);
    let err = failed(&talosctl(dir.path(), &args));
    assert!(err.contains("cannot read patch"), "{err}");
    let mut args = base.to_vec();
    args.extend(["--output-types", "controlplane,kubeconfig"]);
    let err = failed(&talosctl(dir.path(), &args));
    assert!(err.contains("unknown output type \"kubeconfig\""), "{err}");
    let err = failed(&talosctl(
        dir.path(),
        &["gen", "config", "demo", "10.5.0.2:6443"],
    ));
    assert!(err.contains("invalid control plane endpoint"), "{err}");
    assert!(!dir.path().join("out").exists(), "nothing written");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    // One output type to standard output.
    let stdout = ok(&talosctl(
        dir.path(),
        &[
            "gen",
            "config",
            "demo",
            "https://10.5.0.2:6443",
            "--with-secrets",
            UPSTREAM,
            "-t",
            "worker",
            "-o",
            "-",
        ],
    ));
    Config::from_yaml(&stdout)
        .unwrap()
        .validate(ValidationMode::Metal)
        .unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
