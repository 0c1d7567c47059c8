//! The controller runtime against a real stated in-process: reconcile, coalescing, output
//! cleanup, restarts with backoff, adoption after a daemon restart, resync after a stated
//! restart, and the generic transform and merge controllers.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cosi::generic::{Layered, LayeredMerge, MergeController, Transform, TransformController};
use cosi::runtime::{
    Action, Context, Controller, EdgeKind, Input, Mirror, Output, ReconcileError, Registry,
    Runtime, RuntimeError,
};
use cosi::{Client, Resource, ResourceSpec};
use serde::{Deserialize, Serialize};
use stated::testing::Harness;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

// ---- resource types -------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Num {
    value: i64,
}
impl ResourceSpec for Num {
    const TYPE: &'static str = "Nums.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "in";
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Doubled {
    value: i64,
}
impl ResourceSpec for Doubled {
    const TYPE: &'static str = "Doubleds.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "out";
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Flag {
    ok: bool,
}
impl ResourceSpec for Flag {
    const TYPE: &'static str = "Flags.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "out";
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Count {
    note: String,
}
impl ResourceSpec for Count {
    const TYPE: &'static str = "Counts.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "out";
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Candidate {
    key: String,
    layer: u8,
    value: String,
}
impl ResourceSpec for Candidate {
    const TYPE: &'static str = "Candidates.test.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "merged";
}
impl Layered for Candidate {
    type Layer = u8;
    fn layer(&self) -> u8 {
        self.layer
    }
    fn merge_key(&self) -> String {
        self.key.clone()
    }
}

// ---- controllers ----------------------------------------------------------------------------

/// Doubles every Num in `in` into a Doubled of the same ID in `out`.
struct DoubleController {
    reconciles: Arc<AtomicUsize>,
    /// Reconciles wait here while the gate is closed (`false`).
    gate: Option<watch::Receiver<bool>>,
}

impl DoubleController {
    fn new() -> (Self, Arc<AtomicUsize>) {
        let reconciles = Arc::new(AtomicUsize::new(0));
        (
            Self {
                reconciles: reconciles.clone(),
                gate: None,
            },
            reconciles,
        )
    }
}

impl Controller for DoubleController {
    fn name(&self) -> &'static str {
        "test.DoubleController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<Num>("in"),
            Input::destroy_ready::<Doubled>("out"),
        ]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Doubled>()]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        if let Some(gate) = self.gate.as_mut() {
            let _ = gate.wait_for(|open| *open).await;
        }
        self.reconciles.fetch_add(1, Ordering::SeqCst);
        for n in ctx.list::<Num>("in").await? {
            ctx.apply(Resource::new(
                "out",
                n.id(),
                Doubled {
                    value: n.spec.value * 2,
                },
            ))
            .await?;
        }
        Ok(Action::AwaitChange)
    }
}

/// Fails its first attempts (panics on odd ones, errors on even ones), then writes a Flag.
struct FlakyController {
    attempts: Arc<Mutex<Vec<Instant>>>,
    failures: usize,
}

impl Controller for FlakyController {
    fn name(&self) -> &'static str {
        "test.FlakyController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<Num>("in")]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Flag>()]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let attempt = {
            let mut a = self.attempts.lock().expect("lock");
            a.push(Instant::now());
            a.len()
        };
        if attempt <= self.failures {
            if attempt % 2 == 1 {
                panic!("flaky attempt {attempt}");
            }
            return Err(ReconcileError::other(format!("flaky attempt {attempt}")));
        }
        ctx.apply(Resource::new("out", "flag", Flag { ok: true }))
            .await?;
        Ok(Action::AwaitChange)
    }
}

/// Writes a type it did not declare.
struct Trespasser;

impl Controller for Trespasser {
    fn name(&self) -> &'static str {
        "test.Trespasser"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::shared::<Candidate>().in_namespace("elsewhere")]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        ctx.apply(Resource::new("out", "x", Doubled { value: 0 }))
            .await?;
        Ok(Action::AwaitChange)
    }
}

/// Doubles every Num in `in` into `bulk` with one `apply_all`, giving the first ID twice (the
/// second time with the value the output must end with); counts its failed cycles.
struct BulkController {
    errors: Arc<Mutex<Vec<String>>>,
    /// Declares its output kind cached.
    cached: bool,
}

