//! Forwarding to other nodes' apid, as upstream's director (`internal/app/apid/pkg/director`)
//! and its one-to-many proxy (`siderolabs/grpc-proxy`):
//!
//! - a request with `proxyfrom` metadata came from another apid: it is served here;
//! - `node: X` (one value) is forwarded to X's apid, request and reply passed through as they
//!   are (any service, streams included);
//! - `nodes: X, Y, …` (taking precedence over `node`) is sent to every node at once, for the
//!   services upstream fans out (machine, cluster, inspect, storage, time): a unary call's
//!   replies are concatenated into one (each message's `metadata.hostname` naming its node),
//!   a stream's messages interleave; a node's failure is one more message carrying
//!   `metadata.error` and `metadata.status`, and the call itself succeeds;
//! - nothing else is served here.
//!
//! The forwarded request carries only the `context` and `runtime` metadata of the original,
//! plus `talos-role` (the caller's roles, as this apid resolved them) and `proxyfrom` (the
//! authority the client called). apid forwards with its own `os:impersonator` certificate, so
//! the target apid authorizes the call with the original caller's roles, never more; and this
//! apid has authorized it already ([`crate::auth`] runs first).
//!
//! Where we differ from upstream, on purpose: targets are IP addresses (apid resolves no names:
//! its sandbox has no resolver and may connect only to port 50000); a target naming a port is
//! INVALID_ARGUMENT (upstream: INTERNAL); at most [`MAX_TARGETS`] nodes per call; replies are
//! bounded ([`MAX_REPLY`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Limited, StreamBody};
use machinery::tls;
use prost::Message;
use proto::common::{Empty, EmptyResponse, Metadata};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tower::ServiceExt;

use crate::auth::{Roles, ROLE_METADATA};
use crate::controller::Identity;

/// Set on forwarded requests: serve here, do not forward again.
pub const PROXY_FROM: &str = "proxyfrom";
/// The one node to forward to.
pub const NODE: &str = "node";
/// The nodes to fan out to.
pub const NODES: &str = "nodes";
/// Nodes one call may name.
pub const MAX_TARGETS: usize = 64;
/// Time to connect to another node's apid (TCP and TLS each).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest reply a one-to-many unary call assembles (all nodes' replies together), and largest
/// message read from a node.
pub const MAX_REPLY: usize = cosi::client::MAX_MESSAGE;
/// Connections to other nodes kept open.
const MAX_CHANNELS: usize = 64;
/// Calls this apid has open at once on its connection to one node: what that node's apid
/// allows a connection ([`crate::run::MAX_STREAMS_PER_CONNECTION`]).
pub const PEER_CALLS: usize = crate::run::MAX_STREAMS_PER_CONNECTION;
/// Of those, the calls one client connection may have open to one node.
pub const PEER_CALLS_PER_CALLER: usize = PEER_CALLS / 4;
/// gRPC's message header: compressed flag, length.
const HEADER: usize = 5;

/// Method prefixes upstream fans out (`director.go`'s `Director`).
const ONE_TO_MANY: &[&str] = &[
    "/machine.MachineService/",
    "/cluster.ClusterService/",
    "/inspect.InspectService/",
    "/storage.StorageService/",
    "/time.TimeService/",
    // Ours, shaped as upstream's replies (repeated messages with common.Metadata).
    "/talosrs.audit.AuditService/",
];

/// Server-streaming methods (upstream's `apid` `streamedMatchers`); also any method whose name
/// ends in `Stream`.
const STREAMED: &[&str] = &[
    "/machine.MachineService/Copy",
    "/machine.MachineService/DiskUsage",
    "/machine.MachineService/Dmesg",
    "/machine.MachineService/EtcdSnapshot",
    "/machine.MachineService/Events",
    "/machine.MachineService/ImageList",
    "/machine.MachineService/Kubeconfig",
    "/machine.MachineService/List",
    "/machine.MachineService/Logs",
    "/machine.MachineService/PacketCapture",
    "/machine.MachineService/Read",
    "/os.OSService/Dmesg",
    "/cluster.ClusterService/HealthCheck",
];

