//! The `cosi.resource.State` gRPC service: decode, identify the peer, check access, call the
//! store, map errors to COSI's codes.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use cosi::definition::{ResourceDefinition, META_NAMESPACE};
use cosi::error::{ErrorKind, StateError};
use cosi::resource::{Phase, RawResource, ResourceSpec};
use futures::Stream;
use prost::Message as _;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::access::{Access, Peer, Policy};
use crate::labels::Filter;
use crate::store::{encode_bookmark, EventKind, Store, StoredEvent, Written};
use proto::talosrs::state as batch;

/// Events sent in one aggregated watch response at most.
const WATCH_BATCH: usize = 256;
/// Trips through the scheduler's queue a woken watcher makes at most while writes of its kind
/// keep coming, to send them together (measured in BENCHMARKS.md: at saturation ~2.6 events
/// per response instead of ~1.5, 20 % more updates/s; below it, a p99 of about 0.4 ms at
/// 5000 updates/s and 10 watchers)...
const COALESCE_ROUNDS: usize = 16;
/// ... and for this long at most after the watcher was woken.
const COALESCE_FOR: std::time::Duration = std::time::Duration::from_micros(200);
/// Encoded size of one aggregated watch response at most (unless a single event is larger).
const WATCH_BATCH_BYTES: usize = 1024 * 1024;

/// What one peer (a uid: a daemon, the administrator, anyone else) may hold open at once, so
/// that no client grows stated's memory without bound. Reaching a limit is `LimitReached`
/// (RESOURCE_EXHAUSTED) for a watch; a connection over its limit is closed at once.
#[derive(Clone, Debug)]
pub struct PeerLimits {
    /// Open watches of one daemon.
    pub watches_per_daemon: usize,
    /// Open watches of uid 0 (init, talosctl on the node).
    pub watches_admin: usize,
    /// Connections of one daemon.
    pub connections_per_daemon: usize,
    /// Connections of uid 0.
    pub connections_admin: usize,
    /// Connections of one uid that is neither (refused every request anyway).
    pub connections_per_stranger: usize,
    /// Connections of all such uids together.
    pub connections_strangers: usize,
    /// A connection that sends nothing this long after it is accepted is closed (a client
    /// sends the HTTP/2 preface at once).
    pub first_bytes_within: std::time::Duration,
    /// Idle connections are pinged this often; one that does not answer within
    /// `keepalive_timeout` is closed.
    pub keepalive_interval: std::time::Duration,
    /// See `keepalive_interval`.
    pub keepalive_timeout: std::time::Duration,
    /// Concurrent streams (calls and watches) on one connection.
    pub streams_per_connection: u32,
}

impl Default for PeerLimits {
    fn default() -> Self {
        Self {
            watches_per_daemon: 1024,
            watches_admin: 4096,
            connections_per_daemon: 256,
            connections_admin: 1024,
            connections_per_stranger: 16,
            connections_strangers: 64,
            first_bytes_within: std::time::Duration::from_secs(10),
            keepalive_interval: std::time::Duration::from_secs(30),
            keepalive_timeout: std::time::Duration::from_secs(20),
            streams_per_connection: 1024,
        }
    }
}

/// The uid of a caller inside this process, for requests that do not come through a socket
/// ([`crate::testing::fuzz_requests`]). Only this crate can make one, and a request from a
/// socket carries its kernel-verified credentials instead: nothing a client sends becomes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InProcessPeer(pub(crate) u32);

/// Open watches per uid, each released when its watch ends.
#[derive(Default)]
struct WatchCounts(std::sync::Mutex<std::collections::HashMap<u32, usize>>);

/// One open watch of a uid.
struct WatchSlot {
    counts: Arc<WatchCounts>,
    uid: u32,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut m = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.uid);
            }
        }
    }
}

/// The State service over a store and an access policy.
#[derive(Clone)]
pub struct StateService {
    store: Arc<Store>,
    policy: Arc<Policy>,
    limits: PeerLimits,
    watches: Arc<WatchCounts>,
    /// Held across the name checks and the write of a resource definition, so that two
    /// definitions cannot both pass the checks and then take the same name.
    meta_writes: Arc<std::sync::Mutex<()>>,
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn status(e: StateError) -> Status {
    e.to_status()
}

fn invalid(msg: impl Into<String>) -> Status {
    StateError::new(ErrorKind::InvalidArgument, msg).to_status()
}

impl StateService {
    /// A service over `store` with `policy`, holding each peer to `limits`.
    pub fn new(store: Arc<Store>, policy: Arc<Policy>, limits: PeerLimits) -> Self {
        Self {
            store,
            policy,
            limits,
            watches: Arc::default(),
            meta_writes: Arc::new(std::sync::Mutex::new(())),
        }
    }

    fn uid<T>(req: &Request<T>) -> Option<u32> {
        let ext = req.extensions();
        ext.get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .map(|c| c.uid())
            .or_else(|| ext.get::<InProcessPeer>().map(|p| p.0))
    }

    fn peer<T>(&self, req: &Request<T>) -> Peer {
        self.policy.identify(Self::uid(req))
    }

