//! The controller runtime: controllers declare inputs and outputs and reconcile; the runtime
//! watches, wakes, restarts and cleans up (DESIGN §3).
//!
//! - [`Controller`]: name, [`Input`]s, [`Output`]s and `reconcile(&mut Context) -> Action`;
//! - [`Context`]: checked reads of inputs, owned writes of outputs, output tracking;
//! - [`Registry`]: the registered controllers, checked for name and output conflicts, and their
//!   [`DependencyGraph`], all without a connection to stated;
//! - [`Runtime`]: a registry plus a [`Client`]; [`Runtime::run`] runs every controller as its own
//!   task until shutdown.
//!
//! # Guarantees
//!
//! - One aggregated kind watch per (namespace, type) per runtime, whatever the number of
//!   controllers reading it. A burst of changes wakes a controller once (capacity-1 channel).
//! - A controller is reconciled once at start, then on every wake-up, requeue or retry; never
//!   twice at once.
//! - After a successful cycle the runtime tears down every resource of the controller's output
//!   types that it owns and the cycle did not assert, and destroys it once its finalizers are
//!   gone (on a later cycle if some remain).
//! - An output kind declared [`Output::cached`] is kept in memory from one watch of the kind
//!   and the owner's own writes: a cycle compares its outputs with that memory instead of
//!   listing them, a destroy the owner did not make wakes it, and controllers of the runtime
//!   reading the kind as a weak input read it there too ([`Context::refresh`] decodes only
//!   what changed into a [`Mirror`]).
//! - A failing or panicking controller is retried alone with exponential backoff (100 ms, ×2,
//!   up to 30 s, reset by a successful cycle); siblings and the runtime go on. Unreachable
//!   stated is such a failure: controllers retry forever and resync when it is back.

mod cache;
mod context;
mod controller;
mod daemon;
mod error;
mod graph;
mod mirror;
mod task;
mod watch;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::client::Client;

pub use context::{Context, Waker, APPLY_IN_FLIGHT};
pub use controller::{Action, Controller, Input, InputKind, Output, OutputKind};
pub use daemon::DaemonRun;
pub use error::{DaemonError, ReconcileError, RuntimeError};
pub use graph::{DependencyGraph, Edge, EdgeKind};
pub use mirror::Mirror;
pub use task::{PENDING_POLL, RESTART_BACKOFF_INITIAL, RESTART_BACKOFF_MAX};

use task::TaskEnv;
use watch::Subscriber;

type ControllerFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
type Starter = Box<dyn FnOnce(TaskEnv) -> ControllerFuture + Send>;

/// A registered controller: its declarations, and how to start its task.
struct Registration {
    name: &'static str,
    inputs: Vec<Input>,
    outputs: Vec<Output>,
    start: Starter,
}

