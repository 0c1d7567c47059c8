//! `talosctl get` against a real in-process stated: type resolution through ResourceDefinitions,
//! table/YAML/JSON output of a type talosctl was not compiled with, missing resources, watches.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};
use stated::testing::Harness;
use tokio::sync::mpsc;

/// A made-up type with a resource definition (alias `wdg`, two print columns).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WidgetSpec {
    size: u32,
    tags: Vec<String>,
    display_name: String,
}

impl ResourceSpec for WidgetSpec {
    const TYPE: &'static str = "Widgets.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "test";

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, Self::DEFAULT_NAMESPACE)
            .with_aliases(&["wdg"])
            .with_columns(&[("Size", "{.size}"), ("Tags", "{.tags[*]}")])
    }
}

/// A made-up type without any resource definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct GadgetSpec {
    color: String,
    parts: Vec<u32>,
}

impl ResourceSpec for GadgetSpec {
    const TYPE: &'static str = "Gadgets.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "gadgets";
}

const OWNER: &str = "test.Owner";

fn widget(id: &str, size: u32, tags: &[&str]) -> cosi::RawResource {
    Resource::new_default(
        id,
        WidgetSpec {
            size,
            tags: tags.iter().map(|t| t.to_string()).collect(),
            display_name: format!("widget {id}"),
        },
    )
    .to_raw()
    .expect("encode widget")
}

/// A stated with the Widget definition registered in `meta`.
async fn stated() -> Harness {
    let h = Harness::start().await;
    let rd = WidgetSpec::definition();
    let raw = Resource::new(cosi::META_NAMESPACE, rd.id(), rd)
        .to_raw()
        .expect("encode definition");
    h.client
        .create(&raw, OWNER)
        .await
        .expect("register the Widget definition");
    h
}

fn command(socket: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_talosctl"));
    cmd.env("TALOS_SOCKET", socket)
        .env_remove("RUST_LOG")
        .args(args);
    cmd
}