    /// Takes one of the peer's watch slots, or says which limit it reached.
    fn watch_slot(&self, uid: Option<u32>, peer: &Peer) -> Result<WatchSlot, Status> {
        let uid = uid.unwrap_or(u32::MAX);
        let (max, who) = match peer {
            Peer::Admin => (self.limits.watches_admin, "admin".to_string()),
            Peer::Daemon { name, .. } => (self.limits.watches_per_daemon, format!("daemon {name}")),
            Peer::Stranger(u) => (0, format!("uid {u}")),
        };
        let mut m = self.watches.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(uid).or_insert(0);
        if *n >= max {
            return Err(StateError::new(
                ErrorKind::LimitReached,
                format!("{who} has {n} open watches, its limit: close some first"),
            )
            .to_status());
        }
        *n += 1;
        Ok(WatchSlot {
            counts: self.watches.clone(),
            uid,
        })
    }

    /// Runs a store write (teardowns): on a blocking thread when it is of a durable namespace,
    /// inline otherwise (see [`Self::run_write`]).
    async fn write<T: Send + 'static>(
        &self,
        ns: &str,
        f: impl FnOnce(&Store) -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        if !self.store.is_durable(ns) {
            return f(&self.store);
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| {
                StateError::new(
                    ErrorKind::Other,
                    format!("a durable write did not finish: {e}"),
                )
            })?
    }

