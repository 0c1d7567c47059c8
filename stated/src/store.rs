//! The resource store: resources by (namespace, type, id), a bounded history of events per
//! (namespace, type) that watches pull from, and persistence of every write before it is
//! acknowledged. Schema-less: specs are opaque bytes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bytes::Bytes;
use cosi::definition::{NamespaceSpec, ResourceDefinition, META_NAMESPACE};
use cosi::error::{ErrorKind, StateError, OWNER_CONFLICT_PREFIX, PHASE_PREFIX};
use cosi::resource::{Metadata, Phase, RawResource, ResourceSpec};
use prost::Message as _;
use tokio::sync::watch;

use crate::access::check_name;
use crate::labels::Filter;
use crate::persist::{frame, frame_record, DurableFiles, Header, PersistError, Record, RunFiles};

/// Largest spec accepted.
pub const MAX_SPEC: usize = 1024 * 1024;
/// Largest total size of labels, annotations and finalizers of one resource.
pub const MAX_METADATA: usize = 64 * 1024;
/// Events kept per (namespace, type) for watches to resume from.
pub const DEFAULT_HISTORY: usize = 4096;
/// Events kept per kind whose type is defined sensitive (keys, a configuration with secrets,
/// an etcd backup on its way): their past versions do not linger in memory. A watcher of such
/// a kind that falls further behind resumes by relisting, as any watcher behind the history.
pub const SENSITIVE_HISTORY: usize = 4;
/// The owner of resources stated writes itself (namespaces, meta definitions).
pub const STATED_OWNER: &str = "stated";

/// What stated keeps at most, so that nothing a client sends grows its memory or disk without
/// bound. Reaching a limit is `LimitReached` (gRPC RESOURCE_EXHAUSTED) with a message naming it.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Resources in one namespace.
    pub resources_per_namespace: usize,
    /// Bytes of resources (specs and metadata) in one namespace.
    pub bytes_per_namespace: usize,
    /// Resource types in one namespace.
    pub types_per_namespace: usize,
    /// Bytes of past versions kept in the watch history, over all kinds: beyond it the oldest
    /// events go first (a watch behind them resumes by relisting).
    pub history_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            resources_per_namespace: 262_144,
            bytes_per_namespace: 256 * 1024 * 1024,
            types_per_namespace: 1024,
            history_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The log is compacted once it holds more than twice the live data, and at least this much.
const MIN_COMPACT_BYTES: u64 = 4 * 1024 * 1024;

/// What the store holds, for tests and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Stored resources.
    pub resources: usize,
    /// Their bytes (specs and metadata).
    pub live_bytes: usize,
    /// (namespace, type) collections in memory, including those only watched.
    pub collections: usize,
    /// Events kept in the watch history.
    pub history_events: usize,
    /// Bytes of the resources those events hold.
    pub history_bytes: usize,
    /// Bytes of the run log since its last compaction.
    pub log_bytes: u64,
}

/// Memory a resource takes, as the limits count it.
fn size_of(r: &RawResource) -> usize {
    let md = &r.metadata;
    r.spec.len()
        + r.yaml_spec.len()
        + md.namespace.len()
        + md.r#type.len()
        + md.id.len()
        + md.owner.len()
        + md.labels
            .iter()
            .chain(&md.annotations)
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + md.finalizers.iter().map(String::len).sum::<usize>()
        + 128
}

/// Resources and bytes of one namespace.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    resources: usize,
    bytes: usize,
}

fn limit(msg: String) -> StateError {
    StateError::new(ErrorKind::LimitReached, msg)
}

/// (namespace, type).
pub type Kind = (String, String);

/// What happened to a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Created,
    /// Updated.
    Updated,
    /// Destroyed.
    Destroyed,
}

/// One write, as kept in the history.
#[derive(Debug)]
pub struct StoredEvent {
    /// Global sequence number of the write: the bookmark position.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    /// The resource after the write (before it, for a destroy).
    pub resource: Arc<RawResource>,
    /// The resource before an update.
    pub old: Option<Arc<RawResource>>,
    /// `resource` encoded (a `cosi.resource.Resource` message): encoded once, at the write, for
    /// the run log, the writer's reply and every watcher's event.
    pub encoded: Bytes,
    /// The event encoded as sent on the wire when no filter rewrites it, without the old
    /// resource: encoded once, by the first watcher, and shared by the others (a reference
    /// count, not a copy).
    pub wire: std::sync::OnceLock<Bytes>,
    /// The same, of an update, with the old resource (for watchers that did not ask to omit it).
    pub wire_with_old: std::sync::OnceLock<Bytes>,
    /// What it holds, as counted against the history limit: the resource, and its wire forms
    /// (the resource, and again with the old one) whether or not a watcher encoded them yet.
    size: usize,
}

/// A stored resource, ordered and found by its ID: the ID is kept once, in the resource (a map
/// keyed by a copy of it cost a second allocation and 24 bytes more per resource).
struct ById(Arc<RawResource>);

impl std::borrow::Borrow<str> for ById {
    fn borrow(&self) -> &str {
        &self.0.metadata.id
    }
}

impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.metadata.id == other.0.metadata.id
    }
}

impl Eq for ById {}

impl PartialOrd for ById {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ById {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.metadata.id.cmp(&other.0.metadata.id)
    }
}

/// The resources of one kind, sorted by ID.
#[derive(Default)]
struct Items(BTreeSet<ById>);

impl Items {
    fn get(&self, id: &str) -> Option<&Arc<RawResource>> {
        self.0.get(id).map(|r| &r.0)
    }

    /// Inserts or replaces the resource of its ID; returns the one it replaced.
    fn insert(&mut self, r: Arc<RawResource>) -> Option<Arc<RawResource>> {
        self.0.replace(ById(r)).map(|r| r.0)
    }

    fn remove(&mut self, id: &str) -> Option<Arc<RawResource>> {
        self.0.take(id).map(|r| r.0)
    }

