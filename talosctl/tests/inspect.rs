//! `talosctl inspect dependencies` draws the graphs that running controller runtimes publish.

use std::process::Command;
use std::time::Duration;

use cosi::runtime::{
    Action, Context, Controller, DependencyGraph, Input, Output, ReconcileError, Runtime,
};
use cosi::ResourceSpec;
use serde::{Deserialize, Serialize};
use stated::testing::Harness;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct In;
impl ResourceSpec for In {
    const TYPE: &'static str = "Ins.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "testd";
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Out;
impl ResourceSpec for Out {
    const TYPE: &'static str = "Outs.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "testd";
}

struct Copy;
impl Controller for Copy {
    fn name(&self) -> &'static str {
        "test.CopyController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<In>("testd")]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Out>()]
    }
    async fn reconcile(&mut self, _ctx: &mut Context) -> Result<Action, ReconcileError> {
        Ok(Action::AwaitChange)
    }
}

async fn talosctl(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_talosctl"));
    cmd.env("TALOS_SOCKET", socket).args(args);
    tokio::task::spawn_blocking(move || cmd.output().expect("run talosctl"))
        .await
        .expect("join")
}

#[tokio::test(flavor = "multi_thread")]
async fn draws_the_published_graphs() {
    let h = Harness::start().await;
    let mut rt = Runtime::new(h.client.clone()).publish_graph("testd", "testd");
    rt.register(Copy).expect("register");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(rt.run(async {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h
        .client
        .get("testd", DependencyGraph::TYPE, "testd")
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "graph never published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = talosctl(&h.socket, &["inspect", "dependencies"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dot = String::from_utf8(out.stdout).expect("utf-8");
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(
        dot.contains("label=\"test.CopyController\",shape=\"box\""),
        "{dot}"
    );
    assert!(dot.contains("label=\"Outs.test.talos.dev\""), "{dot}");
    assert!(
        dot.contains("[style=\"bold\"]"),
        "exclusive output edge: {dot}"
    );
    assert!(dot.contains("[style=\"dotted\"]"), "weak input edge: {dot}");

    let out = talosctl(&h.socket, &["inspect", "dependencies", "--daemon", "nope"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no dependency graph published by daemon \"nope\""));
    let _ = stop.send(());
    task.await.expect("join").expect("runtime");
}