/// The incoming metadata a forwarded request keeps (upstream's allowlist).
const FORWARDED: &[&str] = &["context", "runtime"];

/// Whether `method` streams its replies.
pub fn is_streamed(method: &str) -> bool {
    STREAMED.contains(&method) || method.ends_with("Stream")
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Served by this apid.
    Local,
    /// Forwarded to one node, passed through.
    One(IpAddr),
    /// Sent to each node, replies merged.
    Many(Vec<IpAddr>),
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// The values of metadata `key`: every header of that name, each split at commas, trimmed,
/// empty ones skipped.
fn values<'a>(headers: &'a HeaderMap, key: &str) -> Result<Vec<&'a str>, Status> {
    let mut out = Vec::new();
    for v in headers.get_all(key) {
        let v = v
            .to_str()
            .map_err(|_| invalid(format!("{key} metadata is not text")))?;
        out.extend(v.split(',').map(str::trim).filter(|v| !v.is_empty()));
    }
    Ok(out)
}

/// A node's address as a target: an IP address, IPv6 optionally in brackets.
///
/// # Errors
///
/// INVALID_ARGUMENT for anything else, saying what to give instead.
pub fn target(text: &str) -> Result<IpAddr, Status> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    match bare.parse::<IpAddr>() {
        Ok(ip)
            if ip.is_unspecified()
                || ip.is_multicast()
                || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()) =>
        {
            Err(invalid(format!(
                "invalid target {text:?}: not the address of a node"
            )))
        }
        Ok(ip) => Ok(ip),
        Err(_) if text.parse::<SocketAddr>().is_ok() || has_port(text) => Err(invalid(format!(
            "invalid target {text:?}: give the node's address without a port (apid forwards to port 50000)"
        ))),
        Err(_) => Err(invalid(format!(
            "invalid target {text:?}: apid forwards to IP addresses only, it resolves no names"
        ))),
    }
}

/// `host:port` with a host that is not itself an IPv6 address.
fn has_port(text: &str) -> bool {
    text.rsplit_once(':')
        .is_some_and(|(host, port)| !host.contains(':') && port.parse::<u16>().is_ok())
}

/// Where the request for `method` with `headers` goes.
///
/// # Errors
///
/// INVALID_ARGUMENT: a bad target, more than one `node`, more than [`MAX_TARGETS`] `nodes`,
/// `nodes` for a method upstream does not fan out.
pub fn route(method: &str, headers: &HeaderMap) -> Result<Route, Status> {
    if headers.contains_key(PROXY_FROM) {
        return Ok(Route::Local);
    }
    let nodes = values(headers, NODES)?;
    if !nodes.is_empty() {
        if !ONE_TO_MANY.iter().any(|p| method.starts_with(p)) {
            return Err(invalid(format!(
                "one-2-many proxying is not supported for method {method}"
            )));
        }
        if nodes.len() > MAX_TARGETS {
            return Err(invalid(format!(
                "{} nodes named; one call reaches at most {MAX_TARGETS}",
                nodes.len()
            )));
        }
        return nodes
            .into_iter()
            .map(target)
            .collect::<Result<_, _>>()
            .map(Route::Many);
    }
    match values(headers, NODE)?.as_slice() {
        [] => Ok(Route::Local),
        [one] => target(one).map(Route::One),
        _ => Err(invalid("node metadata must be single-valued".into())),
    }
}

/// Go's name of a gRPC code, as upstream's error strings spell it.
fn go_code(code: Code) -> String {
    match code {
        Code::Cancelled => "Canceled".into(),
        c => format!("{c:?}"),
    }
}

/// The metadata of a failed node's reply: upstream's `BuildError`.
fn error_metadata(hostname: &str, status: &Status) -> Metadata {
    Metadata {
        hostname: hostname.to_string(),
        error: format!(
            "rpc error: code = {} desc = {}",
            go_code(status.code()),
            status.message()
        ),
        status: Some(proto::google::rpc::Status {
            code: status.code() as i32,
            message: status.message().to_string(),
            details: Vec::new(),
        }),
    }
}

