//! A State API client over a Unix socket. Unary calls fail fast with a typed [`StateError`];
//! watches reconnect forever with backoff and resume from their last bookmark, or relist and
//! synthesize the missed events when the bookmark is gone, so a consumer never sees the gap.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::TokioIo;
use proto::state_client::StateClient;
use proto::talosrs::state::batch_client::BatchClient;
use tokio::net::UnixStream;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::error::{ErrorKind, Op, StateError};
use crate::resource::{Metadata, Phase, RawResource, Resource, ResourceSpec};

/// Writes sent in one batch call at most (stated's limit).
pub const MAX_BATCH: usize = 256;

/// Bytes of resources sent in one batch call at most (unless one write is larger), well below
/// stated's request limit.
const BATCH_BYTES: usize = 1024 * 1024;

/// Splits writes into the batches of single calls: [`MAX_BATCH`] writes or [`BATCH_BYTES`] at
/// most each.
fn chunks(writes: Vec<BatchWrite>) -> Vec<Vec<BatchWrite>> {
    let mut out = Vec::new();
    let mut cur: Vec<BatchWrite> = Vec::new();
    let mut bytes = 0;
    for w in writes {
        let size = w.size();
        if !cur.is_empty() && (cur.len() == MAX_BATCH || bytes + size > BATCH_BYTES) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += size;
        cur.push(w);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Writes of a batch made one by one in flight at once, when the server has no batch service.
const ONE_BY_ONE_IN_FLIGHT: usize = 32;

/// One write of [`Client::write_batch`].
#[derive(Clone, Debug)]
pub enum BatchWrite {
    /// Creates `resource` as `owner`.
    Create {
        /// The resource.
        resource: RawResource,
        /// Its owner.
        owner: String,
    },
    /// Updates `resource` (its version must be the stored one) as `owner`.
    Update {
        /// The resource.
        resource: RawResource,
        /// Its owner.
        owner: String,
        /// The phase it must be in (`None`: any).
        expected_phase: Option<Phase>,
    },
    /// Destroys a resource as `owner`.
    Destroy {
        /// Namespace.
        namespace: String,
        /// Type.
        r#type: String,
        /// ID.
        id: String,
        /// Its owner.
        owner: String,
    },
}

impl BatchWrite {
    /// About what the write takes on the wire.
    fn size(&self) -> usize {
        match self {
            BatchWrite::Create { resource, .. } | BatchWrite::Update { resource, .. } => {
                let md = &resource.metadata;
                resource.spec.len()
                    + resource.yaml_spec.len()
                    + md.id.len()
                    + md.labels
                        .iter()
                        .chain(&md.annotations)
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>()
                    + md.finalizers.iter().map(String::len).sum::<usize>()
                    + 128
            }
            BatchWrite::Destroy { id, .. } => id.len() + 128,
        }
    }

    fn op(&self) -> Op {
        match self {
            BatchWrite::Create { .. } => Op::Create,
            BatchWrite::Update { .. } => Op::Update,
            BatchWrite::Destroy { .. } => Op::Destroy,
        }
    }

    fn to_proto(&self) -> proto::talosrs::state::Write {
        use proto::talosrs::state::write::Op as W;
        let op = match self {
            BatchWrite::Create { resource, owner } => W::Create(proto::CreateRequest {
                resource: Some(resource.to_proto()),
                options: Some(proto::CreateOptions {
                    owner: owner.clone(),
                }),
            }),
            BatchWrite::Update {
                resource,
                owner,
                expected_phase,
            } => W::Update(proto::UpdateRequest {
                new_resource: Some(resource.to_proto()),
                options: Some(proto::UpdateOptions {
                    owner: owner.clone(),
                    expected_phase: expected_phase.map(|p| p.as_str().to_string()),
                }),
            }),
            BatchWrite::Destroy {
                namespace,
                r#type,
                id,
                owner,
            } => W::Destroy(proto::DestroyRequest {
                namespace: namespace.clone(),
                r#type: r#type.clone(),
                id: id.clone(),
                options: Some(proto::DestroyOptions {
                    owner: owner.clone(),
                }),
            }),
        };
        proto::talosrs::state::Write { op: Some(op) }
    }
}

/// Largest message the client sends or accepts.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// A connection to stated. Cheap to clone; reconnects by itself on the next call.
#[derive(Clone, Debug)]
pub struct Client {
    inner: StateClient<Channel>,
    /// `talosrs.state.Batch` on the same connection.
    batch: BatchClient<Channel>,
    /// The server answered that it has no batch service (an upstream COSI server): writes
    /// are made one by one from then on.
    no_batch: Arc<std::sync::atomic::AtomicBool>,
    peer: Arc<str>,
    metadata: Arc<[(MetadataKey<Ascii>, MetadataValue<Ascii>)]>,
    read_retry: Duration,
    request_timeout: Duration,
}

/// How long a call may wait for stated's answer by default. stated answers in microseconds;
/// a call that waits longer meets a stated that is down or restarting (init holds its socket,
/// so a connection is accepted and then not served until stated is back).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Filters of List and kind watches.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// OR of label queries (each an AND of terms); empty matches all.
    pub labels: Vec<proto::LabelQuery>,
    /// Regular expression on the ID (unanchored).
    pub id_regexp: Option<String>,
}

impl Query {
    /// Adds a query `key == value` (OR-ed with earlier queries).
    #[must_use]
    pub fn label_equal(mut self, key: &str, value: &str) -> Self {
        self.labels.push(proto::LabelQuery {
            terms: vec![proto::LabelTerm {
                key: key.to_string(),
                op: proto::label_term::Operation::Equal as i32,
                value: vec![value.to_string()],
                invert: false,
            }],
        });
        self
    }

    /// Sets the ID regular expression.
    #[must_use]
    pub fn id_regexp(mut self, re: &str) -> Self {
        self.id_regexp = Some(re.to_string());
        self
    }
}

/// What to watch and from where.
#[derive(Clone, Debug, Default)]
pub struct WatchSpec {
    /// Namespace.
    pub namespace: String,
    /// Type.
    pub r#type: String,
    /// One resource (`Some`) or the whole kind (`None`).
    pub id: Option<String>,
    /// Kind watch: first send every matching resource, then `Bootstrapped`.
    pub bootstrap: bool,
    /// Kind watch: first send a `Noop` carrying the current bookmark.
    pub bootstrap_bookmark: bool,
    /// Replay up to this many past events.
    pub tail_events: i32,
    /// Resume after this bookmark.
    pub start_from_bookmark: Option<Vec<u8>>,
    /// Filters (kind watch only).
    pub query: Query,
    /// Updates come without the old resource ([`Event::old`] is `None`): less to send and
    /// decode. A talos-rs extension of the State API (`WatchOptions.omit_old`); a COSI server
    /// ignores it and sends the old resource anyway.
    pub omit_old: bool,
}

/// The kind of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The resource appeared.
    Created,
    /// The resource changed.
    Updated,
    /// The resource is gone; the resource carries its last known metadata.
    Destroyed,
    /// The initial contents have all been sent.
    Bootstrapped,
    /// Nothing happened; carries a bookmark.
    Noop,
}