impl Controller for BulkController {
    fn name(&self) -> &'static str {
        "test.BulkController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<Num>("in")]
    }
    fn outputs(&self) -> Vec<Output> {
        let o = Output::exclusive::<Doubled>().in_namespace("bulk");
        vec![if self.cached { o.cached() } else { o }]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nums = ctx.list::<Num>("in").await?;
        let mut outputs: Vec<Resource<Doubled>> = Vec::new();
        if let Some(first) = nums.first() {
            outputs.push(Resource::new("bulk", first.id(), Doubled { value: -1 }));
        }
        outputs.extend(nums.iter().map(|n| {
            Resource::new(
                "bulk",
                n.id(),
                Doubled {
                    value: n.spec.value * 2,
                },
            )
        }));
        match ctx.apply_all(outputs).await {
            Ok(()) => Ok(Action::AwaitChange),
            Err(e) => {
                self.errors.lock().expect("lock").push(e.to_string());
                Err(e)
            }
        }
    }
}

/// Puts its finalizer on every Num in `fin` with one `add_finalizers`.
struct FinalizerController;

impl Controller for FinalizerController {
    fn name(&self) -> &'static str {
        "test.FinalizerController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<Num>("fin")]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nums = ctx.list::<Num>("fin").await?;
        ctx.add_finalizers(&nums, "test.FinalizerController")
            .await?;
        Ok(Action::AwaitChange)
    }
}

/// Applies merged Candidates as a spec controller does: a strong input (which the merge in the
/// same runtime keeps in memory), decoded once per version into a mirror, its finalizer on
/// every running one, removed from one tearing down once "unapplied".
#[derive(Default)]
struct ApplyController {
    specs: Mirror<Candidate>,
    /// What it applied last, by ID; and the IDs it unapplied.
    applied: Arc<Mutex<std::collections::BTreeMap<String, String>>>,
    unapplied: Arc<Mutex<Vec<String>>>,
}

impl Controller for ApplyController {
    fn name(&self) -> &'static str {
        "test.ApplyController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<Candidate>("merged")]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        ctx.refresh("merged", &mut self.specs).await?;
        ctx.add_finalizers(self.specs.iter(), self.name()).await?;
        for r in self.specs.iter() {
            if r.metadata.phase == cosi::Phase::TearingDown {
                if !r.metadata.finalizers.contains(self.name()) {
                    continue;
                }
                ctx.remove_finalizer::<Candidate>("merged", r.id(), self.name())
                    .await?;
                self.applied.lock().expect("lock").remove(r.id());
                self.unapplied
                    .lock()
                    .expect("lock")
                    .push(r.id().to_string());
            } else {
                self.applied
                    .lock()
                    .expect("lock")
                    .insert(r.id().to_string(), r.spec.value.clone());
            }
        }
        Ok(Action::AwaitChange)
    }
}

/// Num in `in` → Doubled in `tout`, skipping the ID `skip`.
struct DoubleTransform;

impl Transform for DoubleTransform {
    type Input = Num;
    type Output = Doubled;
    fn name(&self) -> &'static str {
        "test.DoubleTransform"
    }
    fn input_namespace(&self) -> &str {
        "in"
    }
    fn output_namespace(&self) -> &str {
        "tout"
    }
    fn map_id(&self, input: &Resource<Num>) -> Option<String> {
        (input.id() != "skip").then(|| format!("t-{}", input.id()))
    }
    fn transform(&self, input: &Resource<Num>) -> Result<Doubled, ReconcileError> {
        if input.spec.value < 0 {
            return Err(ReconcileError::other("negative"));
        }
        Ok(Doubled {
            value: input.spec.value * 2,
        })
    }
}

// ---- helpers --------------------------------------------------------------------------------

const DEADLINE: Duration = Duration::from_secs(15);

/// Polls `f` until it returns `Some`, or panics after the deadline saying what was awaited.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get<S: ResourceSpec>(c: &Client, ns: &str, id: &str) -> Option<Resource<S>> {
    match c.get_typed::<S>(ns, id).await {
        Ok(r) => Some(r),
        Err(e) if e.is_not_found() => None,
        Err(e) => panic!("get {ns}/{id}: {e}"),
    }
}

/// Waits until `ns/id` of `S` has `spec`.
async fn expect_spec<S: ResourceSpec>(c: &Client, ns: &str, id: &str, spec: S) -> Resource<S> {
    eventually(&format!("{ns}/{id} = {spec:?}"), || async {
        get::<S>(c, ns, id).await.filter(|r| r.spec == spec)
    })
    .await
}

