//! What a controller sees during a reconcile: reads of its inputs, writes of its outputs, and
//! the tracker that tears down the outputs a cycle did not assert.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::client::{BatchWrite, Client, Query};
use crate::error::{ErrorKind, StateError};
use crate::resource::{Phase, Pointer, RawResource, Resource, ResourceSpec};
use crate::runtime::cache::KindCache;
use crate::runtime::controller::{Input, InputKind, Output};
use crate::runtime::error::ReconcileError;

/// How often a write is retried when another writer bumped the version in between.
const MAX_WRITE_ATTEMPTS: usize = 16;

/// Writes [`Context::apply_all`] keeps in flight at once on the controller's connection.
pub const APPLY_IN_FLIGHT: usize = 32;

/// What one attempt of an apply came to.
enum Attempt {
    /// Written (created or updated) or found unchanged: asserted, as stored.
    Asserted(RawResource),
    /// The old resource of this ID is tearing down with finalizers: nothing written yet.
    Deferred(RawResource),
    /// The belief about the stored resource was stale: read it again and retry.
    Stale,
}

/// A (namespace, type) pair.
pub(crate) type Kind = (String, String);

/// Values by (namespace, type), looked up by `&str` without building a key: a controller's
/// cycle looks up its kind once per output, thousands of times for a status controller.
#[derive(Debug)]
struct KindMap<V>(std::collections::HashMap<String, std::collections::HashMap<String, V>>);

impl<V> Default for KindMap<V> {
    fn default() -> Self {
        Self(std::collections::HashMap::new())
    }
}