/// A failed node's reply: for a stream, one message with only its metadata; for a unary call,
/// a reply whose one message is that.
pub fn error_reply(hostname: &str, status: &Status, streamed: bool) -> Vec<u8> {
    let empty = Empty {
        metadata: Some(error_metadata(hostname, status)),
    };
    if streamed {
        empty.encode_to_vec()
    } else {
        EmptyResponse {
            messages: vec![empty],
        }
        .encode_to_vec()
    }
}

/// `metadata { hostname }`, as a message whose field 1 is the metadata (every reply message
/// of the API is one).
fn hostname_field(hostname: &str) -> Vec<u8> {
    Empty {
        metadata: Some(Metadata {
            hostname: hostname.to_string(),
            ..Metadata::default()
        }),
    }
    .encode_to_vec()
}

/// A unary reply seen as what every one of the API's is: `repeated Message messages = 1`.
#[derive(Clone, PartialEq, prost::Message)]
struct Reply {
    #[prost(bytes = "vec", repeated, tag = "1")]
    messages: Vec<Vec<u8>>,
}

/// A node's unary reply with `metadata.hostname` set in each of its messages (upstream's
/// `AppendInfo`: the field is appended, and the last one wins when the message is read); a
/// reply without messages gets one holding only the metadata.
///
/// # Errors
///
/// INTERNAL when the reply is not of that shape.
pub fn append_unary(reply: &[u8], hostname: &str) -> Result<Vec<u8>, Status> {
    let mut r = Reply::decode(reply)
        .map_err(|e| Status::internal(format!("reply of {hostname} does not decode: {e}")))?;
    let extra = hostname_field(hostname);
    if r.messages.is_empty() {
        r.messages.push(extra);
    } else {
        for m in &mut r.messages {
            m.extend_from_slice(&extra);
        }
    }
    Ok(r.encode_to_vec())
}

/// A streamed message with `metadata.hostname` set.
pub fn append_streamed(message: &[u8], hostname: &str) -> Vec<u8> {
    let mut m = message.to_vec();
    m.extend_from_slice(&hostname_field(hostname));
    m
}

/// `message` as one gRPC frame (uncompressed).
fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER + message.len());
    b.put_u8(0);
    // Bounded by MAX_REPLY, far below u32::MAX.
    b.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    b.put_slice(message);
    b.freeze()
}

/// The messages of a gRPC body, as its data arrives.
#[derive(Debug, Default)]
pub struct Frames {
    buf: BytesMut,
}

