//! `talosctl config endpoint|node|add|remove|merge|contexts|info` on talosconfig files,
//! through the real binary, as upstream's talosctl changes them.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

fn talosctl(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talosctl"))
        .arg("--talosconfig")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run talosctl")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err(out: &Output) -> String {
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn yaml(path: &Path) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn contexts_are_added_pointed_merged_and_removed_as_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("talosconfig");
    // A client certificate of a fresh bundle, as files.
    let bundle = machinery::secrets::Bundle::generate(SystemTime::now()).unwrap();
    let c = bundle
        .client_certificate(
            &["os:operator".to_string()],
            SystemTime::now(),
            Duration::from_secs(3 * 86_400),
        )
        .unwrap();
    let (crt, key) = c.pem().unwrap();
    let (ca, _) = bundle.os_ca().unwrap();
    for (name, text) in [("ca.crt", ca.to_pem()), ("c.crt", crt), ("c.key", key)] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();

    // crt without key is refused, and nothing is written.
    let e = err(&talosctl(
        &config,
        &["config", "add", "prod", "--crt", &p("c.crt")],
    ));
    assert!(e.contains("both are required"), "{e}");
    assert!(!config.exists());
    ok(&talosctl(
        &config,
        &[
            "config",
            "add",
            "prod",
            "--ca",
            &p("ca.crt"),
            "--crt",
            &p("c.crt"),
            "--key",
            &p("c.key"),
        ],
    ));
    // Not current yet: setting endpoints needs a current context (or --context).
    let e = err(&talosctl(&config, &["config", "endpoint", "10.0.0.1"]));
    assert!(e.contains("no current context"), "{e}");
    ok(&talosctl(&config, &["config", "context", "prod"]));
    ok(&talosctl(
        &config,
        &["config", "endpoints", " 10.0.0.1 ", "10.0.0.2"],
    ));
    ok(&talosctl(&config, &["config", "nodes", "10.0.0.5"]));
    let y = yaml(&config);
    assert_eq!(y["context"], "prod");
    assert_eq!(
        y["contexts"]["prod"]["endpoints"],
        serde_yaml_ng::to_value(["10.0.0.1", "10.0.0.2"]).unwrap()
    );
    assert_eq!(
        y["contexts"]["prod"]["nodes"],
        serde_yaml_ng::to_value(["10.0.0.5"]).unwrap()
    );

    let text = ok(&talosctl(&config, &["config", "info"]));
    assert!(text.contains("Current context:     prod\n"), "{text}");
    assert!(
        text.contains("Endpoints:           10.0.0.1, 10.0.0.2\n"),
        "{text}"
    );
    assert!(
        text.contains("Roles:               os:operator\n"),
        "{text}"
    );
    assert!(
        text.contains("Certificate expires: 2 days from now ("),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&talosctl(&config, &["config", "info", "-o", "json"]))).unwrap();
    assert_eq!(json["roles"], serde_json::json!(["os:operator"]));
    assert_eq!(json["certTTL"], "2 days from now");
    let e = err(&talosctl(&config, &["config", "info", "-o", "xml"]));
    assert!(e.contains("unknown output format: \"xml\""), "{e}");

    // Merge: a clashing name is renamed, the other file's current context becomes current.
    let other = dir.path().join("other");
    std::fs::write(
        &other,
        "context: prod\ncontexts:\n  prod:\n    endpoints: [192.0.2.1]\n  staging:\n    endpoints: [192.0.2.2]\n",
    )
    .unwrap();
    let out = talosctl(&config, &["config", "merge", &other.to_string_lossy()]);
    ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("renamed talosconfig context \"prod\" -> \"prod-1\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let y = yaml(&config);
    assert_eq!(y["context"], "prod-1");
    assert_eq!(
        y["contexts"]["prod-1"]["endpoints"],
        serde_yaml_ng::to_value(["192.0.2.1"]).unwrap()
    );
    let list = ok(&talosctl(&config, &["config", "contexts"]));
    assert!(
        list.lines()
            .any(|l| l.starts_with('*') && l.contains("prod-1")),
        "{list}"
    );

    // Remove by pattern: the current context is skipped, the others go (-y: no question).
    let out = talosctl(&config, &["config", "remove", "prod*", "--dry-run", "-y"]);
    ok(&out);
    assert_eq!(yaml(&config)["contexts"].as_mapping().unwrap().len(), 3);
    let out = talosctl(&config, &["config", "remove", "prod*", "-y"]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.contains("skipping removal of current context \"prod-1\""),
        "{stderr}"
    );
    assert!(stderr.contains("removing context \"prod\""), "{stderr}");
    let y = yaml(&config);
    let names: Vec<&str> = y["contexts"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["prod-1", "staging"]);
    // Without -y and no answer on stdin, nothing is removed.
    ok(&talosctl(&config, &["config", "remove", "staging"]));
    assert_eq!(yaml(&config)["contexts"].as_mapping().unwrap().len(), 2);
    let e = err(&talosctl(&config, &["config", "remove", "nope*"]));
    assert!(e.contains("no contexts matched \"nope*\""), "{e}");
    let e = err(&talosctl(&config, &["config", "context", "gone"]));
    assert!(e.contains("context \"gone\" is not defined"), "{e}");
}