/// Runs talosctl to completion (off the runtime: stated is served by this test's runtime).
async fn talosctl(socket: &Path, args: &[&str]) -> Output {
    let mut cmd = command(socket, args);
    tokio::task::spawn_blocking(move || cmd.output().expect("run talosctl"))
        .await
        .expect("join talosctl runner")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "talosctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

#[tokio::test(flavor = "multi_thread")]
async fn table_resolves_aliases_and_prints_columns() {
    let h = stated().await;
    h.client
        .create(&widget("b", 2, &["x"]), OWNER)
        .await
        .unwrap();
    h.client
        .create(&widget("a-long-id", 10, &["red", "blue"]), OWNER)
        .await
        .unwrap();

    let expected = "\
NAMESPACE   TYPE     ID          VERSION   SIZE   TAGS
test        Widget   a-long-id   1         10     red blue
test        Widget   b           1         2      x
";
    for name in ["wdg", "widget", "WIDGETS", "Widgets.test.talos.dev", "g"] {
        let args: Vec<&str> = if name == "g" {
            vec!["g", "wdg"] // the `get` alias
        } else {
            vec!["get", name]
        };
        assert_eq!(
            stdout(&talosctl(&h.socket, &args).await),
            expected,
            "{name}"
        );
    }

    let one = stdout(&talosctl(&h.socket, &["get", "wdg", "b"]).await);
    assert_eq!(
        one,
        "NAMESPACE   TYPE     ID   VERSION   SIZE   TAGS\ntest        Widget   b    1         2      x\n"
    );

    // An empty namespace lists nothing but the header.
    let empty = stdout(&talosctl(&h.socket, &["get", "wdg", "--namespace", "other"]).await);
    assert_eq!(empty, "NAMESPACE   TYPE   ID   VERSION   SIZE   TAGS\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn yaml_and_json_show_metadata_and_spec() {
    let h = stated().await;
    let mut w = widget("w1", 3, &["a"]);
    w.metadata.labels.insert("tier".into(), "gold".into());
    h.client.create(&w, OWNER).await.unwrap();
    h.client.create(&widget("w2", 4, &[]), OWNER).await.unwrap();

    let yaml = stdout(&talosctl(&h.socket, &["get", "wdg", "-o", "yaml"]).await);
    let docs: Vec<serde_json::Value> = yaml
        .split("---\n")
        .map(|d| serde_yaml_ng::from_str(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{yaml}");
    let md = &docs[0]["metadata"];
    assert_eq!(md["namespace"], "test");
    assert_eq!(md["type"], "Widgets.test.talos.dev");
    assert_eq!(md["id"], "w1");
    assert_eq!(md["version"], 1);
    assert_eq!(md["owner"], OWNER);
    assert_eq!(md["phase"], "running");
    assert_eq!(md["labels"]["tier"], "gold");
    assert!(md["created"].as_str().unwrap().ends_with('Z'), "{yaml}");
    assert!(md["updated"].is_string());
    assert!(docs[1]["metadata"].get("labels").is_none(), "{yaml}");
    assert_eq!(
        docs[0]["spec"],
        serde_json::json!({"size": 3, "tags": ["a"], "displayName": "widget w1"})
    );
    assert!(yaml.contains("spec:\n  displayName: widget w1\n"), "{yaml}");

    let json = stdout(&talosctl(&h.socket, &["get", "widget", "-o", "json"]).await);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "one object per line: {json}");
    assert_eq!(lines[0], docs[0]);
    assert_eq!(lines[1]["spec"]["size"], 4);
    assert!(lines[0].get("event").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_type_renders_given_a_namespace() {
    let h = stated().await;
    let g = Resource::new_default(
        "g1",
        GadgetSpec {
            color: "green".into(),
            parts: vec![1, 2],
        },
    );
    h.client.create(&g.to_raw().unwrap(), OWNER).await.unwrap();

    let args = [
        "get",
        "Gadgets.test.talos.dev",
        "--namespace",
        "gadgets",
        "-o",
        "yaml",
    ];
    let out: serde_json::Value =
        serde_yaml_ng::from_str(&stdout(&talosctl(&h.socket, &args).await)).unwrap();
    assert_eq!(out["metadata"]["id"], "g1");
    assert_eq!(
        out["spec"],
        serde_json::json!({"color": "green", "parts": [1, 2]})
    );

    let table = stdout(
        &talosctl(
            &h.socket,
            &["get", "Gadgets.test.talos.dev", "--namespace", "gadgets"],
        )
        .await,
    );
    assert_eq!(
        table,
        "NAMESPACE   TYPE                     ID   VERSION\n\
         gadgets     Gadgets.test.talos.dev   g1   1\n"
    );

    // Without a definition there is no default namespace.
    let out = talosctl(&h.socket, &["get", "Gadgets.test.talos.dev"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not defined") && err.contains("--namespace"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_resource_is_exit_code_1() {
    let h = stated().await;
    let out = talosctl(&h.socket, &["get", "wdg", "nope"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("resource Widgets.test.talos.dev \"nope\" not found"),
        "{err}"
    );

    // Usage errors are clap's exit code 2.
    let out = talosctl(&h.socket, &["get"]).await;
    assert_eq!(out.status.code(), Some(2));

    // No stated: a clear error, exit code 1.
    let gone = h.dir().join("nothing.sock");
    let out = talosctl(&gone, &["get", "rd"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing.sock"), "{err}");

    // Over sockets, -n only names nodes of a local cluster of the talosconfig (none here);
    // other nodes are reached through apid, without --socket.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_talosctl"))
        .env("TALOSCONFIG", h.dir().join("no-talosconfig"))
        .args([
            "--socket",
            &h.socket.to_string_lossy(),
            "-n",
            "10.5.0.2",
            "get",
            "rd",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("-n names nodes of a local cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn meta_types_are_listed() {
    let h = stated().await;
    let rd = stdout(&talosctl(&h.socket, &["get", "rd"]).await);
    let header = rd.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["NAMESPACE", "TYPE", "ID", "VERSION", "ALIASES"]
    );
    let widgets = rd
        .lines()
        .find(|l| l.contains("widgets.test.talos.dev"))
        .unwrap_or_else(|| panic!("{rd}"));
    assert!(widgets.starts_with("meta "), "{widgets}");
    assert!(widgets.contains("ResourceDefinition"), "{widgets}");
    assert!(widgets.contains("\"wdg\""), "{widgets}");

    let ns = stdout(&talosctl(&h.socket, &["get", "namespaces"]).await);
    assert!(
        ns.lines()
            .any(|l| l.starts_with("meta ") && l.contains(" Namespace ")),
        "{ns}"
    );
}

/// A running `talosctl get --watch` whose output lines arrive on a channel.
struct Watcher {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Watcher {
    fn start(socket: &Path, args: &[&str]) -> Self {
        let mut child = command(socket, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start talosctl");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    async fn next(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.lines.recv())
            .await
            .expect("talosctl printed nothing for 10s")
            .expect("talosctl exited")
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cells(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_table_marks_created_updated_destroyed() {
    let h = stated().await;
    h.client
        .create(&widget("a", 1, &["t"]), OWNER)
        .await
        .unwrap();

    let mut w = Watcher::start(&h.socket, &["get", "wdg", "--watch"]);
    assert_eq!(
        cells(&w.next().await),
        ["*", "NAMESPACE", "TYPE", "ID", "VERSION", "SIZE", "TAGS"]
    );
    assert_eq!(
        cells(&w.next().await),
        ["+", "test", "Widget", "a", "1", "1", "t"]
    );

    h.client.create(&widget("b", 2, &[]), OWNER).await.unwrap();
    assert_eq!(
        cells(&w.next().await),
        ["+", "test", "Widget", "b", "1", "2"]
    );

    let mut a = h.client.get("test", WidgetSpec::TYPE, "a").await.unwrap();
    a.spec = widget("a", 5, &["t"]).spec;
    h.client.update(&a, OWNER, None).await.unwrap();
    let line = w.next().await;
    assert!(line.starts_with(' '), "updated rows start blank: {line:?}");
    assert_eq!(cells(&line), ["test", "Widget", "a", "2", "5", "t"]);

    h.client
        .destroy("test", WidgetSpec::TYPE, "b", OWNER)
        .await
        .unwrap();
    assert_eq!(cells(&w.next().await)[..4], ["-", "test", "Widget", "b"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_json_and_yaml_carry_the_event() {
    let h = stated().await;
    h.client.create(&widget("a", 1, &[]), OWNER).await.unwrap();

    let mut w = Watcher::start(&h.socket, &["get", "wdg", "-w", "-o", "json"]);
    let ev: serde_json::Value = serde_json::from_str(&w.next().await).unwrap();
    assert_eq!(ev["event"], "created");
    assert_eq!(ev["metadata"]["id"], "a");

    let mut a = h.client.get("test", WidgetSpec::TYPE, "a").await.unwrap();
    a.spec = widget("a", 9, &[]).spec;
    h.client.update(&a, OWNER, None).await.unwrap();
    let ev: serde_json::Value = serde_json::from_str(&w.next().await).unwrap();
    assert_eq!(ev["event"], "updated");
    assert_eq!(ev["spec"]["size"], 9);

    h.client
        .destroy("test", WidgetSpec::TYPE, "a", OWNER)
        .await
        .unwrap();
    let ev: serde_json::Value = serde_json::from_str(&w.next().await).unwrap();
    assert_eq!(ev["event"], "destroyed");
    assert_eq!(ev["metadata"]["id"], "a");
    drop(w);

    // A single-resource watch in YAML: nothing until it exists, then its events.
    let mut w = Watcher::start(&h.socket, &["get", "wdg", "c", "-w", "-o", "yaml"]);
    h.client.create(&widget("c", 7, &[]), OWNER).await.unwrap();
    assert_eq!(w.next().await, "event: created");
    assert_eq!(w.next().await, "metadata:");
    assert_eq!(w.next().await, "  namespace: test");
    h.client
        .destroy("test", WidgetSpec::TYPE, "c", OWNER)
        .await
        .unwrap();
    loop {
        let line = w.next().await;
        if line == "---" {
            break;
        }
    }
    assert_eq!(w.next().await, "event: destroyed");
}

#[tokio::test(flavor = "multi_thread")]
async fn compiled_in_definitions_resolve_types_nobody_registered() {
    let h = Harness::start().await;
    let mc = Resource::new(
        "config",
        "v1alpha1",
        machinery::resources::config::MachineConfigSpec("version: v1alpha1\n".into()),
    )
    .to_raw()
    .expect("encode");
    h.client.create(&mc, "").await.expect("create");
    let out = stdout(&talosctl(&h.socket, &["get", "mc", "-o", "yaml"]).await);
    assert!(
        out.contains("type: MachineConfigs.config.talos.dev"),
        "{out}"
    );
    assert!(out.contains("version: v1alpha1"), "{out}");
}