impl Frames {
    /// Adds data.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message.
    ///
    /// # Errors
    ///
    /// INTERNAL for a compressed message (apid asks for none); RESOURCE_EXHAUSTED for one
    /// larger than [`MAX_REPLY`].
    pub fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Status::internal(
                "a node sent a compressed message though none was asked for",
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_REPLY {
            return Err(Status::resource_exhausted(format!(
                "a node's message of {len} bytes is larger than the {MAX_REPLY} apid forwards"
            )));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        self.buf.advance(HEADER);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// Whether data of an unfinished message is left.
    pub fn is_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Connections to other nodes' apid, made with this node's client identity, one per address,
/// dropped when the identity changes.
#[derive(Clone, Debug)]
pub struct Peers {
    identity: Arc<RwLock<Option<Identity>>>,
    port: u16,
    cache: Arc<Mutex<Cache>>,
    /// Calls each client connection has open to each node.
    callers: Arc<Mutex<HashMap<(SocketAddr, IpAddr), usize>>>,
}

/// One call of a client connection to a node, counted until dropped.
struct CallerSlot {
    callers: Arc<Mutex<HashMap<(SocketAddr, IpAddr), usize>>>,
    key: (SocketAddr, IpAddr),
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = callers.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                callers.remove(&self.key);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Cache {
    config: Option<Arc<tls::rustls::ClientConfig>>,
    channels: HashMap<IpAddr, (Channel, Arc<Semaphore>)>,
}

impl Peers {
    /// Peers reached on `port` with `identity` (the certificate controller keeps it current).
    pub fn new(identity: Arc<RwLock<Option<Identity>>>, port: u16) -> Self {
        Self {
            identity,
            port,
            cache: Arc::default(),
            callers: Arc::default(),
        }
    }

    /// A slot for one more call of client connection `caller` to `ip`, or RESOURCE_EXHAUSTED
    /// past [`PEER_CALLS_PER_CALLER`]: one client cannot take every call the shared connection
    /// to a node carries.
    fn caller_slot(&self, caller: SocketAddr, ip: IpAddr) -> Result<CallerSlot, Status> {
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        let n = callers.entry((caller, ip)).or_insert(0);
        if *n >= PEER_CALLS_PER_CALLER {
            return Err(Status::resource_exhausted(format!(
                "node {ip}: this connection has {PEER_CALLS_PER_CALLER} calls open to it \
                 already (the most one client connection may): try again when some have ended"
            )));
        }
        *n += 1;
        Ok(CallerSlot {
            callers: self.callers.clone(),
            key: (caller, ip),
        })
    }

    /// The shared channel to `ip`'s apid and its count of calls in flight.
    fn channel(&self, ip: IpAddr) -> Result<(Channel, Arc<Semaphore>), Status> {
        let config = self
            .identity
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|i| i.config.clone())
            .ok_or_else(|| {
                Status::unavailable(
                    "this node has no client certificate for other nodes' apid \
                     (only a control plane forwards); call the node directly",
                )
            })?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if !cache
            .config
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &config))
        {
            cache.channels.clear();
            cache.config = Some(config.clone());
        }
        if let Some(c) = cache.channels.get(&ip) {
            return Ok(c.clone());
        }
        if cache.channels.len() >= MAX_CHANNELS {
            if let Some(old) = cache.channels.keys().next().copied() {
                cache.channels.remove(&old);
            }
        }
        let channel = tls::channel(
            SocketAddr::new(ip, self.port),
            &ip.to_string(),
            config,
            CONNECT_TIMEOUT,
        )
        .map_err(|e| Status::internal(format!("channel to {ip}: {e}")))?;
        let slots = Arc::new(Semaphore::new(PEER_CALLS));
        cache.channels.insert(ip, (channel.clone(), slots.clone()));
        Ok((channel, slots))
    }
}

/// The request as it goes to other nodes: path and the headers kept, and (not sent) the
/// client connection it came on.
#[derive(Clone, Debug)]
struct Outgoing {
    uri: http::Uri,
    headers: HeaderMap,
    caller: Option<SocketAddr>,
}

/// In a forwarded request's extensions: the client connection it came on.
#[derive(Clone, Copy, Debug)]
struct Caller(SocketAddr);

impl Outgoing {
    fn new(parts: &http::request::Parts, roles: &Roles) -> Result<Self, Status> {
        let mut headers = HeaderMap::new();
        for name in [CONTENT_TYPE, TE, HeaderName::from_static("grpc-timeout")] {
            for v in parts.headers.get_all(&name) {
                headers.append(name.clone(), v.clone());
            }
        }
        for key in FORWARDED {
            for v in parts.headers.get_all(*key) {
                headers.append(HeaderName::from_static(key), v.clone());
            }
        }
        for role in roles.iter() {
            let v = HeaderValue::from_str(role)
                .map_err(|_| Status::internal(format!("role {role:?} is not a header value")))?;
            headers.append(HeaderName::from_static(ROLE_METADATA), v);
        }
        let from = parts
            .uri
            .authority()
            .map(|a| a.as_str().to_string())
            .or_else(|| {
                parts
                    .headers
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "unknown".into());
        headers.insert(
            HeaderName::from_static(PROXY_FROM),
            HeaderValue::from_str(&from).unwrap_or_else(|_| HeaderValue::from_static("unknown")),
        );
        let uri = parts
            .uri
            .path_and_query()
            .map(|p| http::Uri::from(p.clone()))
            .ok_or_else(|| invalid("request without a path".into()))?;
        let caller = parts.extensions.get::<tls::ConnectInfo>().map(|i| i.remote);
        Ok(Self {
            uri,
            headers,
            caller,
        })
    }

    fn request(&self, body: Body) -> Request<Body> {
        let mut req = Request::new(body);
        *req.method_mut() = http::Method::POST;
        *req.version_mut() = http::Version::HTTP_2;
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        if let Some(c) = self.caller {
            req.extensions_mut().insert(Caller(c));
        }
        req
    }
}

/// `e` and its sources.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        s.push_str(": ");
        s.push_str(&e.to_string());
        source = e.source();
    }
    s
}