    /// Runs a write of namespace `ns` (`f`, one of the `*_now` functions or a batch of them):
    /// on a blocking thread when `ns` is durable (it waits for the disk, which must not stall
    /// this async worker and the calls and watches it serves), inline otherwise.
    async fn run_write<T: Send + 'static>(
        &self,
        ns: &str,
        f: impl FnOnce(&StateService) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        self.run_blocking_if(self.store.is_durable(ns), f).await
    }

    /// Runs `f` on a blocking thread if `blocking`, inline otherwise.
    async fn run_blocking_if<T: Send + 'static>(
        &self,
        blocking: bool,
        f: impl FnOnce(&StateService) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        if !blocking {
            return f(self);
        }
        let svc = self.clone();
        tokio::task::spawn_blocking(move || f(&svc))
            .await
            .map_err(|e| {
                StateError::new(
                    ErrorKind::Other,
                    format!("a durable write did not finish: {e}"),
                )
                .to_status()
            })?
    }

    /// A Create, checked and done (it may wait for the disk: see [`Self::run_write`]).
    fn create_now(&self, peer: &Peer, r: proto::CreateRequest) -> Result<Written, Status> {
        let res = resource_of(r.resource)?;
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        check_request("", None, &owner)?;
        let _meta = self.lock_meta(&res);
        let owner = self.check_write(peer, &res, &owner, false)?;
        self.store.create(res, &owner).map_err(status)
    }

    /// An Update, checked and done (it may wait for the disk).
    fn update_now(&self, peer: &Peer, r: proto::UpdateRequest) -> Result<Written, Status> {
        let res = resource_of(r.new_resource)?;
        let opts = r.options.unwrap_or_default();
        check_request("", None, &opts.owner)?;
        let phase = opts
            .expected_phase
            .as_deref()
            .map(Phase::parse)
            .transpose()
            .map_err(status)?;
        let _meta = self.lock_meta(&res);
        let owner = self.check_write(peer, &res, &opts.owner, true)?;
        self.store.update(res, &owner, phase).map_err(status)
    }

    /// A Destroy, checked and done (it may wait for the disk).
    fn destroy_now(&self, peer: &Peer, r: proto::DestroyRequest) -> Result<(), Status> {
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        check_request(&r.r#type, Some(&r.id), &owner)?;
        if r.namespace == META_NAMESPACE && *peer != Peer::Admin {
            return Err(StateError::new(
                ErrorKind::PermissionDenied,
                "only stated writes namespace \"meta\"",
            )
            .to_status());
        }
        self.policy
            .check(peer, &r.namespace, Access::Write)
            .map_err(status)?;
        self.store
            .destroy(&r.namespace, &r.r#type, &r.id, &owner)
            .map_err(status)
    }

    /// The writes of a batch, each checked and done as its State call, in order; one result
    /// each (it may wait for the disk).
    fn write_all(&self, peer: &Peer, writes: Vec<batch::Write>) -> Vec<batch::WriteResult> {
        use batch::write::Op;
        writes
            .into_iter()
            .map(|w| {
                let done = match w.op {
                    Some(Op::Create(r)) => self.create_now(peer, r).map(|w| w.encoded),
                    Some(Op::Update(r)) => self.update_now(peer, r).map(|w| w.encoded),
                    Some(Op::Destroy(r)) => self.destroy_now(peer, r).map(|()| Bytes::new()),
                    None => Err(invalid("a batch write without an operation")),
                };
                match done {
                    Ok(resource) => batch::WriteResult {
                        resource,
                        status: None,
                    },
                    Err(s) => batch::WriteResult {
                        resource: Bytes::new(),
                        status: Some(proto::google::rpc::Status {
                            code: s.code() as i32,
                            message: s.message().to_string(),
                            details: Vec::new(),
                        }),
                    },
                }
            })
            .collect()
    }

    /// The `meta` write lock, for a write to `meta`.
    fn lock_meta(&self, r: &RawResource) -> Option<std::sync::MutexGuard<'_, ()>> {
        (r.metadata.namespace == META_NAMESPACE)
            .then(|| self.meta_writes.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn check<T>(&self, req: &Request<T>, ns: &str, access: Access) -> Result<Peer, Status> {
        let peer = self.peer(req);
        self.policy.check(&peer, ns, access).map_err(status)?;
        Ok(peer)
    }

    fn check_read<T>(&self, req: &Request<T>, ns: &str, r#type: &str) -> Result<Peer, Status> {
        let peer = self.peer(req);
        self.policy.check_read(&peer, ns, r#type).map_err(status)?;
        Ok(peer)
    }

    /// Checks a Create or Update and returns the owner to store it under. Outside `meta` that
    /// is the namespace's access rule and the owner the client sent.
    ///
    /// In `meta` (DESIGN.md §2, "type definitions are ownership too"): only definitions may be
    /// written, by admin, or by a daemon defining a type of a group it `defines` whose default
    /// namespace it writes; a daemon's definitions are owned by the daemon itself (its
    /// kernel-verified name, whatever owner string it sends), so it may change only those it
    /// created; and no definition may take a type name or alias that another definition has
    /// (whoever owns it), so nobody can make `talosctl get machineconfig` resolve to a type of
    /// theirs, nor make a name ambiguous.
    /// The caller holds `meta_writes` from here to the write.
    fn check_write(
        &self,
        peer: &Peer,
        r: &RawResource,
        sent_owner: &str,
        update: bool,
    ) -> Result<String, Status> {
        let md = &r.metadata;
        if md.namespace != META_NAMESPACE {
            self.policy
                .check(peer, &md.namespace, Access::Write)
                .map_err(status)?;
            return Ok(sent_owner.to_string());
        }
        let denied = |msg: String| StateError::new(ErrorKind::PermissionDenied, msg).to_status();
        let owner = match peer {
            Peer::Admin => sent_owner.to_string(),
            Peer::Daemon { name, .. } if md.r#type == ResourceDefinition::TYPE => name.clone(),
            _ => return Err(denied("only stated writes namespace \"meta\"".into())),
        };
        if md.r#type != ResourceDefinition::TYPE {
            return Ok(owner);
        }
        let def: ResourceDefinition = cosi::resource::decode_spec(&r.spec).map_err(|e| {
            invalid(format!(
                "invalid resource definition: {}",
                cosi::error::Chain(&e)
            ))
        })?;
        check_definition(&def)?;
        if def.id() != md.id {
            return Err(invalid(format!(
                "resource definition id must be {}, the lowercase type",
                cosi::error::quoted(&def.id())
            )));
        }
        if let Peer::Daemon {
            name,
            writes,
            defines,
            ..
        } = peer
        {
            if !writes.contains(&def.default_namespace) {
                return Err(denied(format!(
                    "daemon {name} may not define types of namespace {}",
                    cosi::error::quoted(&def.default_namespace)
                )));
            }
            let group = machinery::manifest::type_group(&def.resource_type).unwrap_or("");
            if !defines.contains(group) {
                return Err(denied(format!(
                    "daemon {name} may not define types of group {} (the manifest lets it define {})",
                    cosi::error::quoted(group),
                    if defines.is_empty() {
                        "none".to_string()
                    } else {
                        defines.iter().cloned().collect::<Vec<_>>().join(", ")
                    }
                )));
            }
        }
        if update {
            if let Ok(cur) = self.store.get(META_NAMESPACE, &md.r#type, &md.id) {
                if cur.metadata.owner != owner {
                    return Err(denied(format!(
                        "resource definition {} belongs to {}; {} may not change it",
                        md.id,
                        cosi::error::quoted(&cur.metadata.owner),
                        match peer {
                            Peer::Daemon { name, .. } => format!("daemon {name}"),
                            _ => format!("owner {}", cosi::error::quoted(&owner)),
                        }
                    )));
                }
            }
        }
        let ours = def.names();
        for other in self
            .store
            .list(META_NAMESPACE, ResourceDefinition::TYPE, &Filter::default())
        {
            // Whoever owns the other one: a name names one type (a daemon's own two types
            // sharing an alias made `talosctl get` of that name ambiguous).
            if other.metadata.id == md.id {
                continue;
            }
            let Ok(o) = cosi::resource::decode_spec::<ResourceDefinition>(&other.spec) else {
                continue;
            };
            if let Some(taken) = o.names().intersection(&ours).next() {
                return Err(denied(format!(
                    "the name {} is taken by {} (owned by {})",
                    cosi::error::quoted(taken),
                    o.resource_type,
                    cosi::error::quoted(&other.metadata.owner)
                )));
            }
        }
        Ok(owner)
    }
}

/// A definition's names are bounded and printable, and its type has a group.
fn check_definition(def: &ResourceDefinition) -> Result<(), Status> {
    let printable = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && !s.chars().any(|c| c.is_control() || c.is_whitespace())
    };
    let mut problems = Vec::new();
    if !printable(&def.resource_type, 256) || !def.resource_type.contains('.') {
        problems.push(format!(
            "type {} must be a name with a group (Plurals.group.dev)",
            cosi::error::quoted(&def.resource_type)
        ));
    }
    if !def.display_type.is_empty() && !printable(&def.display_type, 256) {
        problems.push("display type is not a printable name".to_string());
    }
    if def.aliases.len() + def.all_aliases.len() > 64 {
        problems.push("more than 64 aliases".to_string());
    }
    for a in def.aliases.iter().chain(&def.all_aliases) {
        if !printable(a, 128) {
            problems.push(format!(
                "alias {} is not a printable name",
                cosi::error::quoted(a)
            ));
            break;
        }
    }
    if def.print_columns.len() > 32 {
        problems.push("more than 32 print columns".to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid(format!(
            "invalid resource definition: {}",
            problems.join("; ")
        )))
    }
}

/// Bounds what a request names before it is looked up or quoted in an error: a type and an
/// owner of at most 256 bytes, an ID of at most 1024 (as stored resources have).
fn check_request(ty: &str, id: Option<&str>, owner: &str) -> Result<(), Status> {
    if ty.len() > 256 {
        return Err(invalid(format!(
            "type {} is longer than 256 bytes",
            cosi::error::quoted(ty)
        )));
    }
    if let Some(id) = id {
        if id.len() > 1024 {
            return Err(invalid(format!(
                "id {} is longer than 1024 bytes",
                cosi::error::quoted(id)
            )));
        }
    }
    if owner.len() > 256 || owner.chars().any(char::is_control) {
        return Err(invalid(format!(
            "owner {} is longer than 256 bytes or contains control characters",
            cosi::error::quoted(owner)
        )));
    }
    Ok(())
}

fn resource_of(r: Option<proto::Resource>) -> Result<RawResource, Status> {
    let r = r.ok_or_else(|| invalid("request has no resource"))?;
    RawResource::from_proto(r).map_err(status)
}

fn to_proto_event(
    kind: proto::EventType,
    r: &RawResource,
    old: Option<&RawResource>,
    bookmark: Option<Vec<u8>>,
) -> proto::Event {
    proto::Event {
        resource: Some(r.to_proto()),
        event_type: kind as i32,
        old: old.map(RawResource::to_proto),
        error: None,
        bookmark,
    }
}

/// An event encoded around a resource already encoded: its `resource` field (1) is `encoded`
/// as it is, the other fields are encoded here. (Fields of a protobuf message may come in any
/// order; this is what decoders see when `resource` is written first.)
fn wire_event(
    kind: proto::EventType,
    encoded: &[u8],
    old: Option<&RawResource>,
    bookmark: Option<Vec<u8>>,
) -> Bytes {
    let rest = proto::Event {
        resource: None,
        event_type: kind as i32,
        old: old.map(RawResource::to_proto),
        error: None,
        bookmark,
    };
    let mut buf = Vec::with_capacity(encoded.len() + 8 + rest.encoded_len());
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut buf);
    prost::encoding::encode_varint(encoded.len() as u64, &mut buf);
    buf.extend_from_slice(encoded);
    rest.encode_raw(&mut buf);
    Bytes::from(buf)
}