/// Waits until `ns/id` of `S` is gone.
async fn expect_gone<S: ResourceSpec>(c: &Client, ns: &str, id: &str) {
    eventually(&format!("{ns}/{id} destroyed"), || async {
        get::<S>(c, ns, id).await.is_none().then_some(())
    })
    .await
}

async fn put<S: ResourceSpec>(c: &Client, ns: &str, id: &str, spec: S) {
    let r = Resource::new(ns, id, spec).to_raw().expect("encode");
    match c.get(ns, S::TYPE, id).await {
        Ok(cur) => {
            let mut r = r;
            r.metadata.version = cur.metadata.version;
            c.update(&r, "", None).await.expect("update");
        }
        Err(e) if e.is_not_found() => {
            c.create(&r, "").await.expect("create");
        }
        Err(e) => panic!("get: {e}"),
    }
}

/// A runtime running in a task, stopped by [`Running::stop`].
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RuntimeError>>,
}

fn spawn(rt: Runtime) -> Running {
    let (stop, rx) = oneshot::channel::<()>();
    Running {
        stop: Some(stop),
        task: tokio::spawn(rt.run(rx)),
    }
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("runtime stops in time")
            .expect("runtime task")
            .expect("runtime ends cleanly");
    }

    fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

// ---- tests ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_inputs_into_outputs_and_destroys_unasserted_ones() {
    let h = Harness::start().await;
    let c = &h.client;
    put(c, "in", "a", Num { value: 1 }).await;
    put(c, "in", "b", Num { value: 2 }).await;

    let mut rt = Runtime::new(c.clone());
    let (ctl, _) = DoubleController::new();
    rt.register(ctl).expect("register");
    let running = spawn(rt);

    let a = expect_spec(c, "out", "a", Doubled { value: 2 }).await;
    assert_eq!(a.metadata.owner, "test.DoubleController");
    expect_spec(c, "out", "b", Doubled { value: 4 }).await;

    // A change and a new input.
    put(c, "in", "a", Num { value: 10 }).await;
    put(c, "in", "c", Num { value: 3 }).await;
    expect_spec(c, "out", "a", Doubled { value: 20 }).await;
    expect_spec(c, "out", "c", Doubled { value: 6 }).await;

    // An input removed: its output is no longer asserted and is destroyed.
    c.destroy("in", Num::TYPE, "b", "").await.expect("destroy");
    expect_gone::<Doubled>(c, "out", "b").await;

    // An output somebody holds a finalizer on stays tearing down until it is released, and the
    // controller (destroy-ready input on its outputs) then destroys it.
    c.add_finalizer("out", Doubled::TYPE, "c", "holder")
        .await
        .expect("finalizer");
    c.destroy("in", Num::TYPE, "c", "").await.expect("destroy");
    eventually("out/c tearing down", || async {
        get::<Doubled>(c, "out", "c")
            .await
            .filter(|r| r.metadata.phase == cosi::Phase::TearingDown)
    })
    .await;
    c.remove_finalizer("out", Doubled::TYPE, "c", "holder")
        .await
        .expect("release");
    expect_gone::<Doubled>(c, "out", "c").await;
    assert!(get::<Doubled>(c, "out", "a").await.is_some());

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_writes_is_coalesced_into_few_reconciles() {
    let h = Harness::start().await;
    let c = &h.client;
    let mut rt = Runtime::new(c.clone());
    let (mut ctl, reconciles) = DoubleController::new();
    let (gate, rx) = watch::channel(true);
    ctl.gate = Some(rx);
    rt.register(ctl).expect("register");
    let running = spawn(rt);

    // The start-up reconciles (initial wake-up, watch established) are done once an input
    // written now is reflected.
    put(c, "in", "warmup", Num { value: 0 }).await;
    expect_spec(c, "out", "warmup", Doubled { value: 0 }).await;
    let before = reconciles.load(Ordering::SeqCst);

    // Hold the controller in its next reconcile while 100 writes land.
    gate.send_replace(false);
    for i in 0..50 {
        put(c, "in", &format!("n{i}"), Num { value: i }).await;
    }
    for i in 0..50 {
        put(c, "in", &format!("n{i}"), Num { value: 1000 + i }).await;
    }
    gate.send_replace(true);

    for i in 0..50 {
        expect_spec(
            c,
            "out",
            &format!("n{i}"),
            Doubled {
                value: 2 * (1000 + i),
            },
        )
        .await;
    }
    let during = reconciles.load(Ordering::SeqCst) - before;
    assert!(
        (1..=10).contains(&during),
        "100 writes caused {during} reconciles"
    );
    let outputs = c.list_typed::<Doubled>("out").await.expect("list");
    assert_eq!(outputs.len(), 51);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_controller_is_retried_with_backoff_while_siblings_run() {
    let h = Harness::start().await;
    let c = &h.client;
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let mut rt = Runtime::new(c.clone());
    rt.register(FlakyController {
        attempts: attempts.clone(),
        failures: 4,
    })
    .expect("register flaky");
    let (ctl, _) = DoubleController::new();
    rt.register(ctl).expect("register sibling");
    rt.register(Trespasser).expect("register trespasser");
    let running = spawn(rt);

    // The sibling works while the flaky controller panics and fails.
    put(c, "in", "a", Num { value: 1 }).await;
    expect_spec(c, "out", "a", Doubled { value: 2 }).await;

    // After four failures (two panics, two errors) the flaky controller succeeds.
    expect_spec(c, "out", "flag", Flag { ok: true }).await;
    let times = attempts.lock().expect("lock").clone();
    assert!(times.len() >= 5, "{} attempts", times.len());
    let gaps: Vec<Duration> = times.windows(2).take(4).map(|w| w[1] - w[0]).collect();
    for (gap, min_ms) in gaps.iter().zip([100u64, 200, 400, 800]) {
        assert!(
            *gap >= Duration::from_millis(min_ms * 9 / 10),
            "backoff gaps {gaps:?} should double from 100 ms"
        );
    }

    // The runtime is still there, and so is the sibling.
    put(c, "in", "b", Num { value: 5 }).await;
    expect_spec(c, "out", "b", Doubled { value: 10 }).await;
    assert!(running.is_running());

    // The trespasser never wrote outside its outputs.
    assert!(get::<Doubled>(c, "out", "x").await.is_none());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_runtime_adopts_its_outputs_without_churn() {
    let h = Harness::start().await;
    let c = &h.client;
    for (id, v) in [("a", 1), ("b", 2), ("gone", 3)] {
        put(c, "in", id, Num { value: v }).await;
    }
    let mut rt = Runtime::new(c.clone());
    rt.register(DoubleController::new().0).expect("register");
    let first = spawn(rt);
    let a = expect_spec(c, "out", "a", Doubled { value: 2 }).await;
    let b = expect_spec(c, "out", "b", Doubled { value: 4 }).await;
    expect_spec(c, "out", "gone", Doubled { value: 6 }).await;
    first.stop().await;

    // While the daemon is down an input goes away.
    c.destroy("in", Num::TYPE, "gone", "")
        .await
        .expect("destroy");

    let mut rt = Runtime::new(c.clone());
    let (ctl, reconciles) = DoubleController::new();
    rt.register(ctl).expect("register");
    let second = spawn(rt);
    put(c, "in", "new", Num { value: 7 }).await;
    expect_spec(c, "out", "new", Doubled { value: 14 }).await;
    expect_gone::<Doubled>(c, "out", "gone").await;
    assert!(reconciles.load(Ordering::SeqCst) >= 1);

    // The adopted outputs were not rewritten: same version, same creation time.
    for before in [a, b] {
        let after = get::<Doubled>(c, "out", before.id()).await.expect("kept");
        assert_eq!(
            after.metadata.version,
            before.metadata.version,
            "{}",
            before.id()
        );
        assert_eq!(after.metadata.created, before.metadata.created);
    }
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_resync_after_stated_restarts() {
    let mut h = Harness::start().await;
    let c = h.client.clone();
    put(&c, "in", "a", Num { value: 1 }).await;
    let mut rt = Runtime::new(c.clone());
    rt.register(DoubleController::new().0).expect("register");
    let running = spawn(rt);
    expect_spec(&c, "out", "a", Doubled { value: 2 }).await;

    h.restart().await;
    put(&c, "in", "b", Num { value: 2 }).await;
    put(&c, "in", "a", Num { value: 5 }).await;
    expect_spec(&c, "out", "b", Doubled { value: 4 }).await;
    expect_spec(&c, "out", "a", Doubled { value: 10 }).await;

    // Down for a while: reconciles fail meanwhile, and are retried once stated is back.
    h.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.restart().await;
    put(&c, "in", "c", Num { value: 3 }).await;
    expect_spec(&c, "out", "c", Doubled { value: 6 }).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transform_controller_maps_and_cleans_up() {
    let h = Harness::start().await;
    let c = &h.client;
    let mut rt = Runtime::new(c.clone());
    rt.register(TransformController::new(DoubleTransform))
        .expect("register");
    let running = spawn(rt);

    put(c, "in", "a", Num { value: 1 }).await;
    put(c, "in", "skip", Num { value: 2 }).await;
    let a = expect_spec(c, "tout", "t-a", Doubled { value: 2 }).await;
    assert_eq!(a.metadata.owner, "test.DoubleTransform");
    put(c, "in", "b", Num { value: 4 }).await;
    expect_spec(c, "tout", "t-b", Doubled { value: 8 }).await;
    assert!(get::<Doubled>(c, "tout", "t-skip").await.is_none());

    // A failing transform tears nothing down; once fixed, the output follows.
    put(c, "in", "b", Num { value: -1 }).await;
    put(c, "in", "a", Num { value: 3 }).await;
    expect_spec(c, "tout", "t-a", Doubled { value: 6 }).await;
    assert!(get::<Doubled>(c, "tout", "t-b").await.is_some());
    put(c, "in", "b", Num { value: 5 }).await;
    expect_spec(c, "tout", "t-b", Doubled { value: 10 }).await;

    c.destroy("in", Num::TYPE, "a", "").await.expect("destroy");
    expect_gone::<Doubled>(c, "tout", "t-a").await;
    running.stop().await;
}

/// `apply_all` writes many outputs with several in flight: every one lands with its spec, an ID
/// given twice ends with the last spec, unchanged outputs are not written again (their
/// versions stay), and an output it may not write fails the cycle without keeping the others
/// from being written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_all_writes_many_outputs_at_once_and_only_what_changed() {
    let h = Harness::start().await;
    let c = &h.client;
    let n = 3 * cosi::runtime::APPLY_IN_FLIGHT as i64 + 5;
    for i in 0..n {
        put(c, "in", &format!("n{i:03}"), Num { value: i }).await;
    }
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut rt = Runtime::new(c.clone());
    rt.register(BulkController {
        errors: errors.clone(),
        cached: false,
    })
    .expect("register");
    let running = spawn(rt);

    let last = format!("n{:03}", n - 1);
    expect_spec(c, "bulk", &last, Doubled { value: 2 * (n - 1) }).await;
    let all = c
        .list("bulk", Doubled::TYPE, &Default::default())
        .await
        .expect("list");
    assert_eq!(all.len(), n as usize);
    for r in &all {
        let i: i64 = r.metadata.id[1..].parse().expect("id");
        let spec: Doubled = cosi::resource::decode_spec(&r.spec).expect("spec");
        assert_eq!(spec.value, 2 * i, "{}", r.metadata.id);
        assert_eq!(
            r.metadata.version, 1,
            "{} written more than once",
            r.metadata.id
        );
        assert_eq!(r.metadata.owner, "test.BulkController");
    }

    // One input changes: only its output is written again.
    put(c, "in", "n007", Num { value: 1000 }).await;
    expect_spec(c, "bulk", "n007", Doubled { value: 2000 }).await;
    // A second change, seen only once the first cycle is over, makes sure of that.
    put(c, "in", "n008", Num { value: 1001 }).await;
    expect_spec(c, "bulk", "n008", Doubled { value: 2002 }).await;
    let all = c
        .list("bulk", Doubled::TYPE, &Default::default())
        .await
        .expect("list");
    for r in &all {
        let expected = if r.metadata.id == "n007" || r.metadata.id == "n008" {
            2
        } else {
            1
        };
        assert_eq!(r.metadata.version, expected, "{}", r.metadata.id);
    }

    // Somebody else holds one output's ID: the cycle fails saying so, the rest is written.
    let foreign = Resource::new("bulk", "n500", Doubled { value: 0 })
        .to_raw()
        .expect("encode");
    c.create(&foreign, "someone").await.expect("create");
    put(c, "in", "n500", Num { value: 500 }).await;
    put(c, "in", "n501", Num { value: 501 }).await;
    expect_spec(c, "bulk", "n501", Doubled { value: 1002 }).await;
    eventually("an owner conflict reported", || async {
        errors
            .lock()
            .expect("lock")
            .iter()
            .any(|e| e.contains("n500") && e.contains("someone"))
            .then_some(())
    })
    .await;
    let kept = get::<Doubled>(c, "bulk", "n500").await.expect("n500");
    assert_eq!(kept.metadata.owner, "someone");
    assert_eq!(kept.spec, Doubled { value: 0 });
    running.stop().await;
}

/// `add_finalizers` puts the finalizer on every listed strong input (several writes in
/// flight), keeping the owner and the spec; `add_finalizer_to` from a stale copy still adds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_finalizers_marks_every_strong_input() {
    let h = Harness::start().await;
    let c = &h.client;
    let n = 2 * cosi::runtime::APPLY_IN_FLIGHT + 3;
    for i in 0..n {
        put(c, "fin", &format!("f{i:03}"), Num { value: i as i64 }).await;
    }
    let mut rt = Runtime::new(c.clone());
    rt.register(FinalizerController).expect("register");
    let running = spawn(rt);
    eventually("every Num finalized", || async {
        let all = c
            .list("fin", Num::TYPE, &Default::default())
            .await
            .expect("list");
        (all.len() == n
            && all
                .iter()
                .all(|r| r.metadata.finalizers.contains("test.FinalizerController")))
        .then_some(all)
    })
    .await
    .iter()
    .for_each(|r| {
        assert_eq!(r.metadata.owner, "");
        let spec: Num = cosi::resource::decode_spec(&r.spec).expect("spec");
        assert_eq!(format!("f{:03}", spec.value), r.metadata.id);
    });
    running.stop().await;

    // A copy read before somebody else changed the resource: the finalizer still lands, and
    // the other change stays.
    let stale = c.get("fin", Num::TYPE, "f000").await.expect("get");
    put(c, "fin", "f000", Num { value: 77 }).await;
    c.add_finalizer_to(&stale, "late")
        .await
        .expect("add from a stale copy");
    let now = get::<Num>(c, "fin", "f000").await.expect("f000");
    assert!(now.metadata.finalizers.contains("late"));
    assert_eq!(now.spec, Num { value: 77 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_controller_prefers_the_higher_layer() {
    let h = Harness::start().await;
    let c = &h.client;
    let mut rt = Runtime::new(c.clone());
    rt.register(MergeController::new(LayeredMerge::<Candidate>::new(
        "test.CandidateMerge",
        "cfg",
        "merged",
    )))
    .expect("register");
    let running = spawn(rt);

    let cand = |key: &str, layer: u8, value: &str| Candidate {
        key: key.into(),
        layer,
        value: value.into(),
    };
    put(c, "cfg", "default/eth0", cand("eth0", 0, "default")).await;
    put(c, "cfg", "operator/eth0", cand("eth0", 3, "operator")).await;
    put(c, "cfg", "config/eth0", cand("eth0", 2, "config")).await;
    put(c, "cfg", "default/eth1", cand("eth1", 0, "default")).await;
    expect_spec(c, "merged", "eth0", cand("eth0", 3, "operator")).await;
    expect_spec(c, "merged", "eth1", cand("eth1", 0, "default")).await;

    // The winner goes: the next layer takes over; all go: the merged resource goes.
    c.destroy("cfg", Candidate::TYPE, "operator/eth0", "")
        .await
        .expect("destroy");
    expect_spec(c, "merged", "eth0", cand("eth0", 2, "config")).await;
    c.destroy("cfg", Candidate::TYPE, "default/eth1", "")
        .await
        .expect("destroy");
    expect_gone::<Candidate>(c, "merged", "eth1").await;
    running.stop().await;
}

#[test]
fn two_exclusive_writers_of_one_type_are_refused_and_the_graph_shows_the_edges() {
    let mut r = Registry::new();
    r.register(DoubleController::new().0).expect("register");
    let e = r
        .register(TransformController::new(DoubleTransform))
        .expect_err("Doubled has an exclusive writer already");
    assert!(
        matches!(&e, RuntimeError::OutputConflict { r#type, existing, .. }
            if r#type == Doubled::TYPE && existing == "test.DoubleController"),
        "{e}"
    );
    r.register(MergeController::new(LayeredMerge::<Candidate>::new(
        "test.CandidateMerge",
        "cfg",
        "merged",
    )))
    .expect("register merge");

    let g = r.dependency_graph();
    assert!(g
        .edges
        .iter()
        .any(|e| e.controller == "test.DoubleController"
            && e.kind == EdgeKind::OutputExclusive
            && e.namespace == "out"
            && e.r#type == Doubled::TYPE));
    assert!(g.edges.iter().any(|e| e.controller == "test.CandidateMerge"
        && e.kind == EdgeKind::InputWeak
        && e.namespace == "cfg"));
    let dot = g.to_dot();
    assert!(dot.starts_with("digraph  {"), "{dot}");
    assert!(dot.contains("[label=\"test.DoubleController\",shape=\"box\"]"));
    assert!(dot.contains(
        "[fillcolor=\"azure2\",label=\"Nums.test.talos.dev\",shape=\"note\",style=\"filled\"]"
    ));
    // DoubleController → Doubled (bold), Num ⇢ DoubleController (dotted), merge edges.
    assert!(dot.contains("n1->n2[style=\"bold\"];"), "{dot}");
    assert!(dot.contains("n3->n1[style=\"dotted\"];"), "{dot}");
    assert_eq!(dot.matches("->").count(), 4, "{dot}");
}

/// Reads the cached Doubled outputs of another controller (a weak input), counting them.
struct CountController;

impl Controller for CountController {
    fn name(&self) -> &'static str {
        "test.CountController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<Doubled>("bulk")]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Count>()]
    }
    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let all = ctx.list::<Doubled>("bulk").await?;
        let sum: i64 = all.iter().map(|d| d.spec.value).sum();
        ctx.apply(Resource::new(
            Count::DEFAULT_NAMESPACE,
            "count",
            Count {
                note: format!("{} {sum}", all.len()),
            },
        ))
        .await?;
        Ok(Action::AwaitChange)
    }
}

/// A cached output kind: outputs compared with the runtime's memory (written once, then only
/// what changed), a destroy or an edit by somebody else undone without any input changing,
/// correct across stated restarts, and read from memory by a sibling controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_output_kind_is_kept_in_memory_and_repaired() {
    let mut h = Harness::start().await;
    let c = h.client.clone();
    let n = 40_i64;
    for i in 0..n {
        put(&c, "in", &format!("n{i:03}"), Num { value: i }).await;
    }
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut rt = Runtime::new(c.clone());
    rt.register(BulkController {
        errors: errors.clone(),
        cached: true,
    })
    .expect("register");
    rt.register(CountController).expect("register");
    let running = spawn(rt);
    let versions = |all: &[cosi::RawResource]| -> std::collections::BTreeMap<String, u64> {
        all.iter()
            .map(|r| (r.metadata.id.clone(), r.metadata.version))
            .collect()
    };

    let last = format!("n{:03}", n - 1);
    expect_spec(&c, "bulk", &last, Doubled { value: 2 * (n - 1) }).await;
    let sum = (0..n).map(|i| 2 * i).sum::<i64>();
    let note = |count: i64, sum: i64| format!("{count} {sum}");
    eventually("the sibling counts every output", || async {
        get::<Count>(&c, Count::DEFAULT_NAMESPACE, "count")
            .await
            .filter(|f| f.spec.note == note(n, sum))
    })
    .await;

    // One input changes: only its output is written again, twice in a row.
    put(&c, "in", "n007", Num { value: 1000 }).await;
    expect_spec(&c, "bulk", "n007", Doubled { value: 2000 }).await;
    put(&c, "in", "n008", Num { value: 1001 }).await;
    expect_spec(&c, "bulk", "n008", Doubled { value: 2002 }).await;
    let all = c
        .list("bulk", Doubled::TYPE, &Default::default())
        .await
        .expect("list");
    assert_eq!(all.len(), n as usize);
    for (id, v) in versions(&all) {
        let expected = if id == "n007" || id == "n008" { 2 } else { 1 };
        assert_eq!(v, expected, "{id}");
    }

    // The administrator destroys an output: it is back without any input changing.
    c.destroy("bulk", Doubled::TYPE, "n003", "test.BulkController")
        .await
        .expect("destroy");
    expect_spec(&c, "bulk", "n003", Doubled { value: 6 }).await;

    // The administrator edits an output: the next cycle (any input change) writes it back.
    let mut edited = Resource::new("bulk", "n004", Doubled { value: -5 })
        .to_raw()
        .expect("encode");
    let cur = c.get("bulk", Doubled::TYPE, "n004").await.expect("get");
    edited.metadata.version = cur.metadata.version;
    c.update(&edited, "test.BulkController", None)
        .await
        .expect("update");
    put(&c, "in", "n009", Num { value: 90 }).await;
    expect_spec(&c, "bulk", "n009", Doubled { value: 180 }).await;
    expect_spec(&c, "bulk", "n004", Doubled { value: 8 }).await;

    // stated restarts (its run log keeps the resources): nothing is rewritten, and changes
    // and destroys after it are handled as before.
    let before = versions(
        &c.list("bulk", Doubled::TYPE, &Default::default())
            .await
            .expect("list"),
    );
    h.restart().await;
    put(&c, "in", "n010", Num { value: 50 }).await;
    expect_spec(&c, "bulk", "n010", Doubled { value: 100 }).await;
    c.destroy("bulk", Doubled::TYPE, "n011", "test.BulkController")
        .await
        .expect("destroy");
    expect_spec(&c, "bulk", "n011", Doubled { value: 22 }).await;
    let after = versions(
        &c.list("bulk", Doubled::TYPE, &Default::default())
            .await
            .expect("list"),
    );
    for (id, v) in &after {
        if id != "n010" && id != "n011" && id != "n004" {
            assert_eq!(Some(v), before.get(id), "{id} rewritten after the restart");
        }
    }

    // An input removed: its output is destroyed, and the sibling sees the new sum.
    c.destroy("in", Num::TYPE, "n000", "")
        .await
        .expect("destroy");
    expect_gone::<Doubled>(&c, "bulk", "n000").await;
    let sum = sum - 14 + 2000 - 16 + 2002 - 18 + 180 - 20 + 100;
    eventually("the sibling sees every change", || async {
        get::<Count>(&c, Count::DEFAULT_NAMESPACE, "count")
            .await
            .filter(|f| f.spec.note == note(n - 1, sum))
    })
    .await;
    assert!(errors.lock().expect("lock").is_empty(), "{errors:?}");
    running.stop().await;
}

/// A spec controller whose specs a merge of the same runtime writes reads them from the
/// runtime's memory of the merged kind (a strong input served from memory, decoded once per
/// version): every spec gets its finalizer, a changed spec is seen, a spec torn down is seen
/// tearing down, unapplied and then destroyed by the merge; a resource changed behind both
/// (an administrator's label) still ends with the finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strong_input_kept_in_memory_is_finalized_and_torn_down() {
    let h = Harness::start().await;
    let c = &h.client;
    let cand = |key: &str, value: &str| Candidate {
        key: key.into(),
        layer: 2,
        value: value.into(),
    };
    let n = 40;
    for i in 0..n {
        put(
            c,
            "cfg",
            &format!("config/k{i:02}"),
            cand(&format!("k{i:02}"), "one"),
        )
        .await;
    }
    let apply = ApplyController::default();
    let (applied, unapplied) = (apply.applied.clone(), apply.unapplied.clone());
    let mut rt = Runtime::new(c.clone());
    rt.register(MergeController::new(LayeredMerge::<Candidate>::new(
        "test.CandidateMerge",
        "cfg",
        "merged",
    )))
    .expect("register");
    rt.register(apply).expect("register");
    let running = spawn(rt);
    let finalized = |all: &[cosi::RawResource]| {
        all.iter()
            .all(|r| r.metadata.finalizers.contains("test.ApplyController"))
    };
    eventually("every merged spec finalized and applied", || async {
        let all = c
            .list("merged", Candidate::TYPE, &Default::default())
            .await
            .expect("list");
        (all.len() == n && finalized(&all) && applied.lock().expect("lock").len() == n)
            .then_some(())
    })
    .await;

    // A change: the merged spec changes, the spec controller sees the new version.
    put(c, "cfg", "config/k07", cand("k07", "two")).await;
    eventually("k07 applied as two", || async {
        (applied.lock().expect("lock").get("k07").map(String::as_str) == Some("two")).then_some(())
    })
    .await;

    // An administrator changes merged resources behind both controllers, then a new spec
    // comes: the finalizers land whatever the spec controller's memory said.
    for i in 0..n {
        let id = format!("k{i:02}");
        let mut r = c.get("merged", Candidate::TYPE, &id).await.expect("get");
        r.metadata.labels.insert("touched".into(), "yes".into());
        // A conflict with the merge's own rewrite is fine: some are touched, some not.
        let _ = c.update(&r, "", None).await;
    }
    put(c, "cfg", "config/k99", cand("k99", "one")).await;
    eventually("k99 and every other finalized again", || async {
        let all = c
            .list("merged", Candidate::TYPE, &Default::default())
            .await
            .expect("list");
        (all.len() == n + 1 && finalized(&all)).then_some(())
    })
    .await;

    // A teardown: the merge tears the spec down, the spec controller sees it, unapplies it and
    // lets go, and the merge destroys it.
    c.destroy("cfg", Candidate::TYPE, "config/k03", "")
        .await
        .expect("destroy");
    expect_gone::<Candidate>(c, "merged", "k03").await;
    assert_eq!(*unapplied.lock().expect("lock"), vec!["k03".to_string()]);
    assert!(!applied.lock().expect("lock").contains_key("k03"));
    running.stop().await;
}