/// Sends `req` to `ip`; a reply whose headers already carry a failure (trailers-only) is that
/// failure. Every caller of this apid shares one connection per node, which that node's apid
/// lets carry [`PEER_CALLS`] calls at once: past that a call is refused at once
/// (RESOURCE_EXHAUSTED) instead of waiting, unseen, behind others' open streams. The slot is
/// held until the reply's body is dropped (a followed log holds it while it is followed).
async fn call(peers: &Peers, ip: IpAddr, req: Request<Body>) -> Result<Response<Body>, Status> {
    let (channel, slots) = peers.channel(ip)?;
    let caller = match req.extensions().get::<Caller>() {
        Some(Caller(c)) => Some(peers.caller_slot(*c, ip)?),
        None => None,
    };
    let slot = slots.try_acquire_owned().map_err(|_| {
        Status::resource_exhausted(format!(
            "node {ip}: {PEER_CALLS} calls through this apid are open to it already (its \
             connection's limit): try again when some have ended"
        ))
    })?;
    let resp = channel
        .oneshot(req)
        .await
        .map_err(|e| Status::unavailable(format!("node {ip}: {}", chain(&e))))?;
    if resp.status() != http::StatusCode::OK {
        return Err(Status::unknown(format!(
            "node {ip} answered HTTP {}",
            resp.status()
        )));
    }
    match Status::from_header_map(resp.headers()) {
        Some(s) if s.code() != Code::Ok => Err(s),
        _ => Ok(resp.map(|body| {
            Body::new(body.map_frame(move |f| {
                let _held = (&slot, &caller);
                f
            }))
        })),
    }
}

/// A node's reply, message by message, then its status.
struct ReplyReader {
    ip: IpAddr,
    body: Body,
    frames: Frames,
}

impl ReplyReader {
    fn new(ip: IpAddr, resp: Response<Body>) -> Self {
        Self {
            ip,
            body: resp.into_body(),
            frames: Frames::default(),
        }
    }

    /// The next message; `None` once the node said OK.
    ///
    /// # Errors
    ///
    /// The node's failure, or what went wrong reading it.
    async fn next(&mut self) -> Result<Option<Bytes>, Status> {
        let ip = self.ip;
        loop {
            if let Some(m) = self.frames.next_message()? {
                return Ok(Some(m));
            }
            let frame = match self.body.frame().await {
                None => {
                    return Err(Status::internal(format!(
                        "node {ip} ended its reply without a status"
                    )))
                }
                Some(Err(e)) => return Err(Status::unavailable(format!("node {ip}: {e}"))),
                Some(Ok(f)) => f,
            };
            match frame.into_data() {
                Ok(data) => self.frames.push(&data),
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    if self.frames.is_partial() {
                        return Err(Status::internal(format!(
                            "node {ip} sent a truncated message"
                        )));
                    }
                    return match Status::from_header_map(&trailers) {
                        Some(s) if s.code() == Code::Ok => Ok(None),
                        Some(s) => Err(s),
                        None => Err(Status::internal(format!(
                            "node {ip} ended its reply without a status"
                        ))),
                    };
                }
            }
        }
    }
}

/// One node's answer to a unary call: its one message.
async fn unary(peers: &Peers, ip: IpAddr, req: Request<Body>) -> Result<Bytes, Status> {
    let mut reply = ReplyReader::new(ip, call(peers, ip, req).await?);
    let first = reply
        .next()
        .await?
        .ok_or_else(|| Status::internal(format!("node {ip} sent no reply")))?;
    if reply.next().await?.is_some() {
        return Err(Status::internal(format!(
            "node {ip} sent more than one reply to a unary call"
        )));
    }
    Ok(first)
}

/// `grpc-status: 0`.
fn ok_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t
}

fn grpc_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    resp
}