fn tombstone(ns: &str, ty: &str, id: &str) -> RawResource {
    RawResource {
        metadata: cosi::Metadata::new(ns, ty, id),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl proto::state_server::State for StateService {
    async fn get(
        &self,
        req: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        self.check_read(&req, &req.get_ref().namespace, &req.get_ref().r#type)?;
        let r = req.into_inner();
        check_request(&r.r#type, Some(&r.id), "")?;
        let res = self
            .store
            .get(&r.namespace, &r.r#type, &r.id)
            .map_err(status)?;
        Ok(Response::new(proto::GetResponse::new(res.to_proto())))
    }

    type ListStream = Stream_<proto::ListResponse>;

    async fn list(
        &self,
        req: Request<proto::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        self.check_read(&req, &req.get_ref().namespace, &req.get_ref().r#type)?;
        let r = req.into_inner();
        check_request(&r.r#type, None, "")?;
        let opts = r.options.unwrap_or_default();
        let filter = Filter::new(opts.label_query, opts.id_query).map_err(status)?;
        let items = self.store.list(&r.namespace, &r.r#type, &filter);
        let stream = futures::stream::iter(
            items
                .into_iter()
                .map(|r| Ok(proto::ListResponse::new(r.to_proto()))),
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn create(
        &self,
        req: Request<proto::CreateRequest>,
    ) -> Result<Response<proto::CreateResponse>, Status> {
        let peer = self.peer(&req);
        let r = req.into_inner();
        let ns = r
            .resource
            .as_ref()
            .and_then(|r| r.metadata.as_ref())
            .map(|m| m.namespace.clone())
            .unwrap_or_default();
        let created = self.run_write(&ns, move |s| s.create_now(&peer, r)).await?;
        Ok(Response::new(proto::CreateResponse::encoded(
            created.encoded,
        )))
    }

    async fn update(
        &self,
        req: Request<proto::UpdateRequest>,
    ) -> Result<Response<proto::UpdateResponse>, Status> {
        let peer = self.peer(&req);
        let r = req.into_inner();
        let ns = r
            .new_resource
            .as_ref()
            .and_then(|r| r.metadata.as_ref())
            .map(|m| m.namespace.clone())
            .unwrap_or_default();
        let updated = self.run_write(&ns, move |s| s.update_now(&peer, r)).await?;
        Ok(Response::new(proto::UpdateResponse::encoded(
            updated.encoded,
        )))
    }

    async fn destroy(
        &self,
        req: Request<proto::DestroyRequest>,
    ) -> Result<Response<proto::DestroyResponse>, Status> {
        let peer = self.peer(&req);
        let r = req.into_inner();
        let ns = r.namespace.clone();
        self.run_write(&ns, move |s| s.destroy_now(&peer, r))
            .await?;
        Ok(Response::new(proto::DestroyResponse {}))
    }

    type WatchStream = Stream_<proto::WatchResponse>;

    async fn watch(
        &self,
        req: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let peer = self.check_read(&req, &req.get_ref().namespace, &req.get_ref().r#type)?;
        let slot = self.watch_slot(Self::uid(&req), &peer)?;
        let r = req.into_inner();
        let opts = r.options.unwrap_or_default();
        if r.r#type.is_empty() {
            return Err(invalid("watch: type is empty"));
        }
        check_request(&r.r#type, r.id.as_deref(), "")?;
        if r.id.is_some() && opts.bootstrap_contents {
            return Err(StateError::new(
                ErrorKind::Unimplemented,
                "bootstrap contents is not supported for a single resource watch",
            )
            .to_status());
        }
        if r.id.is_some() && !opts.label_query.is_empty() {
            return Err(StateError::new(
                ErrorKind::Unimplemented,
                "label queries are not supported for a single resource watch",
            )
            .to_status());
        }
        if opts.tail_events > 0 && opts.start_from_bookmark.is_some() {
            return Err(Status::unknown(
                "tail events and start from bookmark are mutually exclusive",
            ));
        }
        if opts.bootstrap_contents && (opts.tail_events > 0 || opts.start_from_bookmark.is_some()) {
            return Err(invalid(
                "bootstrap contents is mutually exclusive with tail events and bookmarks",
            ));
        }
        let filter = if r.id.is_some() {
            Filter::default()
        } else {
            Filter::new(opts.label_query, opts.id_query).map_err(status)?
        };
        let (ns, ty) = (r.namespace.clone(), r.r#type.clone());
        // Subscribe before reading the start position so no write is missed in between.
        let notify = self.store.subscribe(&ns, &ty);
        let epoch = self.store.epoch();
        let mut first: Vec<proto::Event> = Vec::new();
        let pos = if let Some(b) = &opts.start_from_bookmark {
            match self.store.resolve_bookmark(&ns, &ty, b) {
                Ok(pos) => pos,
                Err(e) => {
                    drop(notify);
                    self.store.release(&ns, &ty);
                    return Err(status(e));
                }
            }
        } else if opts.tail_events > 0 {
            let n = usize::try_from(opts.tail_events).unwrap_or(0);
            self.store.tail_start(&ns, &ty, r.id.as_deref(), n)
        } else if let Some(id) = &r.id {
            // A single watch starts with the current state: the resource or a tombstone. As in
            // COSI, this event carries no bookmark (a client resumes only from live events).
            let pos = self.store.position();
            match self.store.get(&ns, &ty, id) {
                Ok(res) => first.push(to_proto_event(proto::EventType::Created, &res, None, None)),
                Err(_) => first.push(to_proto_event(
                    proto::EventType::Destroyed,
                    &tombstone(&ns, &ty, id),
                    None,
                    None,
                )),
            }
            pos
        } else if opts.bootstrap_contents {
            let (items, pos) = self.store.snapshot(&ns, &ty, &filter);
            // The contents carry no bookmark, only the closing BOOTSTRAPPED does (COSI): a client
            // resumes from the last bookmark it saw, so a bookmark here would make a reconnect
            // in the middle of the contents skip the rest of them.
            for res in items {
                first.push(to_proto_event(proto::EventType::Created, &res, None, None));
            }
            if r.api_version >= 1 {
                first.push(to_proto_event(
                    proto::EventType::Bootstrapped,
                    &tombstone(&ns, &ty, ""),
                    None,
                    Some(encode_bookmark(epoch, pos)),
                ));
            }
            pos
        } else {
            let pos = self.store.position();
            if opts.bootstrap_bookmark {
                first.push(to_proto_event(
                    proto::EventType::Noop,
                    &tombstone(&ns, &ty, ""),
                    None,
                    Some(encode_bookmark(epoch, pos)),
                ));
            }
            pos
        };
        let mut w = Watcher {
            store: self.store.clone(),
            ns,
            ty,
            id: r.id,
            filter,
            aggregated: opts.aggregated,
            omit_old: opts.omit_old,
            api_version: r.api_version,
            epoch,
            pos,
            notify: Some(notify),
            queue: std::collections::VecDeque::new(),
            done: false,
            wait: false,
            _slot: slot,
        };
        // The empty response tells the client the watch is established (COSI's marker).
        w.queue.push_back(proto::WatchResponse::default());
        w.enqueue(
            first
                .iter()
                .map(|e| Bytes::from(e.encode_to_vec()))
                .collect(),
        );
        Ok(Response::new(Box::pin(w.into_stream())))
    }

    async fn teardown(
        &self,
        req: Request<proto::TeardownRequest>,
    ) -> Result<Response<proto::TeardownResponse>, Status> {
        self.check(&req, &req.get_ref().namespace, Access::Write)?;
        let r = req.into_inner();
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        check_request(&r.r#type, Some(&r.id), &owner)?;
        let ns = r.namespace.clone();
        let ready = self
            .write(&ns, move |s| {
                s.teardown(&r.namespace, &r.r#type, &r.id, &owner)
            })
            .await
            .map_err(status)?;
        Ok(Response::new(proto::TeardownResponse {
            destroy_ready: ready,
        }))
    }

    async fn teardown_and_destroy(
        &self,
        req: Request<proto::TeardownAndDestroyRequest>,
    ) -> Result<Response<proto::TeardownAndDestroyResponse>, Status> {
        self.check(&req, &req.get_ref().namespace, Access::Write)?;
        let r = req.into_inner();
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        check_request(&r.r#type, Some(&r.id), &owner)?;
        let mut notify = self.store.subscribe(&r.namespace, &r.r#type);
        let (ns, ty, id) = (r.namespace.clone(), r.r#type.clone(), r.id.clone());
        let o = owner.clone();
        let mut ready = self
            .write(&r.namespace, move |s| s.teardown(&ns, &ty, &id, &o))
            .await
            .map_err(status)?;
        loop {
            if ready {
                let (ns, ty, id) = (r.namespace.clone(), r.r#type.clone(), r.id.clone());
                let o = owner.clone();
                match self
                    .write(&r.namespace, move |s| s.destroy(&ns, &ty, &id, &o))
                    .await
                {
                    Ok(()) => break,
                    Err(e) if e.is_not_found() => break,
                    Err(e) if e.kind() == ErrorKind::Conflict => {}
                    Err(e) => return Err(status(e)),
                }
            }
            if notify.changed().await.is_err() {
                return Err(Status::unavailable("stated is shutting down"));
            }
            ready = match self.store.get(&r.namespace, &r.r#type, &r.id) {
                Ok(cur) => cur.metadata.finalizers.is_empty(),
                Err(_) => break,
            };
        }
        drop(notify);
        self.store.release(&r.namespace, &r.r#type);
        Ok(Response::new(proto::TeardownAndDestroyResponse {}))
    }
}

/// Writes in one batch at most.
pub const MAX_BATCH: usize = 256;

/// `talosrs.state.Batch`: several writes in one call, each checked and done exactly as the
/// State call of its name, by the same code, for the same peer.
#[derive(Clone)]
pub struct BatchService {
    state: StateService,
}

impl BatchService {
    /// The batch service beside `state`.
    pub fn new(state: StateService) -> Self {
        Self { state }
    }
}

/// The namespace a batch write is of.
fn batch_namespace(w: &batch::Write) -> &str {
    use batch::write::Op;
    fn md(r: &Option<proto::Resource>) -> &str {
        r.as_ref()
            .and_then(|r| r.metadata.as_ref())
            .map_or("", |m| m.namespace.as_str())
    }
    match &w.op {
        Some(Op::Create(r)) => md(&r.resource),
        Some(Op::Update(r)) => md(&r.new_resource),
        Some(Op::Destroy(r)) => &r.namespace,
        None => "",
    }
}

#[tonic::async_trait]
impl batch::batch_server::Batch for BatchService {
    async fn write(
        &self,
        req: Request<batch::WriteRequest>,
    ) -> Result<Response<batch::WriteResponse>, Status> {
        let peer = self.state.peer(&req);
        let writes = req.into_inner().writes;
        if writes.len() > MAX_BATCH {
            return Err(invalid(format!(
                "a batch of {} writes: at most {MAX_BATCH}",
                writes.len()
            )));
        }
        let durable = writes
            .iter()
            .any(|w| self.state.store.is_durable(batch_namespace(w)));
        let results = self
            .state
            .run_blocking_if(durable, move |s| Ok(s.write_all(&peer, writes)))
            .await?;
        Ok(Response::new(batch::WriteResponse { results }))
    }
}

/// One watch: pulls events after its position from the kind's history and hands them to the
/// connection as the response stream itself (no task or queue of its own: the connection polls
/// it when the client's flow-control window has room, so a slow client only delays itself). If
/// it falls behind the history, it sends an ERRORED event and ends; the client resumes from its
/// bookmark (or relists).
struct Watcher {
    store: Arc<Store>,
    ns: String,
    ty: String,
    id: Option<String>,
    filter: Filter,
    aggregated: bool,
    /// UPDATED events go without the old resource (the client asked: `omit_old`).
    omit_old: bool,
    api_version: i32,
    epoch: u64,
    pos: u64,
    /// Changes with every write of the kind; `None` once dropped (see `Drop`).
    notify: Option<tokio::sync::watch::Receiver<u64>>,
    /// Responses ready to send (the established marker and the first events; a batch split in
    /// several responses).
    queue: std::collections::VecDeque<proto::WatchResponse>,
    /// The stream ends once `queue` is empty.
    done: bool,
    /// Whether the next read waits for a write first: not at the start (a watch from a
    /// bookmark or with tail events has events to send at once), nor while the last read was a
    /// full batch (more are waiting). One batch is read at a time: what a watcher holds beyond
    /// the history is one response's worth.
    wait: bool,
    /// The peer's watch slot, given back when the watch ends.
    _slot: WatchSlot,
}

impl Drop for Watcher {
    /// The watch ended (or the client went away): the kind's collection is released if nothing
    /// is left in it, once this watch's receiver no longer counts.
    fn drop(&mut self) {
        self.notify = None;
        self.store.release(&self.ns, &self.ty);
    }
}

impl Watcher {
    fn into_stream(self) -> impl Stream<Item = Result<proto::WatchResponse, Status>> + Send {
        futures::stream::unfold(self, |mut w| async move {
            let r = w.next().await?;
            Some((Ok(r), w))
        })
    }

    /// Queues encoded events as responses: aggregated ones in batches that stay below what a
    /// client accepts in one message (a bootstrap of many resources goes out in several
    /// responses; the closing BOOTSTRAPPED tells the client where it ends), others one each.
    fn enqueue(&mut self, events: Vec<Bytes>) {
        if events.is_empty() {
            return;
        }
        if !self.aggregated {
            self.queue.extend(
                events
                    .into_iter()
                    .map(|e| proto::WatchResponse::encoded(vec![e])),
            );
            return;
        }
        let mut batch = Vec::new();
        let mut size = 0;
        for e in events {
            let len = proto::WatchResponse::encoded_event_len(&e);
            if !batch.is_empty() && (size + len > WATCH_BATCH_BYTES || batch.len() >= WATCH_BATCH) {
                self.queue
                    .push_back(proto::WatchResponse::encoded(std::mem::take(&mut batch)));
                size = 0;
            }
            size += len;
            batch.push(e);
        }
        self.queue.push_back(proto::WatchResponse::encoded(batch));
    }

    /// The next response; `None` when the watch is over.
    async fn next(&mut self) -> Option<proto::WatchResponse> {
        loop {
            if let Some(r) = self.queue.pop_front() {
                return Some(r);
            }
            if self.done {
                return None;
            }
            self.pull().await?;
        }
    }

    /// Waits for writes of the kind and queues the events this watch sends for them (one
    /// batch); `None` when stated is stopping.
    async fn pull(&mut self) -> Option<()> {
        if self.wait {
            self.notify.as_mut()?.changed().await.ok()?;
            // Under load, let the writes already running commit too, so that this watcher
            // sends them in one response (one frame, one write) instead of one each: go to the
            // back of the scheduler's queue as long as writes keep coming, a few times at
            // most. On an idle stated the queue is empty and nothing comes: one short trip.
            let woken = std::time::Instant::now();
            for _ in 0..COALESCE_ROUNDS {
                if woken.elapsed() > COALESCE_FOR {
                    break;
                }
                let before = *self.notify.as_mut()?.borrow();
                tokio::task::yield_now().await;
                if *self.notify.as_mut()?.borrow() == before {
                    break;
                }
            }
        }
        // Seen up to here: a write after this wakes the watch again, one before it is read.
        self.notify.as_mut()?.borrow_and_update();
        let (events, next) =
            match self
                .store
                .events_after(&self.ns, &self.ty, self.pos, WATCH_BATCH)
            {
                Ok(x) => x,
                Err(()) => {
                    self.overrun();
                    return Some(());
                }
            };
        self.wait = events.len() < WATCH_BATCH;
        let out: Vec<Bytes> = events.iter().filter_map(|e| self.encode(e)).collect();
        self.pos = next;
        self.enqueue(out);
        Some(())
    }

    /// The watch fell behind the history: a last ERRORED event with the bookmark to resume from
    /// (API version 1; older clients see the stream end).
    fn overrun(&mut self) {
        self.done = true;
        if self.api_version < 1 {
            return;
        }
        let event = proto::Event {
            resource: None,
            event_type: proto::EventType::Errored as i32,
            old: None,
            error: Some(format!(
                "buffer overrun: namespace {:?} type {:?}: the watch fell behind; resume from its last bookmark",
                self.ns, self.ty
            )),
            bookmark: Some(encode_bookmark(self.epoch, self.pos)),
        };
        self.queue.push_back(proto::WatchResponse {
            event: vec![event],
            encoded: Vec::new(),
        });
    }

    /// The event as this watcher sends it, encoded, or `None` if its filter drops it. An event
    /// sent as it happened (most are) is encoded once, by the first watcher, for all of them.
    fn encode(&self, e: &StoredEvent) -> Option<Bytes> {
        if let Some(id) = &self.id {
            if e.resource.metadata.id != *id {
                return None;
            }
        }
        let r = &e.resource;
        let new_match = self.filter.matches(&r.metadata.id, &r.metadata.labels);
        let kind = match e.kind {
            EventKind::Created if new_match => proto::EventType::Created,
            EventKind::Destroyed if new_match => proto::EventType::Destroyed,
            EventKind::Updated => {
                let old_match = e
                    .old
                    .as_ref()
                    .is_some_and(|o| self.filter.matches(&o.metadata.id, &o.metadata.labels));
                match (old_match, new_match) {
                    (true, true) => proto::EventType::Updated,
                    (true, false) => proto::EventType::Destroyed,
                    (false, true) => proto::EventType::Created,
                    (false, false) => return None,
                }
            }
            _ => return None,
        };
        let natural = match e.kind {
            EventKind::Created => proto::EventType::Created,
            EventKind::Updated => proto::EventType::Updated,
            EventKind::Destroyed => proto::EventType::Destroyed,
        };
        let bookmark = || Some(encode_bookmark(self.epoch, e.seq));
        if kind == natural {
            let old = e
                .old
                .as_deref()
                .filter(|_| kind == proto::EventType::Updated && !self.omit_old);
            // Created and destroyed events have no old resource: one form serves everyone.
            let cache = if old.is_none() {
                &e.wire
            } else {
                &e.wire_with_old
            };
            Some(
                cache
                    .get_or_init(|| wire_event(kind, &e.encoded, old, bookmark()))
                    .clone(),
            )
        } else {
            Some(Bytes::from(
                to_proto_event(kind, r, None, bookmark()).encode_to_vec(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::state_server::State;
    use std::sync::mpsc;
    use std::time::Duration;

    const HANG: Duration = Duration::from_secs(60);

    #[test]
    fn an_event_around_an_encoded_resource_decodes_as_the_event() {
        let mut r = tombstone("ns", "T", "a");
        r.spec = vec![9; 40];
        r.metadata.labels.insert("k".into(), "v".into());
        let mut old = r.clone();
        old.spec = vec![1];
        for (kind, old) in [
            (proto::EventType::Updated, Some(&old)),
            (proto::EventType::Updated, None),
            (proto::EventType::Created, None),
            (proto::EventType::Destroyed, None),
        ] {
            let bytes = wire_event(
                kind,
                &crate::store::encode_resource(&r),
                old,
                Some(encode_bookmark(1, 2)),
            );
            let decoded = proto::Event::decode(bytes.as_ref()).expect("decodes");
            assert_eq!(
                decoded,
                to_proto_event(kind, &r, old, Some(encode_bookmark(1, 2)))
            );
        }
    }

    fn req<T>(msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.extensions_mut().insert(InProcessPeer(0));
        r
    }

    fn create(ns: &str, id: &str) -> proto::CreateRequest {
        proto::CreateRequest {
            resource: Some(
                RawResource {
                    metadata: cosi::resource::Metadata::new(ns, "Things.test.dev", id),
                    spec: b"x".to_vec(),
                    yaml_spec: String::new(),
                }
                .to_proto(),
            ),
            options: Some(proto::CreateOptions {
                owner: "test".into(),
            }),
        }
    }

    /// On a runtime of one thread, a Create of a durable namespace waiting for its disk does
    /// not stop that thread: a Get and a Create of another namespace are answered meanwhile,
    /// and the durable Create finishes once the disk does.
    #[test]
    fn a_durable_write_does_not_stall_the_async_worker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (run, state) = (dir.path().join("run"), dir.path().join("state"));
        let store = Arc::new(
            Store::open(crate::store::StoreConfig {
                run_dir: Some(&run),
                state_dir: Some(&state),
                durable: Box::new(|ns| ns == "config"),
                namespaces: Vec::new(),
                history: 64,
                limits: crate::store::Limits::default(),
            })
            .expect("the store opens"),
        );
        let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (release, release_rx) = mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        store.pause_durable_writes(Some(Arc::new(move || {
            let _ = entered_tx.send(());
            let _ = release_rx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .recv_timeout(HANG);
        })));
        let service = StateService::new(
            store.clone(),
            Arc::new(Policy::standalone()),
            PeerLimits::default(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (done_tx, done) = mpsc::channel();
        // The runtime's only thread is this test's: if the durable write blocked it, nothing
        // below would run and `done` would never come.
        let watchdog = std::thread::spawn(move || done.recv_timeout(HANG));
        rt.block_on(async move {
            let mut entered = entered;
            let durable = {
                let s = service.clone();
                tokio::spawn(async move { s.create(req(create("config", "machine"))).await })
            };
            tokio::time::timeout(HANG, entered.recv())
                .await
                .expect("the durable write reaches its disk");
            service
                .create(req(create("net", "eth0")))
                .await
                .expect("a create of another namespace, meanwhile");
            let got = service
                .get(req(proto::GetRequest {
                    namespace: "net".into(),
                    r#type: "Things.test.dev".into(),
                    id: "eth0".into(),
                    ..Default::default()
                }))
                .await
                .expect("a get, meanwhile");
            assert!(got.into_inner().resource.is_some());
            assert!(
                !durable.is_finished(),
                "the durable write did not wait for its disk"
            );
            release.send(()).expect("the writer waits");
            let created = durable
                .await
                .expect("the durable create task")
                .expect("the durable create");
            // On the wire, as a client decodes it (stated sends the resource encoded).
            let created =
                proto::CreateResponse::decode(created.into_inner().encode_to_vec().as_slice())
                    .expect("decodes");
            let md = created.resource.and_then(|r| r.metadata);
            assert_eq!(md.map(|m| m.version), Some("1".to_string()));
            let _ = done_tx.send(());
        });
        watchdog
            .join()
            .expect("the watchdog")
            .expect("the runtime's thread was held up by a durable write");
    }
}