/// One event of a watch.
#[derive(Clone, Debug)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The resource after the event (before it, for `Destroyed`).
    pub resource: RawResource,
    /// The resource before an update.
    pub old: Option<RawResource>,
    /// Where to resume after this event.
    pub bookmark: Option<Vec<u8>>,
}

/// Events of a watch, in order. Ends with an error only when the watch cannot go on (bad request,
/// access denied); transport failures and overruns are hidden by resume and relist.
///
/// The watch runs in the consumer's task: each call reads the stream (reopening it, resuming or
/// relisting as needed) until it has events to return; there is no task or queue in between.
/// Every call is cancel-safe: a call dropped at any await (in `select!`, under `timeout`) loses
/// no event, and the next call goes on where it stopped (a backoff keeps its deadline).
pub struct Watch {
    state: Box<WatchState>,
    pending: std::collections::VecDeque<Event>,
}

impl Watch {
    /// The next event; `None` when the watch ended after an error was returned.
    pub async fn next(&mut self) -> Option<Result<Event, StateError>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(Ok(e));
            }
            match self.state.next_batch().await? {
                Ok(batch) => self.pending.extend(batch),
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The next batch of events as stated sent them together (at least one event).
    pub async fn next_batch(&mut self) -> Option<Result<Vec<Event>, StateError>> {
        if !self.pending.is_empty() {
            return Some(Ok(self.pending.drain(..).collect()));
        }
        self.state.next_batch().await
    }
}

/// A lazily connected gRPC channel to the Unix socket at `path` (stated's, init's control
/// socket): connects on first use and again after the peer restarted.
pub fn unix_channel(path: &Path) -> Channel {
    let p = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = p.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
}

impl Client {
    /// A client of the stated listening at `path`. Connects lazily: this fails only on a bad path.
    pub fn new(path: impl AsRef<Path>) -> Result<Self, StateError> {
        let path = path.as_ref();
        Ok(Self::over(
            unix_channel(path),
            format!("stated at {}", path.display()),
        ))
    }

    /// A client of the State API at the other end of `channel` (apid's, over TLS), named
    /// `peer` in errors ("apid at 127.0.0.1:50000").
    pub fn over(channel: Channel, peer: impl Into<String>) -> Self {
        let inner = StateClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let batch = BatchClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Self {
            inner,
            batch,
            no_batch: Arc::default(),
            peer: Arc::from(peer.into()),
            metadata: Arc::from(Vec::new()),
            read_retry: Duration::from_secs(2),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// Sends `key: value` with every call and watch (apid's `node`, naming the node that
    /// answers).
    #[must_use]
    pub fn with_metadata(mut self, key: MetadataKey<Ascii>, value: MetadataValue<Ascii>) -> Self {
        let mut all = self.metadata.to_vec();
        all.push((key, value));
        self.metadata = Arc::from(all);
        self
    }

    fn decorate<T>(&self, req: &mut tonic::Request<T>) {
        for (k, v) in self.metadata.iter() {
            req.metadata_mut().append(k.clone(), v.clone());
        }
    }

    /// How long reads (Get, List) retry while stated is unavailable, e.g. restarting
    /// (default 2 s). Writes are never retried here: whether an interrupted write took effect is
    /// for the caller to find out.
    #[must_use]
    pub fn with_read_retry(mut self, d: Duration) -> Self {
        self.read_retry = d;
        self
    }

    /// How long each call (and the setup of a watch) waits for an answer (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]); a call that gets none fails `Unavailable`, saying stated
    /// is not answering. TeardownAndDestroy, which waits for finalizers by design, has none.
    #[must_use]
    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// A request with the deadline set (sent to stated as `grpc-timeout` too).
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.request_timeout);
        self.decorate(&mut r);
        r
    }