/// Fans a unary call out to `targets` and merges the replies.
async fn many_unary(
    peers: Peers,
    targets: Vec<IpAddr>,
    out: Outgoing,
    request: Bytes,
) -> Response<Body> {
    let calls = targets.iter().map(|&ip| {
        let req = out.request(Body::new(http_body_util::Full::new(request.clone())));
        let peers = peers.clone();
        async move { unary(&peers, ip, req).await }
    });
    let replies = futures::future::join_all(calls).await;
    let mut merged = Vec::new();
    for (ip, reply) in targets.iter().zip(replies) {
        let hostname = ip.to_string();
        let part = match reply.and_then(|r| append_unary(&r, &hostname)) {
            Ok(p) => p,
            Err(s) => {
                tracing::debug!(node = %ip, error = %s, "forwarded call failed");
                error_reply(&hostname, &s, false)
            }
        };
        let part = if merged.len() + part.len() > MAX_REPLY {
            error_reply(
                &hostname,
                &Status::resource_exhausted(format!(
                    "the replies of all nodes together exceed {MAX_REPLY} bytes"
                )),
                false,
            )
        } else {
            part
        };
        merged.extend_from_slice(&part);
    }
    let frames = futures::stream::iter([
        Ok::<_, Status>(Frame::data(frame(&merged))),
        Ok(Frame::trailers(ok_trailers())),
    ]);
    grpc_response(Body::new(StreamBody::new(frames)))
}

/// One node's part of a streamed one-to-many call: its messages, then its failure if any.
async fn stream_one(peers: Peers, ip: IpAddr, req: Request<Body>, tx: mpsc::Sender<Bytes>) {
    let hostname = ip.to_string();
    let result = async {
        let mut reply = ReplyReader::new(ip, call(&peers, ip, req).await?);
        while let Some(m) = reply.next().await? {
            if tx
                .send(frame(&append_streamed(&m, &hostname)))
                .await
                .is_err()
            {
                // The client went away: nobody to tell.
                return Ok(());
            }
        }
        Ok::<_, Status>(())
    }
    .await;
    if let Err(s) = result {
        tracing::debug!(node = %ip, error = %s, "forwarded stream failed");
        let _ = tx.send(frame(&error_reply(&hostname, &s, true))).await;
    }
}

/// Fans a streamed call out to `targets`: every node's messages as they come, then OK. The
/// calls end when the client goes away (the body, which holds them, is dropped).
fn many_streamed(
    peers: Peers,
    targets: Vec<IpAddr>,
    out: Outgoing,
    request: Bytes,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let mut tasks = JoinSet::new();
    for ip in targets {
        let req = out.request(Body::new(http_body_util::Full::new(request.clone())));
        tasks.spawn(stream_one(peers.clone(), ip, req, tx.clone()));
    }
    drop(tx);
    let frames = futures::stream::unfold(Some((rx, tasks)), |state| async move {
        let (mut rx, tasks) = state?;
        match rx.recv().await {
            Some(b) => Some((Ok::<_, Status>(Frame::data(b)), Some((rx, tasks)))),
            None => Some((Ok(Frame::trailers(ok_trailers())), None)),
        }
    });
    grpc_response(Body::new(StreamBody::new(frames)))
}

/// Forwards a request `route` says is not local.
async fn forward(peers: Peers, route: Route, req: Request<Body>) -> Response<Body> {
    let method = req.uri().path().to_string();
    let (parts, body) = req.into_parts();
    let Some(roles) = parts.extensions.get::<Arc<Roles>>().cloned() else {
        return Status::unauthenticated("the caller's roles are unknown").into_http();
    };
    let out = match Outgoing::new(&parts, &roles) {
        Ok(o) => o,
        Err(s) => return s.into_http(),
    };
    if parts
        .headers
        .get("grpc-encoding")
        .is_some_and(|e| e != "identity")
    {
        return Status::unimplemented("apid forwards uncompressed requests only").into_http();
    }
    match route {
        Route::Local => Status::internal("a local request reached the proxy").into_http(),
        Route::One(ip) => {
            tracing::debug!(node = %ip, %method, "forwarding");
            match call(&peers, ip, out.request(body)).await {
                Ok(resp) => resp,
                Err(s) => s.into_http(),
            }
        }
        Route::Many(targets) => {
            tracing::debug!(nodes = targets.len(), %method, "fanning out");
            let request = match Limited::new(body, crate::run::MAX_REQUEST + HEADER)
                .collect()
                .await
            {
                Ok(c) => c.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return Status::resource_exhausted(format!(
                        "request larger than {} bytes",
                        crate::run::MAX_REQUEST
                    ))
                    .into_http()
                }
                Err(e) => {
                    return Status::cancelled(format!("reading the request: {e}")).into_http()
                }
            };
            if is_streamed(&method) {
                many_streamed(peers, targets, out, request)
            } else {
                many_unary(peers, targets, out, request).await
            }
        }
    }
}