impl<V> KindMap<V> {
    fn get(&self, namespace: &str, r#type: &str) -> Option<&V> {
        self.0.get(namespace)?.get(r#type)
    }

    fn get_mut(&mut self, namespace: &str, r#type: &str) -> Option<&mut V> {
        self.0.get_mut(namespace)?.get_mut(r#type)
    }

    fn contains(&self, namespace: &str, r#type: &str) -> bool {
        self.get(namespace, r#type).is_some()
    }

    fn insert(&mut self, namespace: &str, r#type: &str, v: V) {
        self.0
            .entry(namespace.to_string())
            .or_default()
            .insert(r#type.to_string(), v);
    }

    fn get_or_default(&mut self, namespace: &str, r#type: &str) -> &mut V
    where
        V: Default,
    {
        if !self.contains(namespace, r#type) {
            self.insert(namespace, r#type, V::default());
        }
        self.0
            .get_mut(namespace)
            .and_then(|m| m.get_mut(r#type))
            .expect("inserted above")
    }

    fn clear(&mut self) {
        self.0.clear();
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.0.values().flat_map(|m| m.values())
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.values_mut().flat_map(|m| m.values_mut())
    }
}

/// The controller's access to stated during a reconcile.
///
/// Every read is checked against the declared inputs and outputs, every write against the
/// declared outputs; writes carry the controller name as owner. The context remembers which
/// outputs the current cycle asserted (created, updated or found unchanged): after a successful
/// cycle the runtime tears down and destroys the controller's other resources of its output
/// types.
pub struct Context {
    client: Client,
    name: &'static str,
    inputs: Arc<[Input]>,
    outputs: Arc<[Output]>,
    /// Outputs asserted: by kind, the cycle that last asserted each ID. An ID is asserted in
    /// this cycle if that is [`cycle`](Self::cycle); kept across cycles (pruned at each start
    /// to the previous cycle's) so that asserting an output again allocates nothing.
    asserted: KindMap<std::collections::HashMap<String, u64>>,
    /// The current cycle's number.
    cycle: u64,
    /// This cycle's view of each output kind it wrote: listed once on the kind's first apply,
    /// then kept current with every write, so an apply costs no read and an unchanged output
    /// costs no call at all. A conflict falls back to a live read.
    seen: KindMap<std::collections::HashMap<String, RawResource>>,
    /// Every (namespace, type) of an output written since the controller started.
    written: BTreeSet<Kind>,
    /// Kinds with an output left tearing down (finalizers) or an apply deferred until an old
    /// resource of the same ID is gone.
    pending: BTreeSet<Kind>,
    /// Strong inputs as this cycle's lists from stated returned them, so that adding a
    /// finalizer to one costs one Update, not a Get and an Update (a strong input read from a
    /// cached kind is looked up there instead).
    listed_strong: std::sync::Mutex<std::collections::HashMap<Pointer, RawResource>>,
    /// Wakes the controller from outside stated.
    waker: Waker,
    /// The runtime's memory of the cached output kinds ([`Output::cached`]): once complete, it
    /// stands for this cycle's view of the kind (no List).
    caches: KindMap<Arc<KindCache>>,
}

/// Wakes a controller from outside stated (kernel events, a worker task's news), coalesced with
/// its other wake-ups exactly like an input change. Cheap to clone; it does not keep the
/// runtime alive: once the runtime stopped, [`wake`](Waker::wake) returns `false`.
#[derive(Clone, Debug, Default)]
pub struct Waker(Option<tokio::sync::mpsc::WeakSender<()>>);

impl Waker {
    /// Asks for a reconcile; a wake-up already pending absorbs this one. Returns `false` when
    /// the controller's runtime is gone (the caller may stop producing wake-ups).
    pub fn wake(&self) -> bool {
        match self
            .0
            .as_ref()
            .and_then(tokio::sync::mpsc::WeakSender::upgrade)
        {
            Some(tx) => {
                let _ = tx.try_send(());
                true
            }
            None => false,
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("controller", &self.name)
            .field(
                "asserted",
                &self
                    .asserted
                    .values()
                    .map(|ids| ids.values().filter(|c| **c == self.cycle).count())
                    .sum::<usize>(),
            )
            .finish_non_exhaustive()
    }
}

impl Context {
    pub(crate) fn new(
        client: Client,
        name: &'static str,
        inputs: Vec<Input>,
        outputs: Vec<Output>,
    ) -> Self {
        Self {
            client,
            name,
            inputs: inputs.into(),
            outputs: outputs.into(),
            asserted: KindMap::default(),
            cycle: 0,
            seen: KindMap::default(),
            written: BTreeSet::new(),
            pending: BTreeSet::new(),
            listed_strong: std::sync::Mutex::default(),
            waker: Waker::default(),
            caches: KindMap::default(),
        }
    }

    /// Sets the runtime's caches of the kinds this controller writes or reads (the cached
    /// output kinds of any controller of the runtime).
    pub(crate) fn with_caches(
        mut self,
        caches: impl IntoIterator<Item = (Kind, Arc<KindCache>)>,
    ) -> Self {
        for ((namespace, r#type), cache) in caches {
            self.caches.insert(&namespace, &r#type, cache);
        }
        self
    }

    /// The cache standing for this cycle's view of a kind: only if the cycle has not listed the
    /// kind itself (it keeps to one view per cycle) and the cache is complete.
    fn cache_view(&self, namespace: &str, r#type: &str) -> Option<&Arc<KindCache>> {
        if self.seen.contains(namespace, r#type) {
            return None;
        }
        self.caches.get(namespace, r#type).filter(|c| c.is_ready())
    }

    /// Sets the channel external wake-ups go to.
    pub(crate) fn with_wake(mut self, wake: &tokio::sync::mpsc::Sender<()>) -> Self {
        self.waker = Waker(Some(wake.downgrade()));
        self
    }

    /// A handle that wakes this controller from outside stated, for kernel event watchers and
    /// worker tasks the controller starts (DESIGN §3: kernel events are a wake stream).
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// The controller name: the owner of its outputs, and the usual finalizer string.
    pub fn name(&self) -> &'static str {
        self.name
    }

    // ---- reads -------------------------------------------------------------------------------

    /// Gets a resource of `S`; `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotAnInput`] if the resource is neither an input nor of an output type;
    /// State and decode errors.
    pub async fn get<S: ResourceSpec>(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<Resource<S>>, ReconcileError> {
        match self.get_raw(namespace, S::TYPE, id).await? {
            Some(raw) => Ok(Some(Resource::from_raw(&raw)?)),
            None => Ok(None),
        }
    }

    /// Lists the resources of `S` in `namespace`, sorted by ID.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotAnInput`] if the kind is neither an input (for all IDs) nor an
    /// output type; State and decode errors.
    pub async fn list<S: ResourceSpec>(
        &self,
        namespace: &str,
    ) -> Result<Vec<Resource<S>>, ReconcileError> {
        self.list_raw(namespace, S::TYPE, &Query::default())
            .await?
            .iter()
            .map(|r| Resource::from_raw(r).map_err(ReconcileError::from))
            .collect()
    }

    /// Brings `mirror` to the resources of `S` in `namespace` as [`list`](Self::list) would
    /// return them, decoding only the new and changed ones: from the runtime's memory of the
    /// kind when it keeps one ([`Output::cached`] by a controller of this runtime), else from
    /// one List.
    ///
    /// # Errors
    ///
    /// As [`list`](Self::list).
    pub async fn refresh<S: ResourceSpec>(
        &self,
        namespace: &str,
        mirror: &mut crate::runtime::Mirror<S>,
    ) -> Result<(), ReconcileError> {
        self.check_read(namespace, S::TYPE, None)?;
        if let Some(synced) = self.cached_read(namespace, S::TYPE, |m| mirror.sync_map(m)) {
            return Ok(synced?);
        }
        let listed = self.list_raw(namespace, S::TYPE, &Query::default()).await?;
        Ok(mirror.sync_list(&listed)?)
    }

    /// Gets a resource with an opaque spec; `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub async fn get_raw(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<Option<RawResource>, ReconcileError> {
        self.check_read(namespace, r#type, Some(id))?;
        if let Some(cached) = self.cached_read(namespace, r#type, |m| m.get(id).cloned()) {
            return Ok(cached);
        }
        match self.client.get(namespace, r#type, id).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Lists resources with opaque specs, filtered by `query`, sorted by ID.
    ///
    /// # Errors
    ///
    /// As [`list`](Self::list).
    pub async fn list_raw(
        &self,
        namespace: &str,
        r#type: &str,
        query: &Query,
    ) -> Result<Vec<RawResource>, ReconcileError> {
        self.check_read(namespace, r#type, None)?;
        if query.labels.is_empty() && query.id_regexp.is_none() {
            if let Some(listed) = self.cached_read(namespace, r#type, |m| {
                let mut v: Vec<RawResource> = m.values().cloned().collect();
                v.sort_unstable_by(|a, b| a.metadata.id.cmp(&b.metadata.id));
                v
            }) {
                return Ok(listed);
            }
        }
        let listed = self.client.list(namespace, r#type, query).await?;
        if self.inputs.iter().any(|i| {
            i.kind == InputKind::Strong && i.id.is_none() && i.covers(namespace, r#type, None)
        }) {
            let mut seen = self.listed_strong.lock().unwrap_or_else(|e| e.into_inner());
            for r in &listed {
                seen.insert(r.metadata.pointer(), r.clone());
            }
        }
        Ok(listed)
    }

    /// A read served by the memory of a kind this runtime caches ([`Output::cached`]), when it
    /// is complete and the cycle has not listed the kind from stated itself: no call to
    /// stated. It is as current as the last event of the kind, which is at least the one that
    /// woke the controller (one watch of the kind feeds the memory before it wakes anyone),
    /// and the owner's own writes. For a strong input, that is also the version a finalizer
    /// is added against: a resource changed since fails that compare-and-set, and is then
    /// read from stated and updated on its own ([`add_finalizers`](Self::add_finalizers)).
    fn cached_read<R>(
        &self,
        namespace: &str,
        r#type: &str,
        f: impl FnOnce(&std::collections::HashMap<String, RawResource>) -> R,
    ) -> Option<R> {
        let cache = self.caches.get(namespace, r#type)?;
        if self.seen.contains(namespace, r#type) {
            return None;
        }
        cache.with(f)
    }

    // ---- writes ------------------------------------------------------------------------------

    /// Creates or updates an output so that it has this spec, labels and annotations, owned by
    /// this controller, and marks it asserted for this cycle.
    ///
    /// Writes nothing when the stored resource already matches (its version does not move).
    /// A resource owned by this controller from an earlier run is adopted (updated in place).
    /// Finalizers others put on the resource are kept. A version conflict is retried.
    /// If an old resource of this ID is still tearing down with finalizers, nothing is written
    /// now and the runtime reconciles again once it can be replaced.
    ///
    /// Returns the resource as stored.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotAnOutput`] if `S` is not a declared output; an owner-conflict
    /// State error if another owner holds the ID; other State errors.
    pub async fn apply<S: ResourceSpec>(
        &mut self,
        resource: Resource<S>,
    ) -> Result<Resource<S>, ReconcileError> {
        let raw = resource.to_raw()?;
        let stored = self
            .apply_with(raw, |stored| {
                crate::resource::decode_spec::<S>(stored).is_ok_and(|s| s == resource.spec)
            })
            .await?;
        Ok(Resource {
            metadata: stored.metadata,
            spec: resource.spec,
        })
    }

    /// [`apply`](Self::apply) for an opaque spec, compared byte for byte.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub async fn apply_raw(
        &mut self,
        resource: RawResource,
    ) -> Result<RawResource, ReconcileError> {
        let spec = resource.spec.clone();
        self.apply_with(resource, |stored| stored == spec.as_slice())
            .await
    }

    async fn apply_with(
        &mut self,
        desired: RawResource,
        same_spec: impl Fn(&[u8]) -> bool,
    ) -> Result<RawResource, ReconcileError> {
        let ptr = self.prepare_write(&desired).await?;
        let first = self.believed(&ptr);
        let outcome = attempt(&self.client, self.name, &ptr, &desired, first, &same_spec).await?;
        if let Some(stored) = self.settle(&ptr, outcome) {
            return Ok(stored);
        }
        self.retry(&ptr, &desired, &same_spec).await
    }

    /// Applies every resource as [`apply`](Self::apply) does, with all the writes in one batch
    /// call to stated (a few, for many outputs: [`Client::write_batch`]) instead of one round
    /// trip each: for a controller with many outputs, a cycle then costs its writes, not their
    /// calls. Unchanged outputs cost nothing. An ID given twice is written once, with the last
    /// spec. Every write is made before this returns, also when one fails; the first error is
    /// returned.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub async fn apply_all<S: ResourceSpec>(
        &mut self,
        resources: impl IntoIterator<Item = Resource<S>>,
    ) -> Result<(), ReconcileError> {
        let mut items = Vec::new();
        for r in resources {
            items.push((std::borrow::Cow::Owned(r.to_raw()?), r.spec));
        }
        self.apply_many(items, |_, spec: &S, stored| {
            crate::resource::decode_spec::<S>(stored).is_ok_and(|s| s == *spec)
        })
        .await
    }

    /// [`apply_all`](Self::apply_all) for opaque, already encoded specs, compared byte for byte
    /// (as [`apply_raw`](Self::apply_raw)). Nothing is copied for an output that is already as
    /// given: a controller that keeps its encoded outputs between cycles pays one lookup each.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub async fn apply_all_raw<'r>(
        &mut self,
        resources: impl IntoIterator<Item = &'r RawResource>,
    ) -> Result<(), ReconcileError> {
        // A fn item, not a closure: a closure's signature would not be general enough over
        // the lifetime for the future to be `Send` (rust-lang/rust#89976).
        fn borrowed(r: &RawResource) -> (std::borrow::Cow<'_, RawResource>, ()) {
            (std::borrow::Cow::Borrowed(r), ())
        }
        fn same_bytes(desired: &RawResource, (): &(), stored: &[u8]) -> bool {
            stored == desired.spec.as_slice()
        }
        self.apply_many(resources.into_iter().map(borrowed), same_bytes)
            .await
    }

    /// The body of [`apply_all`](Self::apply_all): `same(desired, extra, stored)` says whether
    /// a stored spec is the desired one.
    async fn apply_many<'r, T>(
        &mut self,
        items: impl IntoIterator<Item = (std::borrow::Cow<'r, RawResource>, T)>,
        same: impl Fn(&RawResource, &T, &[u8]) -> bool,
    ) -> Result<(), ReconcileError> {
        let mut work: Vec<(Pointer, RawResource, T, Option<RawResource>)> = Vec::new();
        // An ID given twice is written once, as the last one (what writing both in turn
        // would leave): two writes of one resource in flight together would conflict.
        let mut index: KindMap<std::collections::HashMap<String, usize>> = KindMap::default();
        let mut indexed = false;
        // The kind of the previous output: its checks and view are not repeated per output.
        let mut prepared: Option<Kind> = None;
        for (raw, extra) in items {
            let md = &raw.metadata;
            if prepared
                .as_ref()
                .is_none_or(|(ns, ty)| *ns != md.namespace || *ty != md.r#type)
            {
                self.prepare_kind(&md.namespace, &md.r#type).await?;
                prepared = Some((md.namespace.clone(), md.r#type.clone()));
            }
            // The common case of a controller with many outputs: most are as believed. They
            // are asserted here, without a copy of the belief or a plan (an ID given again
            // later still replaces this one below, as the last one).
            let earlier = indexed
                .then(|| {
                    index
                        .get(&md.namespace, &md.r#type)
                        .and_then(|ids| ids.get(&md.id))
                        .copied()
                })
                .flatten();
            if earlier.is_none() && self.believed_unchanged(&raw) {
                self.assert_output(&md.namespace, &md.r#type, &md.id);
                continue;
            }
            let ptr = md.pointer();
            let current = self.believed(&ptr);
            let raw = raw.into_owned();
            match earlier {
                Some(i) => work[i] = (ptr, raw, extra, current),
                None => {
                    index
                        .get_or_default(&ptr.namespace, &ptr.r#type)
                        .insert(ptr.id.clone(), work.len());
                    indexed = true;
                    work.push((ptr, raw, extra, current));
                }
            }
        }
        // Plan every write from this cycle's beliefs, then make them all in one batch call
        // (a few, for many outputs) instead of one call each.
        let name = self.name;
        let mut planned = Vec::with_capacity(work.len());
        let mut batch = Vec::new();
        for (ptr, raw, extra, current) in work {
            let p = plan(name, &ptr, &raw, current, &|stored: &[u8]| {
                same(&raw, &extra, stored)
            });
            if let Ok(Plan::Write(w)) = &p {
                batch.push(w.clone());
            }
            planned.push((ptr, raw, extra, p));
        }
        let mut results = if batch.is_empty() {
            Vec::new()
        } else {
            self.client.write_batch(batch).await?
        }
        .into_iter();
        let mut outcomes = Vec::with_capacity(planned.len());
        for (ptr, raw, extra, p) in planned {
            let outcome = match p {
                Ok(Plan::Done(a)) => Ok(a),
                Ok(Plan::Write(w)) => match results.next() {
                    Some(r) => written(&ptr, &w, r),
                    None => {
                        Err(StateError::new(ErrorKind::Other, "a batch result is missing").into())
                    }
                },
                // Rare (an old output tearing down without finalizers): on its own.
                Ok(Plan::DestroyFirst) => {
                    let current = self.believed(&ptr);
                    let same = |stored: &[u8]| same(&raw, &extra, stored);
                    attempt(&self.client, name, &ptr, &raw, current, &same).await
                }
                Err(e) => Err(e),
            };
            outcomes.push((ptr, raw, extra, outcome));
        }
        let mut first_error = None;
        let mut stale = Vec::new();
        for (ptr, raw, extra, outcome) in outcomes {
            match outcome {
                Ok(o) => {
                    if self.settle(&ptr, o).is_none() {
                        stale.push((ptr, raw, extra));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        // A stale belief (another writer in between) is rare: retried one by one.
        for (ptr, raw, extra) in stale {
            let same = |stored: &[u8]| same(&raw, &extra, stored);
            self.retry(&ptr, &raw, &same).await?;
        }
        Ok(())
    }

    /// Checks that `desired` may be written and makes sure this cycle's view of its kind is
    /// loaded (one List per kind and cycle); returns its address.
    async fn prepare_write(&mut self, desired: &RawResource) -> Result<Pointer, ReconcileError> {
        let md = &desired.metadata;
        self.prepare_kind(&md.namespace, &md.r#type).await?;
        Ok(md.pointer())
    }

    /// Checks that a kind may be written and makes sure this cycle's view of it is loaded
    /// (one List per kind and cycle, none for a complete cache).
    async fn prepare_kind(&mut self, namespace: &str, r#type: &str) -> Result<(), ReconcileError> {
        self.check_write(r#type)?;
        if !self
            .written
            .iter()
            .any(|(ns, ty)| ns == namespace && ty == r#type)
        {
            self.written
                .insert((namespace.to_string(), r#type.to_string()));
        }
        if !self.seen.contains(namespace, r#type) && self.cache_view(namespace, r#type).is_none() {
            let listed = self
                .client
                .list(namespace, r#type, &Query::default())
                .await?;
            self.seen.insert(
                namespace,
                r#type,
                listed
                    .into_iter()
                    .map(|r| (r.metadata.id.clone(), r))
                    .collect(),
            );
        }
        Ok(())
    }

    /// Marks an output asserted in this cycle.
    fn assert_output(&mut self, namespace: &str, r#type: &str, id: &str) {
        let cycle = self.cycle;
        let ids = self.asserted.get_or_default(namespace, r#type);
        match ids.get_mut(id) {
            Some(c) => *c = cycle,
            None => {
                ids.insert(id.to_string(), cycle);
            }
        }
    }

    /// Whether an output is asserted in this cycle.
    fn is_asserted(&self, namespace: &str, r#type: &str, id: &str) -> bool {
        self.asserted
            .get(namespace, r#type)
            .is_some_and(|ids| ids.get(id) == Some(&self.cycle))
    }

    /// The output as this cycle's view has it.
    fn believed(&self, ptr: &Pointer) -> Option<RawResource> {
        if let Some(cache) = self.cache_view(&ptr.namespace, &ptr.r#type) {
            return cache.with(|m| m.get(&ptr.id).cloned()).flatten();
        }
        self.seen
            .get(&ptr.namespace, &ptr.r#type)
            .and_then(|m| m.get(&ptr.id))
            .cloned()
    }

    /// Whether this cycle's view has the output exactly as `desired` would leave it (what
    /// [`plan`] answers with `Done` and an asserted resource), without copying it.
    fn believed_unchanged(&self, desired: &RawResource) -> bool {
        let unchanged = |current: &RawResource| {
            let md = &current.metadata;
            md.owner == self.name
                && md.phase == Phase::Running
                && current.spec == desired.spec
                && md.labels == desired.metadata.labels
                && md.annotations == desired.metadata.annotations
        };
        let md = &desired.metadata;
        if let Some(cache) = self.cache_view(&md.namespace, &md.r#type) {
            return cache
                .with(|m| m.get(&md.id).is_some_and(unchanged))
                .unwrap_or(false);
        }
        self.seen
            .get(&md.namespace, &md.r#type)
            .and_then(|m| m.get(&md.id))
            .is_some_and(unchanged)
    }

    /// Records what an attempt did: the resource as stored, or `None` to retry.
    fn settle(&mut self, ptr: &Pointer, outcome: Attempt) -> Option<RawResource> {
        let stored = match outcome {
            Attempt::Asserted(stored) => {
                self.assert_output(&ptr.namespace, &ptr.r#type, &ptr.id);
                stored
            }
            Attempt::Deferred(current) => {
                self.pending
                    .insert((ptr.namespace.clone(), ptr.r#type.clone()));
                current
            }
            Attempt::Stale => return None,
        };
        if let Some(cache) = self.caches.get(&ptr.namespace, &ptr.r#type) {
            cache.record(&stored);
        }
        if let Some(m) = self.seen.get_mut(&ptr.namespace, &ptr.r#type) {
            m.insert(ptr.id.clone(), stored.clone());
        }
        Some(stored)
    }

    /// Attempts again after a stale belief, each time from a live read.
    async fn retry(
        &mut self,
        ptr: &Pointer,
        desired: &RawResource,
        same_spec: &impl Fn(&[u8]) -> bool,
    ) -> Result<RawResource, ReconcileError> {
        for _ in 1..MAX_WRITE_ATTEMPTS {
            let current = match self.client.get(&ptr.namespace, &ptr.r#type, &ptr.id).await {
                Ok(r) => Some(r),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e.into()),
            };
            let outcome =
                attempt(&self.client, self.name, ptr, desired, current, same_spec).await?;
            if let Some(stored) = self.settle(ptr, outcome) {
                return Ok(stored);
            }
        }
        Err(StateError::new(
            ErrorKind::Conflict,
            format!("{ptr}: still conflicting after {MAX_WRITE_ATTEMPTS} attempts"),
        )
        .into())
    }

    /// Starts tearing down an output of `S`; returns whether it has no finalizers left (or is
    /// gone). The output is no longer asserted this cycle.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotAnOutput`]; State errors.
    pub async fn teardown<S: ResourceSpec>(
        &mut self,
        namespace: &str,
        id: &str,
    ) -> Result<bool, ReconcileError> {
        self.teardown_raw(namespace, S::TYPE, id).await
    }

    /// [`teardown`](Self::teardown) by type name.
    ///
    /// # Errors
    ///
    /// As [`teardown`](Self::teardown).
    pub async fn teardown_raw(
        &mut self,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<bool, ReconcileError> {
        self.check_write(r#type)?;
        self.unassert(namespace, r#type, id);
        match self.client.teardown(namespace, r#type, id, self.name).await {
            Ok(ready) => {
                self.cached_tearing_down(namespace, r#type, id);
                Ok(ready)
            }
            Err(e) if e.is_not_found() => {
                self.cached_gone(namespace, r#type, id);
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Destroys an output of `S` (it must have no finalizers); a missing one is not an error.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotAnOutput`]; a conflict if finalizers remain; State errors.
    pub async fn destroy<S: ResourceSpec>(
        &mut self,
        namespace: &str,
        id: &str,
    ) -> Result<(), ReconcileError> {
        self.destroy_raw(namespace, S::TYPE, id).await
    }

    /// [`destroy`](Self::destroy) by type name.
    ///
    /// # Errors
    ///
    /// As [`destroy`](Self::destroy).
    pub async fn destroy_raw(
        &mut self,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<(), ReconcileError> {
        self.check_write(r#type)?;
        self.unassert(namespace, r#type, id);
        match self.client.destroy(namespace, r#type, id, self.name).await {
            Ok(()) => {
                self.cached_gone(namespace, r#type, id);
                Ok(())
            }
            Err(e) if e.is_not_found() => {
                self.cached_gone(namespace, r#type, id);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Adds `finalizer` to a strong input of `S`, in any phase.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotAnInput`] unless a strong input covers the resource; State errors
    /// (not found included).
    pub async fn add_finalizer<S: ResourceSpec>(
        &self,
        namespace: &str,
        id: &str,
        finalizer: &str,
    ) -> Result<(), ReconcileError> {
        self.check_strong(namespace, S::TYPE, id)?;
        Ok(self
            .client
            .add_finalizer(namespace, S::TYPE, id, finalizer)
            .await?)
    }

    /// Adds `finalizer` to every running resource of `resources` (strong inputs) that lacks
    /// it: what a spec controller does to the specs it is about to apply. Those listed this
    /// cycle, or in the runtime's memory of their kind, get it in one batch call (an update of
    /// each, as its owner); one changed meanwhile, or not known, is read and updated on its
    /// own. Every write is made before this returns; the first error is returned.
    ///
    /// # Errors
    ///
    /// As [`add_finalizer`](Self::add_finalizer).
    pub async fn add_finalizers<'r, S: ResourceSpec>(
        &self,
        resources: impl IntoIterator<Item = &'r Resource<S>>,
        finalizer: &str,
    ) -> Result<(), ReconcileError> {
        use futures::StreamExt;
        let (mut batch, mut batched) = (Vec::new(), Vec::new());
        let mut alone = Vec::new();
        for r in resources {
            if r.metadata.phase != Phase::Running || r.metadata.finalizers.contains(finalizer) {
                continue;
            }
            let (namespace, id) = (r.metadata.namespace.clone(), r.metadata.id.clone());
            self.check_strong(&namespace, S::TYPE, &id)?;
            let listed = self
                .listed_strong
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&Pointer {
                    namespace: namespace.clone(),
                    r#type: S::TYPE.to_string(),
                    id: id.clone(),
                })
                .cloned();
            // The memory may have moved on since `r` was read from it: only the version read
            // is updated in the batch, a later one on its own.
            let known = listed.or_else(|| {
                self.cached_read(&namespace, S::TYPE, |m| m.get(&id).cloned())
                    .flatten()
                    .filter(|c| c.metadata.version == r.metadata.version)
            });
            match known {
                Some(current) if !current.metadata.finalizers.contains(finalizer) => {
                    let mut new = current;
                    new.metadata.finalizers.insert(finalizer.to_string());
                    let owner = new.metadata.owner.clone();
                    batch.push(BatchWrite::Update {
                        resource: new,
                        owner,
                        expected_phase: None,
                    });
                    batched.push((namespace, id));
                }
                Some(_) => {}
                None => alone.push((namespace, id)),
            }
        }
        let mut first_error: Option<ReconcileError> = None;
        if !batch.is_empty() {
            tracing::debug!(count = batch.len(), finalizer, "adding finalizers");
            let results = self.client.write_batch(batch).await?;
            tracing::debug!(finalizer, "finalizers added");
            for (ptr, r) in batched.into_iter().zip(results) {
                match r {
                    Ok(_) => {}
                    // Changed since it was listed: read it again and add the finalizer.
                    Err(e) if e.kind() == ErrorKind::Conflict => alone.push(ptr),
                    Err(e) => {
                        first_error.get_or_insert(e.into());
                    }
                }
            }
        }
        let adds = alone.into_iter().map(|(namespace, id)| async move {
            self.add_finalizer::<S>(&namespace, &id, finalizer).await
        });
        let results: Vec<_> = futures::stream::iter(adds)
            .buffer_unordered(APPLY_IN_FLIGHT)
            .collect()
            .await;
        for r in results {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Removes `finalizer` from a strong input of `S`; a missing resource is not an error.
    ///
    /// # Errors
    ///
    /// As [`add_finalizer`](Self::add_finalizer), without not found.
    pub async fn remove_finalizer<S: ResourceSpec>(
        &self,
        namespace: &str,
        id: &str,
        finalizer: &str,
    ) -> Result<(), ReconcileError> {
        self.check_strong(namespace, S::TYPE, id)?;
        Ok(self
            .client
            .remove_finalizer(namespace, S::TYPE, id, finalizer)
            .await?)
    }

    // ---- access checks -----------------------------------------------------------------------

    fn is_output(&self, r#type: &str) -> bool {
        self.outputs.iter().any(|o| o.r#type == r#type)
    }

    fn check_read(
        &self,
        namespace: &str,
        r#type: &str,
        id: Option<&str>,
    ) -> Result<(), ReconcileError> {
        if self.is_output(r#type) || self.inputs.iter().any(|i| i.covers(namespace, r#type, id)) {
            return Ok(());
        }
        Err(ReconcileError::NotAnInput {
            controller: self.name,
            namespace: namespace.to_string(),
            r#type: r#type.to_string(),
            id: id.map(str::to_string),
            what: "an input or output",
        })
    }

    fn check_strong(&self, namespace: &str, r#type: &str, id: &str) -> Result<(), ReconcileError> {
        if self
            .inputs
            .iter()
            .any(|i| i.kind == InputKind::Strong && i.covers(namespace, r#type, Some(id)))
        {
            return Ok(());
        }
        Err(ReconcileError::NotAnInput {
            controller: self.name,
            namespace: namespace.to_string(),
            r#type: r#type.to_string(),
            id: Some(id.to_string()),
            what: "a strong input",
        })
    }

    fn check_write(&self, r#type: &str) -> Result<(), ReconcileError> {
        if self.is_output(r#type) {
            Ok(())
        } else {
            Err(ReconcileError::NotAnOutput {
                controller: self.name,
                r#type: r#type.to_string(),
            })
        }
    }

    /// Tells the kind's cache (if any) that this controller destroyed `id` or found it gone.
    fn cached_gone(&self, namespace: &str, r#type: &str, id: &str) {
        if let Some(c) = self.caches.get(namespace, r#type) {
            c.forget(id);
        }
    }

    /// Tells the kind's cache (if any) that this controller started tearing `id` down.
    fn cached_tearing_down(&self, namespace: &str, r#type: &str, id: &str) {
        if let Some(c) = self.caches.get(namespace, r#type) {
            c.tearing_down(id);
        }
    }

    fn unassert(&mut self, namespace: &str, r#type: &str, id: &str) {
        if let Some(ids) = self.asserted.get_mut(namespace, r#type) {
            ids.remove(id);
        }
    }

    // ---- the cycle, for the runtime ----------------------------------------------------------

    /// Starts a cycle: nothing is asserted yet.
    pub(crate) fn begin_cycle(&mut self) {
        let last = self.cycle;
        for ids in self.asserted.values_mut() {
            ids.retain(|_, c| *c == last);
        }
        self.cycle += 1;
        self.seen.clear();
        self.pending.clear();
        self.listed_strong
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Ends a successful cycle: tears down and destroys every resource of an output kind owned
    /// by this controller that the cycle did not assert. Resources whose finalizers remain stay
    /// tearing down and are destroyed by a later cycle.
    pub(crate) async fn cleanup(&mut self) -> Result<(), ReconcileError> {
        let mut kinds: BTreeSet<Kind> = self
            .outputs
            .iter()
            .map(|o| (o.namespace.clone(), o.r#type.clone()))
            .collect();
        kinds.extend(self.written.iter().cloned());
        for (namespace, r#type) in kinds {
            // A kind this cycle wrote was listed on its first apply and kept current with every
            // write since, and only this controller writes, tears down or destroys its outputs:
            // that view serves instead of a second list. Only finalizers are others' to change
            // meanwhile: for an output already tearing down, the teardown call says whether
            // they are gone by now.
            // A cached kind's memory serves the same way: it is current with every write of
            // this controller, and with others' changes as their events arrive.
            let (asserted, cycle) = (self.asserted.get(&namespace, &r#type), self.cycle);
            let unasserted = |view: &std::collections::HashMap<String, RawResource>| {
                view.values()
                    .filter(|r| {
                        r.metadata.owner == self.name
                            && asserted.is_none_or(|ids| ids.get(&r.metadata.id) != Some(&cycle))
                    })
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let cached = self
                .cache_view(&namespace, &r#type)
                .and_then(|c| c.with(|view| unasserted(view)));
            let (stored, fresh) = match (self.seen.get(&namespace, &r#type), cached) {
                (Some(view), _) => (unasserted(view), false),
                (None, Some(stored)) => (stored, false),
                (None, None) => (
                    self.client
                        .list(&namespace, &r#type, &Query::default())
                        .await?,
                    true,
                ),
            };
            for r in stored {
                let md = &r.metadata;
                if md.owner != self.name || self.is_asserted(&namespace, &r#type, &md.id) {
                    continue;
                }
                let ready = match md.phase {
                    Phase::TearingDown if fresh => md.finalizers.is_empty(),
                    // Tearing down is idempotent and says whether the finalizers are gone now.
                    Phase::Running | Phase::TearingDown => {
                        match self
                            .client
                            .teardown(&namespace, &r#type, &md.id, self.name)
                            .await
                        {
                            Ok(ready) => {
                                self.cached_tearing_down(&namespace, &r#type, &md.id);
                                ready
                            }
                            Err(e) if e.is_not_found() => {
                                self.cached_gone(&namespace, &r#type, &md.id);
                                continue;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                };
                if !ready {
                    tracing::debug!(resource = %md.pointer(), "output waits for finalizers");
                    self.pending.insert((namespace.clone(), r#type.clone()));
                    continue;
                }
                match self
                    .client
                    .destroy(&namespace, &r#type, &md.id, self.name)
                    .await
                {
                    Ok(()) => {
                        self.cached_gone(&namespace, &r#type, &md.id);
                        tracing::debug!(resource = %md.pointer(), "output destroyed");
                    }
                    Err(e) if e.is_not_found() => self.cached_gone(&namespace, &r#type, &md.id),
                    Err(e) if e.kind() == ErrorKind::Conflict => {
                        self.pending.insert((namespace.clone(), r#type.clone()));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Whether the cycle left work that no declared input will wake the controller for: an
    /// output waiting for finalizers in a kind the controller does not watch.
    pub(crate) fn needs_poll(&self) -> bool {
        self.pending.iter().any(|(ns, ty)| {
            !self
                .inputs
                .iter()
                .any(|i| i.id.is_none() && i.namespace == *ns && i.r#type == *ty)
        })
    }
}

/// One attempt of an apply against `current` (what the output is believed to be). Changes
/// nothing in the context: [`Context::settle`] records the outcome.
async fn attempt(
    client: &Client,
    name: &'static str,
    ptr: &Pointer,
    desired: &RawResource,
    current: Option<RawResource>,
    same_spec: &impl Fn(&[u8]) -> bool,
) -> Result<Attempt, ReconcileError> {
    match plan(name, ptr, desired, current, same_spec)? {
        Plan::Done(a) => Ok(a),
        Plan::Write(w) => {
            let result = match &w {
                BatchWrite::Create { resource, owner } => client.create(resource, owner).await,
                BatchWrite::Update {
                    resource,
                    owner,
                    expected_phase,
                } => client.update(resource, owner, *expected_phase).await,
                BatchWrite::Destroy { .. } => {
                    return Err(StateError::new(ErrorKind::Other, "no destroy is planned").into())
                }
            };
            written(ptr, &w, result.map(Some))
        }
        Plan::DestroyFirst => {
            match client
                .destroy(&ptr.namespace, &ptr.r#type, &ptr.id, name)
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_not_found() || e.kind() == ErrorKind::Conflict => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Attempt::Stale)
        }
    }
}

/// What writing `desired` over `current` (this cycle's belief) takes.
enum Plan {
    /// Nothing to write.
    Done(Attempt),
    /// One create or update.
    Write(BatchWrite),
    /// The old resource is tearing down without finalizers: destroy it, then write again.
    DestroyFirst,
}

fn plan(
    name: &'static str,
    ptr: &Pointer,
    desired: &RawResource,
    current: Option<RawResource>,
    same_spec: &impl Fn(&[u8]) -> bool,
) -> Result<Plan, ReconcileError> {
    let Some(current) = current else {
        let mut new = desired.clone();
        new.metadata.owner = name.to_string();
        new.metadata.version = 0;
        new.metadata.phase = Phase::Running;
        return Ok(Plan::Write(BatchWrite::Create {
            resource: new,
            owner: name.to_string(),
        }));
    };
    let md = &current.metadata;
    if md.owner != name {
        return Err(StateError::new(
            ErrorKind::OwnerConflict,
            format!(
                "{}: {ptr} is owned by {:?}, not {:?}",
                crate::error::OWNER_CONFLICT_PREFIX,
                md.owner,
                name
            ),
        )
        .into());
    }
    if md.phase == Phase::TearingDown {
        if !md.finalizers.is_empty() {
            // The old resource waits for its finalizers; replace it once they are gone.
            tracing::debug!(resource = %ptr, "output still tearing down, apply deferred");
            return Ok(Plan::Done(Attempt::Deferred(current)));
        }
        return Ok(Plan::DestroyFirst);
    }
    // Equal bytes are the common case (one encoder); otherwise the specs are compared decoded.
    if (current.spec == desired.spec || same_spec(&current.spec))
        && md.labels == desired.metadata.labels
        && md.annotations == desired.metadata.annotations
    {
        return Ok(Plan::Done(Attempt::Asserted(current)));
    }
    let mut new = desired.clone();
    new.metadata.owner = name.to_string();
    new.metadata.version = md.version;
    new.metadata.phase = Phase::Running;
    new.metadata.finalizers = md.finalizers.clone();
    new.metadata.created = md.created;
    Ok(Plan::Write(BatchWrite::Update {
        resource: new,
        owner: name.to_string(),
        expected_phase: Some(Phase::Running),
    }))
}

/// What a planned write's result means: asserted as stored, or a stale belief.
fn written(
    ptr: &Pointer,
    w: &BatchWrite,
    result: Result<Option<RawResource>, StateError>,
) -> Result<Attempt, ReconcileError> {
    let create = matches!(w, BatchWrite::Create { .. });
    match result {
        Ok(Some(stored)) => {
            tracing::debug!(
                resource = %ptr,
                version = stored.metadata.version,
                "output {}",
                if create { "created" } else { "updated" }
            );
            Ok(Attempt::Asserted(stored))
        }
        Ok(None) => Err(StateError::new(ErrorKind::Other, "a write returned no resource").into()),
        Err(e) if create && e.kind() == ErrorKind::AlreadyExists => Ok(Attempt::Stale),
        Err(e)
            if !create
                && matches!(
                    e.kind(),
                    ErrorKind::Conflict | ErrorKind::NotFound | ErrorKind::PhaseConflict
                ) =>
        {
            Ok(Attempt::Stale)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::controller::Output;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct In;
    impl ResourceSpec for In {
        const TYPE: &'static str = "Ins.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "a";
    }
    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Out;
    impl ResourceSpec for Out {
        const TYPE: &'static str = "Outs.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "b";
    }

    fn ctx() -> Context {
        // The checks fail before any call, so the socket is never dialed.
        let client = Client::new("/nonexistent/stated.sock").expect("lazy client");
        Context::new(
            client,
            "test.Controller",
            vec![
                Input::weak::<In>("a").with_id("one"),
                Input::strong::<In>("s"),
            ],
            vec![Output::exclusive::<Out>()],
        )
    }

    #[tokio::test]
    async fn undeclared_access_is_refused_before_any_call() {
        let mut c = ctx();
        assert!(matches!(
            c.list::<In>("a").await,
            Err(ReconcileError::NotAnInput { id: None, .. })
        ));
        assert!(matches!(
            c.get::<In>("a", "two").await,
            Err(ReconcileError::NotAnInput { .. })
        ));
        assert!(matches!(
            c.apply(Resource::new("a", "x", In)).await,
            Err(ReconcileError::NotAnOutput { .. })
        ));
        assert!(matches!(
            c.destroy::<In>("a", "x").await,
            Err(ReconcileError::NotAnOutput { .. })
        ));
        assert!(matches!(
            c.add_finalizer::<In>("a", "one", "f").await,
            Err(ReconcileError::NotAnInput {
                what: "a strong input",
                ..
            })
        ));
        let e = c.get::<In>("a", "two").await.expect_err("refused");
        assert_eq!(
            e.to_string(),
            "controller test.Controller does not declare a/Ins.test.talos.dev/two as an input or output"
        );
    }

    #[tokio::test]
    async fn checks_allow_declared_access() {
        let c = ctx();
        assert!(c.check_read("a", In::TYPE, Some("one")).is_ok());
        assert!(c.check_read("s", In::TYPE, None).is_ok());
        assert!(c.check_read("anywhere", Out::TYPE, None).is_ok());
        assert!(c.check_strong("s", In::TYPE, "x").is_ok());
        assert!(c.check_write(Out::TYPE).is_ok());
    }

    #[tokio::test]
    async fn poll_only_for_unwatched_pending_kinds() {
        let mut c = ctx();
        assert!(!c.needs_poll());
        c.pending.insert(("s".into(), In::TYPE.into()));
        assert!(!c.needs_poll());
        c.pending.insert(("b".into(), Out::TYPE.into()));
        assert!(c.needs_poll());
    }
}