    fn values(&self) -> impl Iterator<Item = &Arc<RawResource>> + '_ {
        self.0.iter().map(|r| &r.0)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

struct Collection {
    items: Items,
    history: VecDeque<Arc<StoredEvent>>,
    /// Every event of this collection with a sequence number above `floor` is in `history`.
    floor: u64,
    notify: watch::Sender<u64>,
}

impl Collection {
    fn new(floor: u64) -> Self {
        Self {
            items: Items::default(),
            history: VecDeque::new(),
            floor,
            notify: watch::Sender::new(floor),
        }
    }
}

struct Inner {
    seq: u64,
    /// Position from which this run state holds every event (the loaded snapshot's): a kind
    /// without history has missed nothing after it.
    base: u64,
    epoch: u64,
    history_cap: usize,
    collections: HashMap<Kind, Collection>,
    run: Option<RunFiles>,
    resources: usize,
    log_records: usize,
    limits: Limits,
    live_bytes: usize,
    usage: HashMap<String, Usage>,
    history_bytes: usize,
    history_events: usize,
    /// The types whose definition in `meta` is sensitive: their kinds keep
    /// [`SENSITIVE_HISTORY`] events.
    sensitive: std::collections::HashSet<String>,
}

/// A checked write that has not changed anything yet: what [`Inner::commit`] applies.
struct Prepared {
    kind: EventKind,
    /// The resource after the write (before it, for a destroy).
    resource: Arc<RawResource>,
    /// The resource before an update.
    old: Option<Arc<RawResource>>,
}

/// A resource as a write left it, and its encoding (a `cosi.resource.Resource` message), made
/// once for the log, the reply and the watchers.
#[derive(Clone, Debug)]
pub struct Written {
    /// The resource.
    pub resource: Arc<RawResource>,
    /// Its encoding.
    pub encoded: Bytes,
}

/// Encodes a resource as a `cosi.resource.Resource` message.
pub fn encode_resource(r: &RawResource) -> Bytes {
    Bytes::from(r.to_proto().encode_to_vec())
}

/// The store. All methods are synchronous; all but the writes of durable namespaces are short
/// (the store lock is never held across a disk write that syncs). Watches wait on
/// [`Store::subscribe`].
pub struct Store {
    inner: Mutex<Inner>,
    /// The durable namespaces' files, written (and synced) without the store lock.
    durable: Option<DurableFiles>,
    durable_namespaces: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// Held by a write of a durable namespace from its checks to its commit, so that no other
    /// write of a durable namespace comes between (nothing else writes those namespaces).
    durable_writes: Mutex<()>,
    /// Called by a durable write once its file is about to be written (tests: a slow disk).
    #[cfg(test)]
    durable_pause: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

/// Errors opening the store.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Files could not be read or written.
    #[error("cannot load state")]
    Persist(#[from] PersistError),
    /// A stored resource is invalid.
    #[error("invalid stored resource")]
    Invalid(#[from] StateError),
}

/// Where the store keeps its files.
pub struct StoreConfig<'a> {
    /// Run state (until reboot); `None` keeps nothing (tests of pure logic).
    pub run_dir: Option<&'a Path>,
    /// Durable namespaces (across reboots).
    pub state_dir: Option<&'a Path>,
    /// Which namespaces are durable.
    pub durable: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// Namespaces that exist from the start (from the manifest), with descriptions.
    pub namespaces: Vec<(String, String)>,
    /// Events kept per (namespace, type).
    pub history: usize,
    /// What the store keeps at most.
    pub limits: Limits,
}

fn new_epoch() -> u64 {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut x = (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
    // splitmix64: spread the bits.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)).max(1)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (every mutation is a single insert
    // after all checks), so poisoning is not a reason to stop serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops a collection's oldest events beyond `cap`: (events, bytes) dropped.
fn shorten(c: &mut Collection, cap: usize) -> (usize, usize) {
    let mut dropped = (0usize, 0usize);
    while c.history.len() > cap {
        if let Some(e) = c.history.pop_front() {
            c.floor = e.seq;
            dropped.0 += 1;
            dropped.1 += e.size;
        }
    }
    dropped
}

fn kind_of(md: &Metadata) -> Kind {
    (md.namespace.clone(), md.r#type.clone())
}

fn validate(r: &RawResource) -> Result<(), StateError> {
    let md = &r.metadata;
    check_name("namespace", &md.namespace)?;
    check_name("type", &md.r#type)?;
    check_name("id", &md.id)?;
    if r.spec.len() + r.yaml_spec.len() > MAX_SPEC {
        return Err(StateError::new(
            ErrorKind::InvalidArgument,
            format!(
                "spec of {} bytes exceeds the limit of {MAX_SPEC}",
                r.spec.len() + r.yaml_spec.len()
            ),
        ));
    }
    let meta_size: usize = md
        .labels
        .iter()
        .chain(&md.annotations)
        .map(|(k, v)| k.len() + v.len())
        .sum::<usize>()
        + md.finalizers.iter().map(String::len).sum::<usize>()
        + md.owner.len();
    if meta_size > MAX_METADATA {
        return Err(StateError::new(
            ErrorKind::InvalidArgument,
            format!("labels, annotations and finalizers of {meta_size} bytes exceed the limit of {MAX_METADATA}"),
        ));
    }
    if md.labels.keys().any(|k| k.is_empty()) {
        return Err(StateError::new(
            ErrorKind::InvalidArgument,
            "empty label key",
        ));
    }
    Ok(())
}

fn not_found(ns: &str, ty: &str, id: &str) -> StateError {
    StateError::new(
        ErrorKind::NotFound,
        format!("resource {ns}/{ty}/{id} doesn't exist"),
    )
}

fn owner_conflict(md: &Metadata, owner: &str) -> StateError {
    StateError::new(
        ErrorKind::OwnerConflict,
        format!(
            "{OWNER_CONFLICT_PREFIX}: resource {}/{}/{} is owned by {:?}, not {owner:?}",
            md.namespace, md.r#type, md.id, md.owner
        ),
    )
}

fn persist_error(e: PersistError) -> StateError {
    tracing::error!(error = %cosi::error::Chain(&e), "persisting a write failed");
    StateError::new(
        ErrorKind::Unavailable,
        format!("cannot persist write: {}", cosi::error::Chain(&e)),
    )
}

/// A bookmark: 8-byte epoch of the run state and 8-byte sequence number, big-endian.
pub fn encode_bookmark(epoch: u64, seq: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&epoch.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    b
}

impl Store {
    /// Opens (loads) the store.
    pub fn open(cfg: StoreConfig<'_>) -> Result<Self, OpenError> {
        let mut inner = Inner {
            seq: 0,
            base: 0,
            epoch: new_epoch(),
            history_cap: cfg.history.max(16),
            collections: HashMap::new(),
            run: None,
            resources: 0,
            log_records: 0,
            limits: cfg.limits,
            live_bytes: 0,
            usage: HashMap::new(),
            history_bytes: 0,
            history_events: 0,
            sensitive: std::collections::HashSet::new(),
        };
        let durable = cfg.state_dir.map(DurableFiles::open).transpose()?;
        let durable_namespaces = cfg.durable;
        let mut fresh = true;
        if let Some(dir) = cfg.run_dir {
            let (run, loaded) = RunFiles::open(dir)?;
            inner.run = Some(run);
            if let Some(h) = loaded.header {
                fresh = false;
                inner.epoch = h.epoch;
                inner.seq = h.seq;
                inner.base = h.seq;
                for r in loaded.snapshot {
                    inner.load(RawResource::from_proto(r)?);
                }
                for rec in loaded.log {
                    if rec.seq <= h.seq {
                        continue;
                    }
                    inner.replay(rec)?;
                    inner.log_records += 1;
                }
            }
        }
        if fresh {
            // A new boot: durable namespaces come back from the state directory.
            if let Some(d) = &durable {
                let mut found = Vec::new();
                for name in durable_names(cfg.state_dir, &cfg.namespaces, &durable_namespaces) {
                    found.extend(d.load(&name)?);
                }
                for r in found {
                    inner.load(RawResource::from_proto(r)?);
                }
            }
        } else if let Some(d) = &durable {
            // Restart in place: the run state is the truth; make the durable files agree with it
            // (a kill between the durable write and the log append leaves them one write ahead).
            let namespaces: Vec<String> = inner
                .collections
                .keys()
                .map(|k| k.0.clone())
                .filter(|ns| durable_namespaces(ns))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            for ns in namespaces {
                d.write(&ns, inner.namespace_items(&ns).map(|r| r.as_ref()))
                    .map_err(OpenError::Persist)?;
            }
        }
        let store = Store {
            inner: Mutex::new(inner),
            durable,
            durable_namespaces,
            durable_writes: Mutex::new(()),
            #[cfg(test)]
            durable_pause: Mutex::new(None),
        };
        store.register_meta(&cfg.namespaces)?;
        {
            let mut inner = lock(&store.inner);
            if fresh {
                inner.compact()?;
            }
        }
        Ok(store)
    }

    fn register_meta(&self, namespaces: &[(String, String)]) -> Result<(), StateError> {
        for def in [
            ResourceDefinition::definition(),
            NamespaceSpec::definition(),
        ] {
            self.ensure_internal(META_NAMESPACE, ResourceDefinition::TYPE, &def.id(), &def)?;
        }
        self.ensure_internal(
            META_NAMESPACE,
            NamespaceSpec::TYPE,
            META_NAMESPACE,
            &NamespaceSpec {
                description: "Namespaces and resource definitions.".into(),
            },
        )?;
        for (ns, description) in namespaces {
            self.ensure_internal(
                META_NAMESPACE,
                NamespaceSpec::TYPE,
                ns,
                &NamespaceSpec {
                    description: description.clone(),
                },
            )?;
        }
        Ok(())
    }

    /// Creates or refreshes a resource that stated itself owns.
    fn ensure_internal<S: serde::Serialize>(
        &self,
        ns: &str,
        ty: &str,
        id: &str,
        spec: &S,
    ) -> Result<(), StateError> {
        let bytes = cosi::resource::encode_spec(spec)
            .map_err(|e| StateError::new(ErrorKind::Other, cosi::error::Chain(&e).to_string()))?;
        self.write(ns, |inner| {
            let w = match inner.get(ns, ty, id) {
                Some(cur) if cur.spec == bytes => None,
                Some(cur) => {
                    let mut r = (*cur).clone();
                    r.spec = bytes;
                    Some(inner.prepare_update(r, STATED_OWNER, None)?)
                }
                None => {
                    let r = RawResource {
                        metadata: Metadata::new(ns, ty, id),
                        spec: bytes,
                        yaml_spec: String::new(),
                    };
                    Some(inner.prepare_create(r, STATED_OWNER)?)
                }
            };
            Ok((w, ()))
        })
    }

    /// Whether writes of `ns` are durable (written to the state directory, synced, before they
    /// are acknowledged). Such a write waits for the disk: call it where blocking is allowed.
    pub fn is_durable(&self, ns: &str) -> bool {
        self.durable.is_some() && (self.durable_namespaces)(ns)
    }

    /// Checks a write with `op` and commits it. The write of a durable namespace's file, and
    /// its sync, happen without the store lock: other writers and watchers do not wait for the
    /// disk. Nothing changes in memory if persisting fails.
    fn write<T>(
        &self,
        ns: &str,
        op: impl FnOnce(&Inner) -> Result<(Option<Prepared>, T), StateError>,
    ) -> Result<T, StateError> {
        Ok(self.write_encoded(ns, op)?.0)
    }

    /// [`Store::write`], also returning the written resource's encoding (`None` if nothing
    /// was written).
    fn write_encoded<T>(
        &self,
        ns: &str,
        op: impl FnOnce(&Inner) -> Result<(Option<Prepared>, T), StateError>,
    ) -> Result<(T, Option<Bytes>), StateError> {
        let durable = match &self.durable {
            Some(d) if (self.durable_namespaces)(ns) => d,
            _ => {
                let mut inner = lock(&self.inner);
                let (w, out) = op(&inner)?;
                let encoded = match w {
                    Some(w) => Some(inner.commit(w)?),
                    None => None,
                };
                return Ok((out, encoded));
            }
        };
        let _serial = lock(&self.durable_writes);
        let (w, out, after) = {
            let inner = lock(&self.inner);
            let (w, out) = op(&inner)?;
            let Some(w) = w else { return Ok((out, None)) };
            let after = inner.namespace_after(ns, &w);
            (w, out, after)
        };
        #[cfg(test)]
        if let Some(pause) = lock(&self.durable_pause).clone() {
            pause();
        }
        durable
            .write(ns, after.iter().map(|r| r.as_ref()))
            .map_err(persist_error)?;
        // Nothing wrote this namespace meanwhile (`durable_writes`): the checks still hold.
        let encoded = lock(&self.inner).commit(w)?;
        Ok((out, Some(encoded)))
    }

    /// Makes every durable write call `pause` (without the store lock) before its file is
    /// written: a disk as slow as the test wants.
    #[cfg(test)]
    pub(crate) fn pause_durable_writes(&self, pause: Option<Arc<dyn Fn() + Send + Sync>>) {
        *lock(&self.durable_pause) = pause;
    }

    /// The bookmark epoch of this run state.
    pub fn epoch(&self) -> u64 {
        lock(&self.inner).epoch
    }

    /// The sequence number of the last write.
    pub fn seq(&self) -> u64 {
        lock(&self.inner).seq
    }

    /// Gets one resource.
    pub fn get(&self, ns: &str, ty: &str, id: &str) -> Result<Arc<RawResource>, StateError> {
        lock(&self.inner)
            .get(ns, ty, id)
            .ok_or_else(|| not_found(ns, ty, id))
    }

    /// Lists matching resources of a kind, sorted by ID.
    pub fn list(&self, ns: &str, ty: &str, filter: &Filter) -> Vec<Arc<RawResource>> {
        let inner = lock(&self.inner);
        let Some(c) = inner.collections.get(&(ns.to_string(), ty.to_string())) else {
            return Vec::new();
        };
        c.items
            .values()
            .filter(|r| filter.matches(&r.metadata.id, &r.metadata.labels))
            .cloned()
            .collect()
    }

    /// Creates a resource; it is owned by `owner`.
    pub fn create(&self, r: RawResource, owner: &str) -> Result<Written, StateError> {
        validate(&r)?;
        let ns = r.metadata.namespace.clone();
        let (resource, encoded) = self.write_encoded(&ns, |inner| {
            let w = inner.prepare_create(r, owner)?;
            let created = w.resource.clone();
            Ok((Some(w), created))
        })?;
        self.ensure_namespace(&ns)?;
        let encoded = encoded.unwrap_or_else(|| encode_resource(&resource));
        Ok(Written { resource, encoded })
    }

    /// Registers a namespace in `meta` when it is first written (standalone mode).
    fn ensure_namespace(&self, ns: &str) -> Result<(), StateError> {
        if ns == META_NAMESPACE {
            return Ok(());
        }
        let exists = lock(&self.inner)
            .get(META_NAMESPACE, NamespaceSpec::TYPE, ns)
            .is_some();
        if exists {
            return Ok(());
        }
        match self.ensure_internal(
            META_NAMESPACE,
            NamespaceSpec::TYPE,
            ns,
            &NamespaceSpec::default(),
        ) {
            Err(e) if e.is_conflict() => Ok(()),
            other => other,
        }
    }

    /// Updates a resource (compare-and-set on its version).
    pub fn update(
        &self,
        r: RawResource,
        owner: &str,
        expected_phase: Option<Phase>,
    ) -> Result<Written, StateError> {
        validate(&r)?;
        let ns = r.metadata.namespace.clone();
        let (resource, encoded) = self.write_encoded(&ns, |inner| {
            let w = inner.prepare_update(r, owner, expected_phase)?;
            let updated = w.resource.clone();
            Ok((Some(w), updated))
        })?;
        let encoded = encoded.unwrap_or_else(|| encode_resource(&resource));
        Ok(Written { resource, encoded })
    }

    /// Destroys a resource that has no finalizers.
    pub fn destroy(&self, ns: &str, ty: &str, id: &str, owner: &str) -> Result<(), StateError> {
        self.write(ns, |inner| {
            Ok((Some(inner.prepare_destroy(ns, ty, id, owner)?), ()))
        })
    }

    /// Marks a resource tearing down; returns whether it has no finalizers.
    pub fn teardown(&self, ns: &str, ty: &str, id: &str, owner: &str) -> Result<bool, StateError> {
        self.write(ns, |inner| {
            let cur = inner.get(ns, ty, id).ok_or_else(|| not_found(ns, ty, id))?;
            if cur.metadata.owner != owner {
                return Err(owner_conflict(&cur.metadata, owner));
            }
            let ready = cur.metadata.finalizers.is_empty();
            let w = if cur.metadata.phase != Phase::TearingDown {
                let mut r = (*cur).clone();
                r.metadata.phase = Phase::TearingDown;
                Some(inner.prepare_update(r, owner, None)?)
            } else {
                None
            };
            Ok((w, ready))
        })
    }

    /// A receiver that changes whenever the kind is written (creating the collection if needed).
    pub fn subscribe(&self, ns: &str, ty: &str) -> watch::Receiver<u64> {
        let mut inner = lock(&self.inner);
        let base = inner.base;
        inner
            .collections
            .entry((ns.to_string(), ty.to_string()))
            .or_insert_with(|| Collection::new(base))
            .notify
            .subscribe()
    }

    /// Matching resources and the position they were read at, for a bootstrap.
    pub fn snapshot(&self, ns: &str, ty: &str, filter: &Filter) -> (Vec<Arc<RawResource>>, u64) {
        let inner = lock(&self.inner);
        let seq = inner.seq;
        let items = inner
            .collections
            .get(&(ns.to_string(), ty.to_string()))
            .map(|c| {
                c.items
                    .values()
                    .filter(|r| filter.matches(&r.metadata.id, &r.metadata.labels))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (items, seq)
    }

    /// The current position.
    pub fn position(&self) -> u64 {
        lock(&self.inner).seq
    }

    /// Checks a bookmark; returns its position if events after it are still available.
    pub fn resolve_bookmark(&self, ns: &str, ty: &str, bookmark: &[u8]) -> Result<u64, StateError> {
        let invalid = |why: &str| {
            StateError::new(
                ErrorKind::InvalidBookmark,
                format!("invalid bookmark: {why}"),
            )
        };
        let (epoch, pos) = match bookmark {
            [e @ .., _, _, _, _, _, _, _, _] if e.len() == 8 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&bookmark[..8]);
                let mut b = [0u8; 8];
                b.copy_from_slice(&bookmark[8..]);
                (u64::from_be_bytes(a), u64::from_be_bytes(b))
            }
            _ => return Err(invalid("malformed")),
        };
        let inner = lock(&self.inner);
        if epoch != inner.epoch {
            return Err(invalid("from another run of the node"));
        }
        if pos > inner.seq {
            return Err(invalid("from the future"));
        }
        let floor = inner
            .collections
            .get(&(ns.to_string(), ty.to_string()))
            .map_or(inner.base, |c| c.floor);
        if pos < floor {
            return Err(invalid("expired"));
        }
        Ok(pos)
    }

    /// Start position to replay the last `n` events (of `id` if given) of a kind.
    pub fn tail_start(&self, ns: &str, ty: &str, id: Option<&str>, n: usize) -> u64 {
        let inner = lock(&self.inner);
        let Some(c) = inner.collections.get(&(ns.to_string(), ty.to_string())) else {
            return inner.seq;
        };
        let mut start = inner.seq;
        let mut count = 0;
        for e in c.history.iter().rev() {
            if count == n {
                break;
            }
            if id.is_none_or(|id| e.resource.metadata.id == id) {
                count += 1;
                start = e.seq - 1;
            }
        }
        start
    }

    /// Events of a kind after `pos`, at most `max`; `Err` if the history no longer reaches back
    /// to `pos` (the watcher fell behind: it must resume from a relist).
    #[allow(clippy::result_unit_err)]
    pub fn events_after(
        &self,
        ns: &str,
        ty: &str,
        pos: u64,
        max: usize,
    ) -> Result<(Vec<Arc<StoredEvent>>, u64), ()> {
        let inner = lock(&self.inner);
        let Some(c) = inner.collections.get(&(ns.to_string(), ty.to_string())) else {
            return Ok((Vec::new(), pos));
        };
        if pos < c.floor {
            return Err(());
        }
        let start = c.history.partition_point(|e| e.seq <= pos);
        let out: Vec<_> = c.history.range(start..).take(max).cloned().collect();
        let next = out.last().map_or(pos, |e| e.seq);
        Ok((out, next))
    }

    /// Forgets the kind's collection if nothing is left in it: no resources, no history, no
    /// watcher, and nothing ever trimmed (a watch of a made-up type leaves nothing behind).
    /// Called when a watch ends, after it dropped its receiver.
    pub fn release(&self, ns: &str, ty: &str) {
        let mut inner = lock(&self.inner);
        let base = inner.base;
        let key = (ns.to_string(), ty.to_string());
        let empty = inner.collections.get(&key).is_some_and(|c| {
            c.items.is_empty()
                && c.history.is_empty()
                && c.floor == base
                && c.notify.receiver_count() == 0
        });
        if empty {
            inner.collections.remove(&key);
            // A burst of watches of made-up types grew the map: its room goes with them.
            let (len, cap) = (inner.collections.len(), inner.collections.capacity());
            if cap > 256 && len * 4 < cap {
                inner.collections.shrink_to(len * 2);
            }
        }
    }

    /// What the store holds.
    pub fn stats(&self) -> Stats {
        let inner = lock(&self.inner);
        Stats {
            resources: inner.resources,
            live_bytes: inner.live_bytes,
            collections: inner.collections.len(),
            history_events: inner.history_events,
            history_bytes: inner.history_bytes,
            log_bytes: inner.run.as_ref().map_or(0, RunFiles::log_bytes),
        }
    }

    /// Number of stored resources.
    pub fn len(&self) -> usize {
        lock(&self.inner).resources
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn durable_names(
    state_dir: Option<&Path>,
    declared: &[(String, String)],
    is_durable: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut names: Vec<String> = declared
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| is_durable(n))
        .collect();
    if let Some(dir) = state_dir {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if let Some(n) = e.file_name().to_str().and_then(|n| n.strip_suffix(".ns")) {
                    if is_durable(n) && !names.iter().any(|x| x == n) {
                        names.push(n.to_string());
                    }
                }
            }
        }
    }
    names
}

impl Inner {
    fn get(&self, ns: &str, ty: &str, id: &str) -> Option<Arc<RawResource>> {
        self.collections
            .get(&(ns.to_string(), ty.to_string()))
            .and_then(|c| c.items.get(id))
            .cloned()
    }

    /// The resources of `ns` once `w` is applied, for its durable file.
    fn namespace_after(&self, ns: &str, w: &Prepared) -> Vec<Arc<RawResource>> {
        let md = &w.resource.metadata;
        let mut all: Vec<Arc<RawResource>> = self
            .namespace_items(ns)
            .filter(|x| !(x.metadata.r#type == md.r#type && x.metadata.id == md.id))
            .cloned()
            .collect();
        if w.kind != EventKind::Destroyed {
            all.push(w.resource.clone());
        }
        all
    }

    fn namespace_items<'a>(
        &'a self,
        ns: &'a str,
    ) -> impl Iterator<Item = &'a Arc<RawResource>> + 'a {
        let mut kinds: Vec<&Kind> = self.collections.keys().filter(|k| k.0 == ns).collect();
        kinds.sort();
        kinds
            .into_iter()
            .flat_map(move |k| self.collections[k].items.values())
    }

    /// Inserts a loaded resource (no event, no persistence).
    fn load(&mut self, r: RawResource) {
        let kind = kind_of(&r.metadata);
        let base = self.base;
        let c = self
            .collections
            .entry(kind)
            .or_insert_with(|| Collection::new(base));
        let r = Arc::new(r);
        let old = c.items.insert(r.clone());
        self.account(Some(&r), old.as_deref());
    }

    /// Counts a resource in (`new`) and out (`old`) of the live data and its namespace's usage.
    fn account(&mut self, new: Option<&RawResource>, old: Option<&RawResource>) {
        if let Some(o) = old {
            let size = size_of(o);
            self.live_bytes = self.live_bytes.saturating_sub(size);
            let u = self.usage.entry(o.metadata.namespace.clone()).or_default();
            u.bytes = u.bytes.saturating_sub(size);
            u.resources = u.resources.saturating_sub(1);
            self.resources = self.resources.saturating_sub(1);
        }
        if let Some(n) = new {
            let size = size_of(n);
            self.live_bytes += size;
            let u = self.usage.entry(n.metadata.namespace.clone()).or_default();
            u.bytes += size;
            u.resources += 1;
            self.resources += 1;
        }
    }

    /// Refuses a write that would take a namespace past its limits: `new` replacing `old`.
    fn check_limits(&self, new: &RawResource, old: Option<&RawResource>) -> Result<(), StateError> {
        let ns = &new.metadata.namespace;
        let u = self.usage.get(ns).copied().unwrap_or_default();
        let l = &self.limits;
        if old.is_none() {
            if u.resources >= l.resources_per_namespace {
                return Err(limit(format!(
                    "namespace {} holds {} resources, its limit",
                    cosi::error::quoted(ns),
                    u.resources
                )));
            }
            let kind = kind_of(&new.metadata);
            let known = self
                .collections
                .get(&kind)
                .is_some_and(|c| !c.items.is_empty() || !c.history.is_empty());
            if !known {
                let types = self
                    .collections
                    .iter()
                    .filter(|(k, c)| k.0 == *ns && (!c.items.is_empty() || !c.history.is_empty()))
                    .count();
                if types >= l.types_per_namespace {
                    return Err(limit(format!(
                        "namespace {} holds {types} resource types, its limit",
                        cosi::error::quoted(ns)
                    )));
                }
            }
        }
        let after = (u.bytes + size_of(new)).saturating_sub(old.map_or(0, size_of));
        if after > l.bytes_per_namespace && after > u.bytes {
            return Err(limit(format!(
                "namespace {} would hold {after} bytes of resources, over its limit of {}",
                cosi::error::quoted(ns),
                l.bytes_per_namespace
            )));
        }
        Ok(())
    }

    /// Drops the oldest history events, over all kinds, until the history fits its byte limit.
    /// A kind's `floor` rises with what it lost, so a watch behind it relists.
    fn trim_history(&mut self) {
        while self.history_bytes > self.limits.history_bytes {
            let oldest = self
                .collections
                .iter()
                .filter_map(|(k, c)| c.history.front().map(|e| (e.seq, k)))
                .min_by_key(|(seq, _)| *seq)
                .map(|(_, k)| k.clone());
            let Some(kind) = oldest else { break };
            let Some(c) = self.collections.get_mut(&kind) else {
                break;
            };
            if let Some(e) = c.history.pop_front() {
                c.floor = e.seq;
                self.history_bytes = self.history_bytes.saturating_sub(e.size);
                self.history_events = self.history_events.saturating_sub(1);
            }
        }
    }

    /// Re-applies a log record on load, rebuilding the history.
    fn replay(&mut self, rec: Record) -> Result<(), StateError> {
        let seq = rec.seq;
        match rec.resource {
            Some(r) => {
                let encoded = Bytes::from(r.encode_to_vec());
                let r = Arc::new(RawResource::from_proto(r)?);
                let old = self.get(&r.metadata.namespace, &r.metadata.r#type, &r.metadata.id);
                let kind = if old.is_some() {
                    EventKind::Updated
                } else {
                    EventKind::Created
                };
                self.apply(seq, kind, r, old, encoded);
            }
            None => {
                if let Some(old) = self.get(&rec.namespace, &rec.r#type, &rec.id) {
                    let encoded = encode_resource(&old);
                    self.apply(seq, EventKind::Destroyed, old, None, encoded);
                }
            }
        }
        self.seq = self.seq.max(seq);
        Ok(())
    }

    /// Applies a write in memory: item, history, notification.
    fn apply(
        &mut self,
        seq: u64,
        kind: EventKind,
        r: Arc<RawResource>,
        old: Option<Arc<RawResource>>,
        encoded: Bytes,
    ) {
        let key = kind_of(&r.metadata);
        if key.0 == META_NAMESPACE && key.1 == ResourceDefinition::TYPE {
            self.note_definition(kind, &r);
        }
        let cap = if self.sensitive.contains(&key.1) {
            SENSITIVE_HISTORY
        } else {
            self.history_cap
        };
        let base = self.base;
        let c = self
            .collections
            .entry(key)
            .or_insert_with(|| Collection::new(base));
        let (added, removed) = match kind {
            EventKind::Created | EventKind::Updated => {
                let prev = c.items.insert(r.clone());
                (Some(r.clone()), prev)
            }
            EventKind::Destroyed => (None, c.items.remove(&r.metadata.id)),
        };
        let size = 3 * size_of(&r) + old.as_deref().map_or(0, size_of);
        c.history.push_back(Arc::new(StoredEvent {
            seq,
            kind,
            resource: r,
            old,
            encoded,
            wire: std::sync::OnceLock::new(),
            wire_with_old: std::sync::OnceLock::new(),
            size,
        }));
        let dropped = shorten(c, cap);
        c.notify.send_replace(seq);
        self.history_events = (self.history_events + 1).saturating_sub(dropped.0);
        self.history_bytes = (self.history_bytes + size).saturating_sub(dropped.1);
        self.account(added.as_deref(), removed.as_deref());
        self.trim_history();
    }

    /// Keeps [`Inner::sensitive`] equal to the definitions in `meta`; a type that becomes
    /// sensitive has the history of its kinds cut to [`SENSITIVE_HISTORY`] at once.
    fn note_definition(&mut self, kind: EventKind, r: &RawResource) {
        let def = match kind {
            EventKind::Destroyed => None,
            EventKind::Created | EventKind::Updated => {
                cosi::resource::decode_spec::<ResourceDefinition>(&r.spec).ok()
            }
        };
        // A definition's ID is its lowercase type: the one destroyed is found by it.
        self.sensitive.retain(|t| t.to_lowercase() != r.metadata.id);
        let Some(def) = def else { return };
        if def.sensitivity != cosi::definition::Sensitivity::Sensitive {
            return;
        }
        let mut dropped = (0usize, 0usize);
        for (k, c) in &mut self.collections {
            if k.1 == def.resource_type {
                let d = shorten(c, SENSITIVE_HISTORY);
                dropped = (dropped.0 + d.0, dropped.1 + d.1);
            }
        }
        self.history_events = self.history_events.saturating_sub(dropped.0);
        self.history_bytes = self.history_bytes.saturating_sub(dropped.1);
        self.sensitive.insert(def.resource_type);
    }

    /// Logs then applies a checked write (a durable namespace's file is written before, by
    /// [`Store::write`]). Nothing changes in memory if logging fails.
    /// Persists and applies a checked write; returns the resource's encoding.
    fn commit(&mut self, w: Prepared) -> Result<Bytes, StateError> {
        let Prepared {
            kind,
            resource: r,
            old,
        } = w;
        let seq = self.seq + 1;
        let encoded = encode_resource(&r);
        if let Some(run) = self.run.as_mut() {
            let mut buf = Vec::new();
            match kind {
                EventKind::Destroyed => frame(
                    &Record {
                        seq,
                        resource: None,
                        namespace: r.metadata.namespace.clone(),
                        r#type: r.metadata.r#type.clone(),
                        id: r.metadata.id.clone(),
                    },
                    &mut buf,
                ),
                _ => frame_record(seq, &encoded, &mut buf),
            }
            run.append(&buf).map_err(persist_error)?;
            self.log_records += 1;
        }
        self.seq = seq;
        self.apply(seq, kind, r, old, encoded.clone());
        // Compact once the log holds more than twice the live data (and a few MiB): the log
        // then never grows past about three times what is stored, however often it is written.
        let log = self.run.as_ref().map_or(0, RunFiles::log_bytes);
        if log > MIN_COMPACT_BYTES.max(2 * self.live_bytes as u64) {
            if let Err(e) = self.compact() {
                tracing::warn!(error = %cosi::error::Chain(&e), "log compaction failed; will retry");
            }
        }
        Ok(encoded)
    }

    fn compact(&mut self) -> Result<(), PersistError> {
        let header = Header {
            seq: self.seq,
            epoch: self.epoch,
        };
        let Some(mut run) = self.run.take() else {
            return Ok(());
        };
        let result = run.compact(
            &header,
            self.collections
                .values()
                .flat_map(|c| c.items.values().map(|r| r.as_ref())),
        );
        self.run = Some(run);
        if result.is_ok() {
            self.log_records = 0;
        }
        result
    }

    fn prepare_create(&self, mut r: RawResource, owner: &str) -> Result<Prepared, StateError> {
        let md = &r.metadata;
        if self.get(&md.namespace, &md.r#type, &md.id).is_some() {
            return Err(StateError::new(
                ErrorKind::AlreadyExists,
                format!(
                    "resource {}/{}/{} already exists",
                    md.namespace, md.r#type, md.id
                ),
            ));
        }
        self.check_limits(&r, None)?;
        let now = SystemTime::now();
        r.metadata.version = 1;
        r.metadata.owner = owner.to_string();
        r.metadata.created = Some(now);
        r.metadata.updated = Some(now);
        Ok(Prepared {
            kind: EventKind::Created,
            resource: Arc::new(r),
            old: None,
        })
    }

    fn prepare_update(
        &self,
        mut r: RawResource,
        owner: &str,
        expected_phase: Option<Phase>,
    ) -> Result<Prepared, StateError> {
        let md = &r.metadata;
        let cur = self
            .get(&md.namespace, &md.r#type, &md.id)
            .ok_or_else(|| not_found(&md.namespace, &md.r#type, &md.id))?;
        if cur.metadata.owner != owner {
            return Err(owner_conflict(&cur.metadata, owner));
        }
        if let Some(p) = expected_phase {
            if cur.metadata.phase != p {
                return Err(StateError::new(
                    ErrorKind::PhaseConflict,
                    format!(
                        "{PHASE_PREFIX}: resource {}/{}/{} is {}, expected {}",
                        md.namespace,
                        md.r#type,
                        md.id,
                        cur.metadata.phase.as_str(),
                        p.as_str()
                    ),
                ));
            }
        }
        if md.version != cur.metadata.version {
            return Err(StateError::new(
                ErrorKind::Conflict,
                format!(
                    "resource {}/{}/{} update conflict: expected version {}, current {}",
                    md.namespace, md.r#type, md.id, md.version, cur.metadata.version
                ),
            ));
        }
        self.check_limits(&r, Some(&cur))?;
        r.metadata.version = cur.metadata.version + 1;
        r.metadata.owner = cur.metadata.owner.clone();
        r.metadata.created = cur.metadata.created;
        r.metadata.updated = Some(SystemTime::now());
        Ok(Prepared {
            kind: EventKind::Updated,
            resource: Arc::new(r),
            old: Some(cur),
        })
    }

    fn prepare_destroy(
        &self,
        ns: &str,
        ty: &str,
        id: &str,
        owner: &str,
    ) -> Result<Prepared, StateError> {
        let cur = self.get(ns, ty, id).ok_or_else(|| not_found(ns, ty, id))?;
        if cur.metadata.owner != owner {
            return Err(owner_conflict(&cur.metadata, owner));
        }
        if !cur.metadata.finalizers.is_empty() {
            return Err(StateError::new(
                ErrorKind::Conflict,
                format!(
                    "resource {ns}/{ty}/{id} has pending finalizers: {}",
                    cur.metadata
                        .finalizers
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(Prepared {
            kind: EventKind::Destroyed,
            resource: cur,
            old: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Long enough for anything that does not hang: these tests check that nothing waits for
    /// a paused durable write, so a wait that ends here is the failure.
    const HANG: Duration = Duration::from_secs(60);

    fn open(run: &Path, state: &Path) -> Store {
        Store::open(StoreConfig {
            run_dir: Some(run),
            state_dir: Some(state),
            durable: Box::new(|ns| ns == "config"),
            namespaces: vec![
                ("config".into(), String::new()),
                ("net".into(), String::new()),
            ],
            history: 64,
            limits: Limits::default(),
        })
        .expect("the store opens")
    }

    fn res(ns: &str, id: &str, spec: &[u8]) -> RawResource {
        RawResource {
            metadata: Metadata::new(ns, "Things.test.dev", id),
            spec: spec.to_vec(),
            yaml_spec: String::new(),
        }
    }

    /// A durable write paused before its file is written: the store serves every other read
    /// and write meanwhile (its lock is free), the paused write is not visible until its file
    /// is written, and then it is both in memory and on disk.
    #[test]
    fn a_durable_write_waiting_for_the_disk_holds_no_one_else_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (run, state) = (dir.path().join("run"), dir.path().join("state"));
        let store = Arc::new(open(&run, &state));
        let (entered_tx, entered) = mpsc::channel::<()>();
        let (release, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        store.pause_durable_writes(Some(Arc::new(move || {
            let _ = entered_tx.send(());
            let _ = lock(&release_rx).recv_timeout(HANG);
        })));
        let mut notify = store.subscribe("net", "Things.test.dev");
        notify.mark_unchanged();

        let writer = {
            let store = store.clone();
            std::thread::spawn(move || store.create(res("config", "machine", b"v1"), "init"))
        };
        entered
            .recv_timeout(HANG)
            .expect("the durable write reaches its file");

        // Meanwhile: writes and reads of other namespaces, and their watchers, go on.
        let (done_tx, done) = mpsc::channel();
        {
            let store = store.clone();
            std::thread::spawn(move || {
                let created = store.create(res("net", "eth0", b"up"), "networkd");
                let got = store
                    .get("net", "Things.test.dev", "eth0")
                    .map(|r| r.spec.clone());
                let absent = store.get("config", "Things.test.dev", "machine");
                let _ = done_tx.send((created.map(|_| ()), got, absent.map(|_| ())));
            });
        }
        let (created, got, absent) = done
            .recv_timeout(HANG)
            .expect("a write of another namespace waited for the durable write's disk");
        assert_eq!(created, Ok(()));
        assert_eq!(got.as_deref(), Ok(&b"up"[..]));
        assert!(
            absent.is_err_and(|e| e.is_not_found()),
            "a durable write is visible before its file is written"
        );
        assert!(
            notify.has_changed().unwrap_or(false),
            "the watcher was not told"
        );

        release.send(()).expect("the writer waits");
        let written = writer.join().expect("the writer does not panic");
        assert_eq!(written.map(|r| r.resource.metadata.version), Ok(1));
        assert_eq!(
            store
                .get("config", "Things.test.dev", "machine")
                .map(|r| r.spec.clone()),
            Ok(b"v1".to_vec())
        );

        // A new boot (the run state gone): the durable namespace comes back from its file.
        store.pause_durable_writes(None);
        drop(store);
        std::fs::remove_dir_all(&run).expect("remove the run state");
        let again = open(&run, &state);
        assert_eq!(
            again
                .get("config", "Things.test.dev", "machine")
                .map(|r| r.spec.clone()),
            Ok(b"v1".to_vec())
        );
        assert!(again.get("net", "Things.test.dev", "eth0").is_err());
    }

    /// Durable writes from many threads at once: each one's file holds all the others' that
    /// came before it, so none is lost from disk (they are serialized among themselves).
    #[test]
    fn concurrent_durable_writes_lose_nothing_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (run, state) = (dir.path().join("run"), dir.path().join("state"));
        let store = Arc::new(open(&run, &state));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..10 {
                        store
                            .create(res("config", &format!("r{t}-{i}"), b"x"), "init")
                            .expect("a durable create");
                        store
                            .create(res("net", &format!("r{t}-{i}"), b"x"), "networkd")
                            .expect("a run-state create");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no writer panics");
        }
        drop(store);
        std::fs::remove_dir_all(&run).expect("remove the run state");
        let again = open(&run, &state);
        let ids = again.list("config", "Things.test.dev", &Filter::default());
        assert_eq!(ids.len(), 80, "durable resources lost across a reboot");
        assert!(again
            .list("net", "Things.test.dev", &Filter::default())
            .is_empty());
    }

    /// A durable write whose file cannot be written fails Unavailable and changes nothing:
    /// not in memory, not in the run log, not in the next file written.
    #[test]
    fn a_failed_durable_write_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (run, state) = (dir.path().join("run"), dir.path().join("state"));
        let store = open(&run, &state);
        store
            .create(res("config", "a", b"1"), "init")
            .expect("a durable create");
        let seq = store.seq();
        // The state directory is replaced by a file: nothing can be written under it.
        std::fs::rename(&state, dir.path().join("state.away")).expect("move the state dir");
        std::fs::write(&state, b"").expect("a file in its place");
        let err = store
            .create(res("config", "b", b"2"), "init")
            .expect_err("the file cannot be written");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(store.get("config", "Things.test.dev", "b").is_err());
        assert_eq!(store.seq(), seq, "a failed write took a sequence number");
        let mut cur = (*store.get("config", "Things.test.dev", "a").expect("a")).clone();
        cur.spec = b"3".to_vec();
        assert!(store.update(cur.clone(), "init", None).is_err());
        assert_eq!(
            store
                .get("config", "Things.test.dev", "a")
                .map(|r| r.metadata.version),
            Ok(1)
        );

        std::fs::remove_file(&state).expect("remove the file");
        std::fs::rename(dir.path().join("state.away"), &state).expect("the state dir back");
        store
            .update(cur, "init", None)
            .expect("the disk works again");
        drop(store);
        // Restart in place (run state kept): the same; and a new boot from the file alone.
        let kept = open(&run, &state);
        assert!(kept.get("config", "Things.test.dev", "b").is_err());
        drop(kept);
        std::fs::remove_dir_all(&run).expect("remove the run state");
        let again = open(&run, &state);
        assert!(again.get("config", "Things.test.dev", "b").is_err());
        assert_eq!(
            again
                .get("config", "Things.test.dev", "a")
                .map(|r| r.spec.clone()),
            Ok(b"3".to_vec())
        );
    }
}