/// The layer that forwards requests for other nodes; inside [`crate::auth::AuthzLayer`], so
/// only authorized requests are forwarded and the caller's roles are known.
#[derive(Clone, Debug)]
pub struct ProxyLayer {
    peers: Peers,
}

impl ProxyLayer {
    /// Forwarding through `peers`.
    pub fn new(peers: Peers) -> Self {
        Self { peers }
    }
}

impl<S> tower::Layer<S> for ProxyLayer {
    type Service = Proxy<S>;

    fn layer(&self, inner: S) -> Proxy<S> {
        Proxy {
            inner,
            peers: self.peers.clone(),
        }
    }
}

/// See [`ProxyLayer`].
#[derive(Clone, Debug)]
pub struct Proxy<S> {
    inner: S,
    peers: Peers,
}

impl<S> tower::Service<Request<Body>> for Proxy<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match route(req.uri().path(), req.headers()) {
            Ok(Route::Local) => Box::pin(self.inner.call(req)),
            Ok(route) => {
                let peers = self.peers.clone();
                Box::pin(async move { Ok(forward(peers, route, req).await) })
            }
            Err(status) => {
                tracing::info!(method = %req.uri().path(), error = %status.message(), "request refused");
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proto::machine::{Version, VersionInfo, VersionResponse};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    const VERSION: &str = "/machine.MachineService/Version";

    #[test]
    fn routes_follow_upstreams_director() {
        assert_eq!(route(VERSION, &headers(&[])).unwrap(), Route::Local);
        assert_eq!(
            route(VERSION, &headers(&[("node", "10.5.0.3")])).unwrap(),
            Route::One("10.5.0.3".parse().unwrap())
        );
        // proxyfrom wins: a forwarded request is never forwarded again.
        assert_eq!(
            route(
                VERSION,
                &headers(&[("node", "10.5.0.3"), ("proxyfrom", "10.5.0.2")])
            )
            .unwrap(),
            Route::Local
        );
        // nodes wins over node; repeated headers and commas both list nodes.
        assert_eq!(
            route(
                VERSION,
                &headers(&[
                    ("node", "10.5.0.9"),
                    ("nodes", "10.5.0.2"),
                    ("nodes", "10.5.0.3, [fd00::1]")
                ])
            )
            .unwrap(),
            Route::Many(vec![
                "10.5.0.2".parse().unwrap(),
                "10.5.0.3".parse().unwrap(),
                "fd00::1".parse().unwrap()
            ])
        );
        // One-to-one works for any service; one-to-many only for upstream's.
        assert_eq!(
            route(
                "/cosi.resource.State/Get",
                &headers(&[("node", "10.5.0.3")])
            )
            .unwrap(),
            Route::One("10.5.0.3".parse().unwrap())
        );
        let e = route(
            "/cosi.resource.State/Get",
            &headers(&[("nodes", "10.5.0.3")]),
        )
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("one-2-many"), "{}", e.message());
        let e = route(
            VERSION,
            &headers(&[("node", "10.5.0.3"), ("node", "10.5.0.4")]),
        )
        .unwrap_err();
        assert_eq!(e.message(), "node metadata must be single-valued");
    }