/// The controllers of one daemon, checked and ready to run; usable without stated (to print the
/// dependency graph, or to check registrations at build time).
#[derive(Default)]
pub struct Registry {
    controllers: Vec<Registration>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.controllers.iter().map(|c| c.name))
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a controller.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::DuplicateController`] if the name is taken; [`RuntimeError::OutputConflict`]
    /// if an output type is exclusive to another controller, or is declared exclusive here and
    /// already written by another; [`RuntimeError::DuplicateInput`] if the controller declares
    /// the same (namespace, type, ID) twice.
    pub fn register<C: Controller>(&mut self, controller: C) -> Result<(), RuntimeError> {
        let name = controller.name();
        let inputs = controller.inputs();
        let outputs = controller.outputs();
        if self.controllers.iter().any(|c| c.name == name) {
            return Err(RuntimeError::DuplicateController {
                name: name.to_string(),
            });
        }
        for (n, i) in inputs.iter().enumerate() {
            let dup = inputs[..n]
                .iter()
                .any(|j| j.namespace == i.namespace && j.r#type == i.r#type && j.id == i.id);
            if dup {
                return Err(RuntimeError::DuplicateInput {
                    controller: name.to_string(),
                    namespace: i.namespace.clone(),
                    r#type: i.r#type.clone(),
                    id: i.id.clone(),
                });
            }
        }
        for o in &outputs {
            let existing = self.controllers.iter().find(|c| {
                c.outputs.iter().any(|x| {
                    x.r#type == o.r#type
                        && (x.kind == OutputKind::Exclusive || o.kind == OutputKind::Exclusive)
                })
            });
            if let Some(existing) = existing {
                return Err(RuntimeError::OutputConflict {
                    r#type: o.r#type.clone(),
                    controller: name.to_string(),
                    existing: existing.name.to_string(),
                });
            }
        }
        self.controllers.push(Registration {
            name,
            inputs,
            outputs,
            start: Box::new(move |env| Box::pin(task::run_controller(controller, env))),
        });
        Ok(())
    }

    /// The names of the registered controllers, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.controllers.iter().map(|c| c.name)
    }

    /// The edges between the registered controllers and the kinds they read and write.
    pub fn dependency_graph(&self) -> DependencyGraph {
        let mut g = DependencyGraph::default();
        for c in &self.controllers {
            g.add_controller(c.name, &c.inputs, &c.outputs);
        }
        g
    }
}

/// Runs registered controllers against stated.
#[derive(Debug)]
pub struct Runtime {
    client: Client,
    registry: Registry,
    publish: Option<(String, String)>,
}

impl Runtime {
    /// A runtime without controllers, talking to stated through `client`.
    pub fn new(client: Client) -> Self {
        Self::with_registry(client, Registry::new())
    }

    /// A runtime for the controllers of `registry`.
    pub fn with_registry(client: Client, registry: Registry) -> Self {
        Self {
            client,
            registry,
            publish: None,
        }
    }

    /// Publishes the dependency graph as a [`DependencyGraph`] resource with ID `daemon` in
    /// `namespace` (one the daemon writes) when the runtime starts.
    #[must_use]
    pub fn publish_graph(mut self, namespace: &str, daemon: &str) -> Self {
        self.publish = Some((namespace.to_string(), daemon.to_string()));
        self
    }

    /// Adds a controller; see [`Registry::register`].
    ///
    /// # Errors
    ///
    /// As [`Registry::register`].
    pub fn register<C: Controller>(&mut self, controller: C) -> Result<(), RuntimeError> {
        self.registry.register(controller)
    }

    /// The dependency graph of the registered controllers.
    pub fn dependency_graph(&self) -> DependencyGraph {
        self.registry.dependency_graph()
    }

    /// Runs every controller until `shutdown` completes, then stops them (a reconcile in
    /// flight is cancelled at its next await; the next start reconciles from the stored state).
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Task`] only if a task of the runtime itself panicked; a failing or
    /// panicking controller is retried, not reported here.
    pub async fn run(self, shutdown: impl Future) -> Result<(), RuntimeError> {
        let Runtime {
            client,
            registry,
            publish,
        } = self;
        let graph = registry.dependency_graph();
        let mut kinds: BTreeMap<(String, String), watch::Watched> = BTreeMap::new();
        // One memory per cached output kind, shared by its watch and the contexts of the
        // controllers writing it.
        let mut caches: BTreeMap<context::Kind, std::sync::Arc<cache::KindCache>> = BTreeMap::new();
        for o in registry.controllers.iter().flat_map(|r| &r.outputs) {
            if o.cached {
                caches
                    .entry((o.namespace.clone(), o.r#type.clone()))
                    .or_default();
            }
        }
        let mut starts = Vec::with_capacity(registry.controllers.len());
        // Kept so that a controller's wake channel never closes while the runtime runs.
        let mut senders = Vec::with_capacity(registry.controllers.len());
        for reg in registry.controllers {
            let (tx, rx) = mpsc::channel(1);
            // The first reconcile, whatever the watches do.
            let _ = tx.try_send(());
            for i in &reg.inputs {
                kinds
                    .entry((i.namespace.clone(), i.r#type.clone()))
                    .or_default()
                    .subscribers
                    .push(Subscriber {
                        id: i.id.clone(),
                        kind: i.kind,
                        wake: tx.clone(),
                    });
            }
            let mut mine = Vec::new();
            for o in &reg.outputs {
                let kind = (o.namespace.clone(), o.r#type.clone());
                if let Some(cache) = caches.get(&kind) {
                    let watched = kinds.entry(kind.clone()).or_default();
                    watched.cache = Some(cache.clone());
                    watched.owners.push(tx.clone());
                    mine.push((kind, cache.clone()));
                }
            }
            // A controller reading a kind another one here keeps in memory reads it there.
            for i in &reg.inputs {
                let kind = (i.namespace.clone(), i.r#type.clone());
                if let Some(cache) = caches.get(&kind) {
                    if !mine.iter().any(|(k, _)| *k == kind) {
                        mine.push((kind, cache.clone()));
                    }
                }
            }
            let ctx = Context::new(client.clone(), reg.name, reg.inputs, reg.outputs)
                .with_wake(&tx)
                .with_caches(mine);
            starts.push((reg.name, reg.start, TaskEnv { ctx, wake: rx }));
            senders.push(tx);
        }

        let mut tasks = JoinSet::new();
        for ((namespace, r#type), watched) in kinds {
            let span = tracing::debug_span!("watch", namespace = %namespace, r#type = %r#type);
            tasks.spawn(
                watch::watch_kind(client.clone(), namespace, r#type, watched).instrument(span),
            );
        }
        for (name, start, env) in starts {
            tasks.spawn(start(env).instrument(tracing::info_span!("controller", name)));
        }
        if let Some((namespace, daemon)) = publish {
            tasks.spawn(graph::publish(client.clone(), namespace, daemon, graph));
        }
        tracing::debug!(tasks = tasks.len(), "controller runtime started");

        let mut shutdown = std::pin::pin!(shutdown);
        let result = loop {
            tokio::select! {
                _ = &mut shutdown => break Ok(()),
                Some(joined) = tasks.join_next() => match joined {
                    Err(e) if e.is_panic() => break Err(RuntimeError::Task(e)),
                    _ => {}
                },
            }
        };
        tasks.shutdown().await;
        drop(senders);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::ResourceSpec;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct A;
    impl ResourceSpec for A {
        const TYPE: &'static str = "As.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "test";
    }
    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct B;
    impl ResourceSpec for B {
        const TYPE: &'static str = "Bs.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "test";
    }

    /// A controller written with a plain `async fn`, as implementors may.
    struct Ctl {
        name: &'static str,
        output: OutputKind,
        inputs: Vec<Input>,
    }

    impl Controller for Ctl {
        fn name(&self) -> &'static str {
            self.name
        }
        fn inputs(&self) -> Vec<Input> {
            self.inputs.clone()
        }
        fn outputs(&self) -> Vec<Output> {
            vec![Output::new("test", B::TYPE, self.output)]
        }
        async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
            let _ = ctx.list::<A>("test").await?;
            Ok(Action::AwaitChange)
        }
    }

    fn ctl(name: &'static str, output: OutputKind) -> Ctl {
        Ctl {
            name,
            output,
            inputs: vec![Input::weak::<A>("test")],
        }
    }

    #[test]
    fn registration_conflicts() {
        let mut r = Registry::new();
        r.register(ctl("a", OutputKind::Exclusive)).expect("first");
        assert!(matches!(
            r.register(ctl("a", OutputKind::Shared)),
            Err(RuntimeError::DuplicateController { .. })
        ));
        let e = r
            .register(ctl("b", OutputKind::Exclusive))
            .expect_err("two exclusive writers");
        assert!(matches!(&e, RuntimeError::OutputConflict { existing, .. } if existing == "a"));
        assert!(matches!(
            r.register(ctl("c", OutputKind::Shared)),
            Err(RuntimeError::OutputConflict { .. })
        ));

        let mut r = Registry::new();
        r.register(ctl("a", OutputKind::Shared)).expect("shared");
        r.register(ctl("b", OutputKind::Shared))
            .expect("shared twice");
        assert!(matches!(
            r.register(ctl("c", OutputKind::Exclusive)),
            Err(RuntimeError::OutputConflict { .. })
        ));
        let mut dup = ctl("d", OutputKind::Shared);
        dup.inputs.push(Input::strong::<A>("test"));
        assert!(matches!(
            r.register(dup),
            Err(RuntimeError::DuplicateInput { .. })
        ));
        let mut by_id = ctl("e", OutputKind::Shared);
        by_id.inputs.push(Input::strong::<A>("test").with_id("x"));
        r.register(by_id)
            .expect("an ID-narrowed input is another input");
        assert_eq!(r.names().collect::<Vec<_>>(), ["a", "b", "e"]);
    }

    #[test]
    fn graph_without_stated_or_tokio() {
        let mut r = Registry::new();
        r.register(ctl("a", OutputKind::Exclusive))
            .expect("register");
        let g = r.dependency_graph();
        assert_eq!(
            g.edges
                .iter()
                .map(|e| (e.kind, e.r#type.as_str()))
                .collect::<Vec<_>>(),
            [
                (EdgeKind::OutputExclusive, B::TYPE),
                (EdgeKind::InputWeak, A::TYPE)
            ]
        );
    }

    /// Counts its reconciles and hands its waker out.
    struct Woken {
        count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        waker: tokio::sync::mpsc::UnboundedSender<Waker>,
    }

    impl Controller for Woken {
        fn name(&self) -> &'static str {
            "test.Woken"
        }
        fn inputs(&self) -> Vec<Input> {
            vec![]
        }
        fn outputs(&self) -> Vec<Output> {
            vec![]
        }
        async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
            self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = self.waker.send(ctx.waker());
            Ok(Action::AwaitChange)
        }
    }

    #[tokio::test]
    async fn an_external_waker_reconciles_and_dies_with_the_runtime() {
        use std::sync::atomic::Ordering;
        let client = Client::new("/nonexistent/stated.sock").expect("lazy client");
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, mut wakers) = tokio::sync::mpsc::unbounded_channel();
        let mut rt = Runtime::new(client);
        rt.register(Woken {
            count: count.clone(),
            waker: tx,
        })
        .expect("register");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(rt.run(stopped));
        let waker = wakers.recv().await.expect("first reconcile");
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert!(waker.wake());
        let _ = wakers.recv().await.expect("woken from outside");
        assert_eq!(count.load(Ordering::SeqCst), 2);
        stop.send(()).expect("runtime listens");
        run.await.expect("no panic").expect("ok");
        assert!(!waker.wake(), "the runtime is gone");
        assert!(!Waker::default().wake());
    }

    #[tokio::test]
    async fn run_stops_on_shutdown_even_without_stated() {
        let client = Client::new("/nonexistent/stated.sock").expect("lazy client");
        let mut rt = Runtime::new(client);
        rt.register(ctl("a", OutputKind::Exclusive))
            .expect("register");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(rt.run(rx));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        tx.send(()).expect("runtime listens");
        tokio::time::timeout(std::time::Duration::from_secs(5), run)
            .await
            .expect("stops in time")
            .expect("no panic")
            .expect("ok");
    }
}
