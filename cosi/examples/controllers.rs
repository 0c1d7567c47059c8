//! A small daemon: a hand-written controller, a transform and a layered merge, run against a
//! stated socket until Ctrl-C — or, with `--dot`, its dependency graph printed without stated.
//!
//! ```text
//! cargo run -p cosi --example controllers -- /tmp/stated.sock
//! cargo run -p cosi --example controllers -- --dot | dot -Tsvg > graph.svg
//! ```

use cosi::generic::{Layered, LayeredMerge, MergeController, Transform, TransformController};
use cosi::runtime::{
    Action, Context, Controller, Input, Output, ReconcileError, Registry, Runtime,
};
use cosi::{Client, Resource, ResourceSpec};
use serde::{Deserialize, Serialize};

/// A hostname candidate from one configuration layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct HostnameSpec {
    hostname: String,
    layer: u8,
}

impl ResourceSpec for HostnameSpec {
    const TYPE: &'static str = "HostnameSpecs.example.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "example";
}

impl Layered for HostnameSpec {
    type Layer = u8;
    fn layer(&self) -> u8 {
        self.layer
    }
    fn merge_key(&self) -> String {
        "hostname".to_string()
    }
}

/// The hostname the node uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct HostnameStatus {
    hostname: String,
    domainname: String,
}

impl ResourceSpec for HostnameStatus {
    const TYPE: &'static str = "HostnameStatuses.example.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "example";
}

/// A hostname the node announces, one per status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Announcement {
    fqdn: String,
}

impl ResourceSpec for Announcement {
    const TYPE: &'static str = "Announcements.example.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "example";
}

/// Splits the merged hostname spec into host and domain.
struct HostnameStatusController;

impl Controller for HostnameStatusController {
    fn name(&self) -> &'static str {
        "example.HostnameStatusController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<HostnameSpec>("example").with_id("hostname")]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<HostnameStatus>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        // Nothing asserted when the spec is gone: the runtime removes the status.
        if let Some(spec) = ctx.get::<HostnameSpec>("example", "hostname").await? {
            let (host, domain) = spec
                .spec
                .hostname
                .split_once('.')
                .unwrap_or((spec.spec.hostname.as_str(), ""));
            ctx.apply(Resource::new(
                "example",
                "hostname",
                HostnameStatus {
                    hostname: host.to_string(),
                    domainname: domain.to_string(),
                },
            ))
            .await?;
        }
        Ok(Action::AwaitChange)
    }
}

/// One announcement per hostname status.
struct Announce;

impl Transform for Announce {
    type Input = HostnameStatus;
    type Output = Announcement;

    fn name(&self) -> &'static str {
        "example.AnnounceController"
    }
    fn input_namespace(&self) -> &str {
        "example"
    }
    fn output_namespace(&self) -> &str {
        "example"
    }
    fn map_id(&self, input: &Resource<HostnameStatus>) -> Option<String> {
        Some(input.id().to_string())
    }
    fn transform(&self, input: &Resource<HostnameStatus>) -> Result<Announcement, ReconcileError> {
        let s = &input.spec;
        let fqdn = if s.domainname.is_empty() {
            s.hostname.clone()
        } else {
            format!("{}.{}", s.hostname, s.domainname)
        };
        Ok(Announcement { fqdn })
    }
}

fn register(r: &mut Registry) -> Result<(), cosi::runtime::RuntimeError> {
    r.register(MergeController::new(LayeredMerge::<HostnameSpec>::new(
        "example.HostnameMergeController",
        "example-config",
        "example",
    )))?;
    r.register(HostnameStatusController)?;
    r.register(TransformController::new(Announce))?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut registry = Registry::new();
    register(&mut registry)?;
    let Some(arg) = std::env::args().nth(1) else {
        eprintln!("usage: controllers <stated socket> | --dot");
        std::process::exit(2);
    };
    if arg == "--dot" {
        print!("{}", registry.dependency_graph().to_dot());
        return Ok(());
    }
    let runtime = Runtime::with_registry(Client::new(arg)?, registry);
    runtime
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