    #[test]
    fn targets_are_addresses_without_port() {
        for (bad, says) in [
            ("10.5.0.2:50000", "without a port"),
            ("[fd00::1]:50000", "without a port"),
            ("cp-1", "resolves no names"),
            ("cp-1:50000", "without a port"),
            ("0.0.0.0", "not the address of a node"),
            ("::", "not the address of a node"),
            ("224.0.0.1", "not the address of a node"),
            ("255.255.255.255", "not the address of a node"),
        ] {
            let e = target(bad).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
            assert!(e.message().contains(says), "{bad}: {}", e.message());
        }
        assert_eq!(target("fd00::1").unwrap(), target("[fd00::1]").unwrap());
        let many: Vec<String> = (0..=MAX_TARGETS).map(|i| format!("10.0.0.{i}")).collect();
        let mut h = HeaderMap::new();
        for n in &many {
            h.append("nodes", HeaderValue::from_str(n).unwrap());
        }
        let e = route(VERSION, &h).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("at most 64"), "{}", e.message());
    }

    fn version(tag: &str, hostname: Option<&str>) -> VersionResponse {
        VersionResponse {
            messages: vec![Version {
                metadata: hostname.map(|h| Metadata {
                    hostname: h.into(),
                    ..Metadata::default()
                }),
                version: Some(VersionInfo {
                    tag: tag.into(),
                    ..VersionInfo::default()
                }),
                ..Version::default()
            }],
        }
    }

    #[test]
    fn replies_get_their_nodes_hostname_and_merge_by_concatenation() {
        let a = append_unary(&version("v1", None).encode_to_vec(), "10.5.0.2").unwrap();
        // A hostname the node set itself is overridden by the target's.
        let b = append_unary(&version("v2", Some("cp-2")).encode_to_vec(), "10.5.0.3").unwrap();
        let failed = error_reply(
            "10.5.0.4",
            &Status::unavailable("connection refused"),
            false,
        );
        let merged = [a, b, failed].concat();
        let r = VersionResponse::decode(merged.as_slice()).unwrap();
        assert_eq!(r.messages.len(), 3);
        let m = |i: usize| r.messages[i].metadata.clone().unwrap();
        assert_eq!(m(0).hostname, "10.5.0.2");
        assert_eq!(r.messages[0].version.as_ref().unwrap().tag, "v1");
        assert_eq!(m(1).hostname, "10.5.0.3");
        assert_eq!(r.messages[1].version.as_ref().unwrap().tag, "v2");
        assert_eq!(m(2).hostname, "10.5.0.4");
        assert_eq!(
            m(2).error,
            "rpc error: code = Unavailable desc = connection refused"
        );
        assert_eq!(m(2).status.unwrap().code, Code::Unavailable as i32);
        assert!(r.messages[2].version.is_none());
        // A reply without messages still says where it came from.
        let empty = append_unary(&[], "10.5.0.5").unwrap();
        let r = VersionResponse::decode(empty.as_slice()).unwrap();
        assert_eq!(
            r.messages[0].metadata.as_ref().unwrap().hostname,
            "10.5.0.5"
        );
        // A reply that is not the API's shape is refused, not passed on.
        assert_eq!(
            append_unary(&[0x0a, 0x05, 0x01], "x").unwrap_err().code(),
            Code::Internal
        );
        let s = append_streamed(&version("v3", None).messages[0].encode_to_vec(), "10.5.0.6");
        let v = Version::decode(s.as_slice()).unwrap();
        assert_eq!(v.metadata.unwrap().hostname, "10.5.0.6");
        assert_eq!(go_code(Code::Cancelled), "Canceled");
    }

    #[test]
    fn frames_are_split_and_bounded() {
        let mut f = Frames::default();
        let a = frame(b"abc");
        let b = frame(b"");
        let both = [a.as_ref(), b.as_ref()].concat();
        f.push(&both[..2]);
        assert_eq!(f.next_message().unwrap(), None);
        f.push(&both[2..]);
        assert_eq!(f.next_message().unwrap().unwrap().as_ref(), b"abc");
        assert_eq!(f.next_message().unwrap().unwrap().as_ref(), b"");
        assert!(!f.is_partial());
        let mut f = Frames::default();
        f.push(&[1, 0, 0, 0, 1, 0]);
        assert_eq!(f.next_message().unwrap_err().code(), Code::Internal);
        let mut f = Frames::default();
        f.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            f.next_message().unwrap_err().code(),
            Code::ResourceExhausted
        );
    }
}