    /// Runs one call under the deadline, enforced here: a stated that never answers (down,
    /// or restarting behind init's held socket) becomes a clear `Unavailable`.
    async fn timed<T>(
        &self,
        op: Op,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, StateError> {
        let outcome = tokio::time::timeout(self.request_timeout, call).await;
        self.outcome(op, outcome)
    }

    fn outcome<T>(
        &self,
        op: Op,
        outcome: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>,
    ) -> Result<T, StateError> {
        match outcome {
            // tonic enforces the request's deadline itself as well.
            Ok(Err(s))
                if matches!(
                    s.code(),
                    tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
                ) && s.message().contains("Timeout") =>
            {
                Err(self.not_answering())
            }
            Ok(r) => r.map_err(|s| StateError::from_status(op, &s)),
            Err(_) => Err(self.not_answering()),
        }
    }

    /// A write under the deadline, sent again (within the read-retry window) when it failed
    /// without reaching stated: the connection was gone before the request went out (stated
    /// restarted; hyper cancels what it had queued) or could not be made. A write stated may
    /// have seen is never repeated.
    async fn timed_write<T, F, Fut>(&self, op: Op, f: F) -> Result<T, StateError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let deadline = tokio::time::Instant::now() + self.read_retry;
        let mut backoff = Duration::from_millis(20);
        loop {
            match tokio::time::timeout(self.request_timeout, f()).await {
                Ok(Err(s))
                    if never_sent(&s) && tokio::time::Instant::now() + backoff < deadline =>
                {
                    tracing::debug!(status = %s, "state write not sent, sending it again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                other => return self.outcome(op, other),
            }
        }
    }

    fn not_answering(&self) -> StateError {
        StateError::new(
            ErrorKind::Unavailable,
            format!(
                "{} did not answer within {} ms: it is down or restarting \
                 (`talosctl services` shows it)",
                self.peer,
                self.request_timeout.as_millis()
            ),
        )
    }

    async fn retry_read<T, F, Fut>(&self, f: F) -> Result<T, StateError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StateError>>,
    {
        let deadline = tokio::time::Instant::now() + self.read_retry;
        let mut backoff = Duration::from_millis(20);
        loop {
            match f().await {
                Err(e)
                    if e.is_unavailable() && tokio::time::Instant::now() + backoff < deadline =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    /// What the client talks to, for messages ("stated at /run/stated/state.sock").
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Gets one resource.
    pub async fn get(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<RawResource, StateError> {
        self.retry_read(|| self.get_once(namespace, r#type, id))
            .await
    }

    async fn get_once(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<RawResource, StateError> {
        let mut inner = self.inner.clone();
        let req = self.request(proto::GetRequest {
            namespace: namespace.into(),
            r#type: r#type.into(),
            id: id.into(),
            options: None,
        });
        let resp = self.timed(Op::Get, inner.get(req)).await?;
        decode(resp.into_inner().resource)
    }

    /// Gets one typed resource from `namespace`.
    pub async fn get_typed<S: ResourceSpec>(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Resource<S>, StateError> {
        let raw = self.get(namespace, S::TYPE, id).await?;
        Resource::from_raw(&raw).map_err(spec_error)
    }

    /// Lists resources of a kind, sorted by ID.
    pub async fn list(
        &self,
        namespace: &str,
        r#type: &str,
        query: &Query,
    ) -> Result<Vec<RawResource>, StateError> {
        self.retry_read(|| self.list_once(namespace, r#type, query))
            .await
    }

    async fn list_once(
        &self,
        namespace: &str,
        r#type: &str,
        query: &Query,
    ) -> Result<Vec<RawResource>, StateError> {
        let mut inner = self.inner.clone();
        let req = self.request(proto::ListRequest {
            namespace: namespace.into(),
            r#type: r#type.into(),
            options: Some(proto::ListOptions {
                label_query: query.labels.clone(),
                id_query: query
                    .id_regexp
                    .clone()
                    .map(|regexp| proto::IdQuery { regexp }),
            }),
        });
        let collect = async move {
            let mut stream = inner.list(req).await?.into_inner();
            let mut items = Vec::new();
            while let Some(item) = stream.next().await {
                items.push(item?);
            }
            Ok(items)
        };
        self.timed(Op::List, collect)
            .await?
            .into_iter()
            .map(|item| decode(item.resource))
            .collect()
    }

    /// Lists typed resources of `S` in `namespace`.
    pub async fn list_typed<S: ResourceSpec>(
        &self,
        namespace: &str,
    ) -> Result<Vec<Resource<S>>, StateError> {
        self.list(namespace, S::TYPE, &Query::default())
            .await?
            .iter()
            .map(|r| Resource::from_raw(r).map_err(spec_error))
            .collect()
    }

    /// Creates a resource as `owner`; returns it as stored (version, timestamps).
    pub async fn create(
        &self,
        resource: &RawResource,
        owner: &str,
    ) -> Result<RawResource, StateError> {
        let resp = self
            .timed_write(Op::Create, || {
                let mut inner = self.inner.clone();
                let req = self.request(proto::CreateRequest {
                    resource: Some(resource.to_proto()),
                    options: Some(proto::CreateOptions {
                        owner: owner.into(),
                    }),
                });
                async move { inner.create(req).await }
            })
            .await?;
        decode(resp.into_inner().resource)
    }

    /// Updates a resource as `owner`. `resource.metadata.version` must be the stored version.
    /// `expected_phase`: `None` accepts any phase.
    pub async fn update(
        &self,
        resource: &RawResource,
        owner: &str,
        expected_phase: Option<Phase>,
    ) -> Result<RawResource, StateError> {
        let resp = self
            .timed_write(Op::Update, || {
                let mut inner = self.inner.clone();
                let req = self.request(proto::UpdateRequest {
                    new_resource: Some(resource.to_proto()),
                    options: Some(proto::UpdateOptions {
                        owner: owner.into(),
                        expected_phase: expected_phase.map(|p| p.as_str().to_string()),
                    }),
                });
                async move { inner.update(req).await }
            })
            .await?;
        decode(resp.into_inner().resource)
    }

    /// Destroys a resource as `owner`.
    pub async fn destroy(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
        owner: &str,
    ) -> Result<(), StateError> {
        self.timed_write(Op::Destroy, || {
            let mut inner = self.inner.clone();
            let req = self.request(proto::DestroyRequest {
                namespace: namespace.into(),
                r#type: r#type.into(),
                id: id.into(),
                options: Some(proto::DestroyOptions {
                    owner: owner.into(),
                }),
            });
            async move { inner.destroy(req).await }
        })
        .await
        .map(drop)
    }

    /// Makes several writes in one call to stated (`talosrs.state.Batch`, at most
    /// [`MAX_BATCH`] per call: more are sent in several calls). Each write is checked and done
    /// as its own call would be, in order, independently; the results are in the same order:
    /// the resource as stored (`Some` for a create or update) or why the write was not done.
    /// The outer error is a failure of the call itself (stated unavailable): whether some of
    /// its writes took effect is then for the caller to find out, as with a single write.
    ///
    /// A server without the batch service (an upstream COSI server) gets the writes one by
    /// one, a few in flight at once.
    pub async fn write_batch(
        &self,
        writes: Vec<BatchWrite>,
    ) -> Result<Vec<Result<Option<RawResource>, StateError>>, StateError> {
        use std::sync::atomic::Ordering;
        let mut out = Vec::with_capacity(writes.len());
        for chunk in chunks(writes) {
            if self.no_batch.load(Ordering::Relaxed) {
                out.extend(self.write_one_by_one(chunk).await);
                continue;
            }
            let ops: Vec<Op> = chunk.iter().map(BatchWrite::op).collect();
            let resp = self
                .timed_write(Op::Update, || {
                    let mut batch = self.batch.clone();
                    let req = self.request(proto::talosrs::state::WriteRequest {
                        writes: chunk.iter().map(BatchWrite::to_proto).collect(),
                    });
                    async move { batch.write(req).await }
                })
                .await;
            let results = match resp {
                Ok(r) => r.into_inner().results,
                Err(e) if e.kind() == ErrorKind::Unimplemented => {
                    tracing::debug!(peer = %self.peer, "no batch service: writing one by one");
                    self.no_batch.store(true, Ordering::Relaxed);
                    out.extend(self.write_one_by_one(chunk).await);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if results.len() != ops.len() {
                return Err(StateError::new(
                    ErrorKind::Other,
                    format!(
                        "{} answered {} results to a batch of {} writes",
                        self.peer,
                        results.len(),
                        ops.len()
                    ),
                ));
            }
            for (op, r) in ops.into_iter().zip(results) {
                out.push(match r.status {
                    Some(s) => Err(StateError::from_status(
                        op,
                        &tonic::Status::new(tonic::Code::from(s.code), s.message),
                    )),
                    None if op == Op::Destroy => Ok(None),
                    None => {
                        let r = <proto::Resource as prost::Message>::decode(r.resource).map_err(
                            |e| {
                                StateError::new(
                                    ErrorKind::Other,
                                    format!("a batch result does not decode: {e}"),
                                )
                            },
                        )?;
                        Ok(Some(RawResource::from_proto(r)?))
                    }
                });
            }
        }
        Ok(out)
    }

    /// The writes of a batch as single calls, a few in flight at once.
    async fn write_one_by_one(
        &self,
        writes: Vec<BatchWrite>,
    ) -> Vec<Result<Option<RawResource>, StateError>> {
        let calls = writes.into_iter().map(|w| async move {
            match w {
                BatchWrite::Create { resource, owner } => {
                    self.create(&resource, &owner).await.map(Some)
                }
                BatchWrite::Update {
                    resource,
                    owner,
                    expected_phase,
                } => self
                    .update(&resource, &owner, expected_phase)
                    .await
                    .map(Some),
                BatchWrite::Destroy {
                    namespace,
                    r#type,
                    id,
                    owner,
                } => self
                    .destroy(&namespace, &r#type, &id, &owner)
                    .await
                    .map(|()| None),
            }
        });
        futures::stream::iter(calls)
            .buffered(ONE_BY_ONE_IN_FLIGHT)
            .collect()
            .await
    }

    /// Marks a resource tearing down; returns whether it has no finalizers left.
    pub async fn teardown(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
        owner: &str,
    ) -> Result<bool, StateError> {
        let resp = self
            .timed_write(Op::Teardown, || {
                let mut inner = self.inner.clone();
                let req = self.request(proto::TeardownRequest {
                    namespace: namespace.into(),
                    r#type: r#type.into(),
                    id: id.into(),
                    options: Some(proto::TeardownOptions {
                        owner: owner.into(),
                    }),
                });
                async move { inner.teardown(req).await }
            })
            .await?;
        Ok(resp.into_inner().destroy_ready)
    }

    /// Tears a resource down and destroys it once its finalizers are gone (blocks until then).
    pub async fn teardown_and_destroy(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
        owner: &str,
    ) -> Result<(), StateError> {
        self.inner
            .clone()
            .teardown_and_destroy(proto::TeardownAndDestroyRequest {
                namespace: namespace.into(),
                r#type: r#type.into(),
                id: id.into(),
                options: Some(proto::TeardownAndDestroyOptions {
                    owner: owner.into(),
                }),
            })
            .await
            .map_err(|s| StateError::from_status(Op::Teardown, &s))?;
        Ok(())
    }

    /// Adds a finalizer (any phase, any owner, as COSI's AddFinalizer).
    pub async fn add_finalizer(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
        finalizer: &str,
    ) -> Result<(), StateError> {
        self.modify_finalizers(namespace, r#type, id, |f| f.insert(finalizer.to_string()))
            .await
    }

    /// Adds a finalizer to `current`, the resource as the caller last read it: one Update
    /// when nobody changed it since, the read-and-retry of [`add_finalizer`](Self::add_finalizer)
    /// otherwise.
    pub async fn add_finalizer_to(
        &self,
        current: &RawResource,
        finalizer: &str,
    ) -> Result<(), StateError> {
        let md = &current.metadata;
        if md.finalizers.contains(finalizer) {
            return Ok(());
        }
        let mut new = current.clone();
        new.metadata.finalizers.insert(finalizer.to_string());
        match self.update(&new, &md.owner, None).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Conflict => {
                self.add_finalizer(&md.namespace, &md.r#type, &md.id, finalizer)
                    .await
            }
            Err(e) => Err(e),
        }
    }

    /// Removes a finalizer; a missing resource is not an error.
    pub async fn remove_finalizer(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
        finalizer: &str,
    ) -> Result<(), StateError> {
        match self
            .modify_finalizers(namespace, r#type, id, |f| f.remove(finalizer))
            .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    async fn modify_finalizers(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
        f: impl Fn(&mut std::collections::BTreeSet<String>) -> bool,
    ) -> Result<(), StateError> {
        loop {
            let mut cur = self.get(namespace, r#type, id).await?;
            if !f(&mut cur.metadata.finalizers) {
                return Ok(());
            }
            let owner = cur.metadata.owner.clone();
            match self.update(&cur, &owner, None).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Conflict => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// [`define_types`](Self::define_types), retried (backoff from 50 ms to 2 s) while stated
    /// does not answer: what a daemon does first. Returns the first answer that is not
    /// "unavailable" (a refusal is not retried).
    pub async fn define_types_retrying(
        &self,
        definitions: &[crate::definition::ResourceDefinition],
        owner: &str,
    ) -> Result<(), StateError> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.define_types(definitions, owner).await {
                Err(e) if e.is_unavailable() => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// Writes resource definitions as `owner`: each one is created, or updated when the stored
    /// one differs (a newer build of the daemon); equal ones are left alone. An unavailable
    /// stated stops at once (for the caller to retry); a refused definition does not keep the
    /// others from being written, and the first refusal is returned at the end.
    pub async fn define_types(
        &self,
        definitions: &[crate::definition::ResourceDefinition],
        owner: &str,
    ) -> Result<(), StateError> {
        use crate::definition::{ResourceDefinition, META_NAMESPACE};
        let mut raws = Vec::with_capacity(definitions.len());
        for def in definitions {
            raws.push(
                Resource::new(META_NAMESPACE, def.id(), def.clone())
                    .to_raw()
                    .map_err(spec_error)?,
            );
        }
        // One call creates every new definition (a daemon's first start: one round trip for
        // all, not one each); those already there are then read in one list and only the ones
        // that differ are updated.
        let created = self
            .write_batch(
                raws.iter()
                    .map(|r| BatchWrite::Create {
                        resource: r.clone(),
                        owner: owner.to_string(),
                    })
                    .collect(),
            )
            .await?;
        let mut first_error = None;
        let mut existing = Vec::new();
        for ((def, raw), result) in definitions.iter().zip(raws).zip(created) {
            match result {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => existing.push((def, raw)),
                Err(e) if e.is_unavailable() => return Err(e),
                Err(e) => {
                    first_error.get_or_insert(StateError::new(
                        e.kind(),
                        format!("{}: {}", def.resource_type, e.message()),
                    ));
                }
            }
        }
        if !existing.is_empty() {
            let stored: std::collections::HashMap<String, RawResource> = self
                .list(META_NAMESPACE, ResourceDefinition::TYPE, &Query::default())
                .await?
                .into_iter()
                .map(|r| (r.metadata.id.clone(), r))
                .collect();
            for (def, mut next) in existing {
                let Some(cur) = stored.get(&def.id()) else {
                    continue; // destroyed meanwhile: nothing to bring up to date
                };
                if crate::resource::decode_spec::<ResourceDefinition>(&cur.spec)
                    .ok()
                    .as_ref()
                    == Some(def)
                {
                    continue;
                }
                next.metadata.version = cur.metadata.version;
                match self.update(&next, &cur.metadata.owner, None).await {
                    Ok(_) => {}
                    Err(e) if e.is_unavailable() => return Err(e),
                    Err(e) => {
                        first_error.get_or_insert(StateError::new(
                            e.kind(),
                            format!("{}: {}", def.resource_type, e.message()),
                        ));
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Starts a watch. Events arrive in order; the watch reconnects and resumes by itself.
    pub fn watch(&self, spec: WatchSpec) -> Watch {
        let mut state = Box::new(WatchState::new(self.clone(), spec));
        state.start();
        Watch {
            state,
            pending: Default::default(),
        }
    }

    async fn open(
        &self,
        spec: &WatchSpec,
    ) -> Result<tonic::Streaming<proto::WatchResponse>, StateError> {
        let req = proto::WatchRequest {
            namespace: spec.namespace.clone(),
            r#type: spec.r#type.clone(),
            id: spec.id.clone(),
            api_version: 1,
            options: Some(proto::WatchOptions {
                bootstrap_contents: spec.bootstrap,
                tail_events: spec.tail_events,
                label_query: spec.query.labels.clone(),
                id_query: spec
                    .query
                    .id_regexp
                    .clone()
                    .map(|regexp| proto::IdQuery { regexp }),
                aggregated: true,
                start_from_bookmark: spec.start_from_bookmark.clone(),
                bootstrap_bookmark: spec.bootstrap_bookmark,
                omit_old: spec.omit_old,
            }),
        };
        let mut req = tonic::Request::new(req);
        self.decorate(&mut req);
        let mut inner = self.inner.clone();
        let setup = async move {
            let mut stream = inner.watch(req).await?.into_inner();
            let first = stream.message().await;
            Ok::<_, tonic::Status>((stream, first))
        };
        let (stream, first) = self.timed(Op::Watch, setup).await?;
        // The first, empty response says the watch is established (COSI's marker); errors of the
        // setup (bad bookmark, bad filter) arrive instead of it.
        match first {
            Ok(Some(r)) if r.event.is_empty() => Ok(stream),
            Ok(Some(_)) => Err(StateError::new(
                ErrorKind::Other,
                "watch: no established marker",
            )),
            Ok(None) => Err(StateError::new(
                ErrorKind::Unavailable,
                "watch stream closed",
            )),
            Err(s) => Err(StateError::from_status(Op::Watch, &s)),
        }
    }
}

fn decode(r: Option<proto::Resource>) -> Result<RawResource, StateError> {
    RawResource::from_proto(
        r.ok_or_else(|| StateError::new(ErrorKind::Other, "response without resource"))?,
    )
}

fn spec_error(e: crate::resource::SpecError) -> StateError {
    StateError::new(
        ErrorKind::InvalidArgument,
        crate::error::Chain(&e).to_string(),
    )
}

fn permanent(e: &StateError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidArgument
            | ErrorKind::PermissionDenied
            | ErrorKind::Unimplemented
            | ErrorKind::NotFound
            | ErrorKind::LimitReached
    )
}

/// What the watch has delivered so far: enough to turn a relist into the events that were missed.
#[derive(Default)]
struct Seen {
    /// Version and creation time of every resource delivered and not destroyed: enough to tell,
    /// after a relist, what changed (a destroyed and re-created resource restarts at version 1
    /// but has a new creation time).
    versions: HashMap<String, (u64, Option<std::time::SystemTime>)>,
}

impl Seen {
    fn record(&mut self, e: &Event) {
        let md = &e.resource.metadata;
        match e.kind {
            EventKind::Created | EventKind::Updated => match self.versions.get_mut(&md.id) {
                Some(v) => *v = (md.version, md.created),
                None => {
                    self.versions
                        .insert(md.id.clone(), (md.version, md.created));
                }
            },
            EventKind::Destroyed => {
                self.versions.remove(&md.id);
            }
            EventKind::Bootstrapped | EventKind::Noop => {}
        }
    }
}

fn convert(e: proto::Event) -> Result<Result<Event, String>, StateError> {
    let kind = match proto::EventType::try_from(e.event_type) {
        Ok(proto::EventType::Created) => EventKind::Created,
        Ok(proto::EventType::Updated) => EventKind::Updated,
        Ok(proto::EventType::Destroyed) => EventKind::Destroyed,
        Ok(proto::EventType::Bootstrapped) => EventKind::Bootstrapped,
        Ok(proto::EventType::Noop) => EventKind::Noop,
        Ok(proto::EventType::Errored) | Err(_) => return Ok(Err(e.error.unwrap_or_default())),
    };
    let resource = match e.resource {
        Some(r) => RawResource::from_proto(r)?,
        None => RawResource::default(),
    };
    let old = e.old.map(RawResource::from_proto).transpose()?;
    Ok(Ok(Event {
        kind,
        resource,
        old,
        bookmark: e.bookmark,
    }))
}

/// A watch's progress: the open stream, where to resume, what the consumer has seen.
struct WatchState {
    client: Client,
    spec: WatchSpec,
    seen: Seen,
    /// Where to resume. Bootstrap contents and a single watch's first event carry no bookmark
    /// (COSI), so until a live event (or BOOTSTRAPPED, or a NOOP) arrives, a reconnect relists.
    bookmark: Option<Vec<u8>>,
    /// Whether the consumer has its initial view: the whole bootstrap up to BOOTSTRAPPED. A cut
    /// before it relists and then delivers the rest of the contents and the BOOTSTRAPPED.
    bootstrapped: bool,
    /// A plain kind watch asks for a NOOP with the starting bookmark (dropped unless the
    /// consumer asked for it), so that a cut before the first event still resumes exactly.
    wants_noop: bool,
    plain_kind: bool,
    /// The next open relists (the bookmark is gone, or the bootstrap was cut).
    relisting: bool,
    /// No stream was opened yet.
    first: bool,
    backoff: Duration,
    /// The stream being read.
    stream: Option<tonic::Streaming<proto::WatchResponse>>,
    /// During a relist, the current contents are collected, then diffed against what was seen.
    relist: Option<Vec<RawResource>>,
    /// Do not open again before this (a backoff that survives a cancelled call).
    retry_at: Option<tokio::time::Instant>,
    /// The watch ended with an error that was returned.
    ended: bool,
    /// The first open, started by [`Client::watch`] so that the watch is established in the
    /// background at once (events after that call are delivered even before the consumer
    /// first asks), as it was when a task ran each watch.
    opening:
        Option<tokio::task::JoinHandle<Result<tonic::Streaming<proto::WatchResponse>, StateError>>>,
}

impl Drop for WatchState {
    fn drop(&mut self) {
        if let Some(h) = &self.opening {
            h.abort();
        }
    }
}

impl WatchState {
    fn new(client: Client, spec: WatchSpec) -> Self {
        let plain_kind = spec.id.is_none()
            && !spec.bootstrap
            && spec.tail_events == 0
            && spec.start_from_bookmark.is_none();
        Self {
            bookmark: spec.start_from_bookmark.clone(),
            bootstrapped: !(spec.bootstrap && spec.id.is_none()),
            wants_noop: spec.bootstrap_bookmark,
            plain_kind,
            relisting: false,
            first: true,
            backoff: Duration::from_millis(50),
            stream: None,
            relist: None,
            retry_at: None,
            ended: false,
            opening: None,
            seen: Seen::default(),
            client,
            spec,
        }
    }

    /// The request of the next open.
    fn request(&mut self) -> WatchSpec {
        let mut req = self.spec.clone();
        if self.first && self.plain_kind {
            req.bootstrap_bookmark = true;
        }
        if !self.first && (self.bookmark.is_none() || !self.bootstrapped) {
            self.relisting = true;
        }
        if !self.first {
            req.tail_events = 0;
            req.bootstrap_bookmark = false;
            if self.relisting {
                req.start_from_bookmark = None;
                req.bootstrap = req.id.is_none();
            } else {
                req.bootstrap = false;
                req.start_from_bookmark = self.bookmark.clone();
            }
        }
        req
    }

    /// Starts the first open in the background.
    fn start(&mut self) {
        let req = self.request();
        let client = self.client.clone();
        self.opening = Some(tokio::spawn(async move { client.open(&req).await }));
    }

    /// Takes the outcome of an open; `Some` is what the consumer gets now.
    fn opened(
        &mut self,
        r: Result<tonic::Streaming<proto::WatchResponse>, StateError>,
    ) -> Option<Option<Result<Vec<Event>, StateError>>> {
        match r {
            Ok(s) => {
                self.relist = self.relisting.then(Vec::new);
                self.stream = Some(s);
                self.first = false;
                self.relisting = false;
                self.backoff = Duration::from_millis(50);
            }
            Err(e) if e.kind() == ErrorKind::InvalidBookmark && !self.first => {
                tracing::debug!(r#type = %self.spec.r#type, "watch bookmark expired, relisting");
                self.relisting = true;
            }
            Err(e) if permanent(&e) || self.first && e.kind() == ErrorKind::InvalidBookmark => {
                return Some(self.end(e));
            }
            Err(e) => {
                tracing::debug!(error = %e, "watch: stated unavailable, retrying");
                self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
            }
        }
        None
    }

    /// The stream ended or broke: open again after the backoff (a cut relist starts over).
    fn lost_stream(&mut self) {
        self.stream = None;
        if self.relist.take().is_some() {
            self.relisting = true;
        }
        self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
    }

    fn end(&mut self, e: StateError) -> Option<Result<Vec<Event>, StateError>> {
        self.ended = true;
        self.stream = None;
        Some(Err(e))
    }

    /// The next events for the consumer; `None` after the error that ended the watch.
    async fn next_batch(&mut self) -> Option<Result<Vec<Event>, StateError>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(stream) = self.stream.as_mut() {
                // Cancel-safe: `message` only polls the stream.
                let batch = match stream.message().await {
                    Ok(Some(resp)) => resp.event,
                    Ok(None) => {
                        self.lost_stream();
                        continue;
                    }
                    Err(s) => {
                        let e = StateError::from_status(Op::Watch, &s);
                        if permanent(&e) {
                            return self.end(e);
                        }
                        self.lost_stream();
                        continue;
                    }
                };
                match self.take(batch) {
                    Ok((out, errored)) => {
                        if errored {
                            self.lost_stream();
                        }
                        if !out.is_empty() {
                            return Some(Ok(out));
                        }
                    }
                    Err(e) => return self.end(e),
                }
                continue;
            }
            let r = if let Some(h) = self.opening.as_mut() {
                // Cancel-safe: the open goes on in its task.
                let r = h.await.unwrap_or_else(|e| {
                    Err(StateError::new(
                        ErrorKind::Unavailable,
                        format!("watch: opening failed: {e}"),
                    ))
                });
                self.opening = None;
                r
            } else {
                if let Some(at) = self.retry_at {
                    tokio::time::sleep_until(at).await;
                    self.retry_at = None;
                }
                let req = self.request();
                self.client.open(&req).await
            };
            if let Some(out) = self.opened(r) {
                return out;
            }
        }
    }

    /// Turns a response into the consumer's events; whether the stream reported an error (it
    /// fell behind: resume).
    fn take(&mut self, batch: Vec<proto::Event>) -> Result<(Vec<Event>, bool), StateError> {
        let spec = &self.spec;
        let mut out = Vec::with_capacity(batch.len());
        for pe in batch {
            let ev = match convert(pe)? {
                Ok(ev) => ev,
                Err(msg) => {
                    tracing::debug!(error = %msg, "watch errored, resuming");
                    return Ok((out, true));
                }
            };
            if let Some(b) = &ev.bookmark {
                self.bookmark = Some(b.clone());
            }
            if ev.kind == EventKind::Noop && !self.wants_noop {
                continue;
            }
            if let Some(list) = self.relist.as_mut() {
                match ev.kind {
                    EventKind::Created if spec.id.is_none() => {
                        list.push(ev.resource);
                        continue;
                    }
                    EventKind::Bootstrapped => {
                        let current = std::mem::take(list);
                        out.extend(diff_relist(&mut self.seen, spec, current));
                        self.relist = None;
                        if !self.bootstrapped {
                            // The first bootstrap was cut: its rest came from this relist.
                            self.bootstrapped = true;
                            out.push(ev);
                        }
                        continue;
                    }
                    _ if spec.id.is_some() => {
                        // A single watch restarts with the current state as its first event.
                        self.relist = None;
                        let known = self
                            .seen
                            .versions
                            .get(&ev.resource.metadata.id)
                            .map(|v| v.0);
                        let skip = match ev.kind {
                            EventKind::Created => known == Some(ev.resource.metadata.version),
                            EventKind::Destroyed => known.is_none(),
                            _ => false,
                        };
                        if skip {
                            continue;
                        }
                        let mut ev = ev;
                        if ev.kind == EventKind::Created && known.is_some() {
                            ev.kind = EventKind::Updated;
                        }
                        self.seen.record(&ev);
                        out.push(ev);
                        continue;
                    }
                    _ => {}
                }
            }
            if ev.kind == EventKind::Bootstrapped {
                self.bootstrapped = true;
            }
            self.seen.record(&ev);
            out.push(ev);
        }
        Ok((out, false))
    }
}

/// Turns the current contents after a relist into the events that bring a consumer from what it
/// has seen to now.
fn diff_relist(seen: &mut Seen, spec: &WatchSpec, current: Vec<RawResource>) -> Vec<Event> {
    let mut out = Vec::new();
    let mut present = std::collections::HashSet::new();
    for r in current {
        present.insert(r.metadata.id.clone());
        let kind = match seen.versions.get(&r.metadata.id) {
            None => EventKind::Created,
            Some(&(v, created)) if v != r.metadata.version || created != r.metadata.created => {
                EventKind::Updated
            }
            Some(_) => continue,
        };
        out.push(Event {
            kind,
            resource: r,
            old: None,
            bookmark: None,
        });
    }
    let gone: Vec<String> = seen
        .versions
        .keys()
        .filter(|id| !present.contains(*id))
        .cloned()
        .collect();
    for id in gone {
        seen.versions.remove(&id);
        out.push(Event {
            kind: EventKind::Destroyed,
            resource: RawResource {
                metadata: Metadata::new(spec.namespace.clone(), spec.r#type.clone(), id),
                ..Default::default()
            },
            old: None,
            bookmark: None,
        });
    }
    for e in &out {
        seen.record(e);
    }
    out
}

/// Whether a failed call never reached stated: hyper canceled the request before sending it
/// (its connection was already closed), or the connection could not be made.
fn never_sent(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ) {
                return true;
            }
        }
        source = e.source();
    }
    false
}
