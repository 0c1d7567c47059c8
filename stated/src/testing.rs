//! A real stated in-process on a temporary socket, for tests of clients and controllers.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::runtime::Runtime;

use crate::{Config, Manifest, Store};

/// A running in-process stated. Dropping it stops the server.
pub struct Harness {
    /// A client connected to it.
    pub client: cosi::Client,
    /// Its socket.
    pub socket: PathBuf,
    /// Its configuration (directories inside a temporary directory).
    pub config: Config,
    /// The store, for assertions that bypass the API.
    pub store: Arc<Store>,
    dir: tempfile::TempDir,
    runtime: Option<Runtime>,
}

impl Harness {
    /// Starts a standalone stated (admin-only access, which a root test process has).
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Starts a stated with a manifest.
    pub async fn start_with(manifest: Option<Manifest>) -> Self {
        Self::start_configured(|c| c.manifest = manifest).await
    }

    /// Starts a stated after `f` has adjusted its configuration.
    pub async fn start_configured(f: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("stated-test")
            .tempdir()
            .expect("temporary directory");
        let mut config = Config {
            socket: dir.path().join("state.sock"),
            state_dir: dir.path().join("state"),
            run_dir: dir.path().join("run"),
            manifest: None,
            history: crate::store::DEFAULT_HISTORY,
            limits: crate::store::Limits::default(),
            peer_limits: crate::server::PeerLimits::default(),
        };
        f(&mut config);
        let (store, runtime) = spawn(&config);
        Self {
            client: cosi::Client::new(&config.socket).expect("client"),
            socket: config.socket.clone(),
            store,
            config,
            dir,
            runtime: Some(runtime),
        }
    }

    /// The temporary directory holding socket and state.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops the server as a crash would: every connection and task of it is dropped, nothing
    /// is flushed beyond what every write already did.
    pub async fn stop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            let _ = tokio::task::spawn_blocking(move || {
                rt.shutdown_timeout(std::time::Duration::from_secs(5))
            })
            .await;
        }
    }

    /// Restarts the server on the same socket and state, as init restarts stated in place.
    pub async fn restart(&mut self) {
        self.stop().await;
        let (store, runtime) = spawn(&self.config);
        self.store = store;
        self.runtime = Some(runtime);
    }
}

/// Runs the server on a runtime of its own, so that stopping it drops every connection as the
/// death of a process would.
fn spawn(config: &Config) -> (Arc<Store>, Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("stated-harness")
        .enable_all()
        .build()
        .expect("harness runtime");
    let store = Arc::new(crate::open_store(config).expect("open store"));
    let listener = {
        let _guard = rt.enter();
        crate::bind(&config.socket).expect("bind")
    };
    let cfg = config.clone();
    let s = store.clone();
    rt.spawn(async move {
        let _ = crate::serve(s, &cfg, listener, std::future::pending()).await;
    });
    (store, rt)
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The manifest of [`fuzz_requests`] in node mode: three namespaces, networkd (uid
/// [`FUZZ_NETWORKD_UID`]) writing `network` and defining `net.talos.dev` types, and a daemon
/// (uid [`FUZZ_OTHER_UID`]) writing `runtime`.
pub const FUZZ_MANIFEST: &str = r#"
namespaces:
  - {name: config, durable: true}
  - {name: network}
  - {name: runtime}
daemons:
  - {name: stated, broker: true, binary: /s, uid: 1990000010, gid: 1990000010, seccomp: stated}
  - {name: networkd, binary: /n, uid: 1990000011, gid: 1990000011, seccomp: networkd,
     writes: [network], reads: [config], defines: [net.talos.dev]}
  - {name: other, binary: /o, uid: 1990000012, gid: 1990000012, seccomp: o, writes: [runtime]}
"#;

/// networkd's uid in [`FUZZ_MANIFEST`].
pub const FUZZ_NETWORKD_UID: u32 = 1_990_000_011;
/// The other daemon's uid in [`FUZZ_MANIFEST`].
pub const FUZZ_OTHER_UID: u32 = 1_990_000_012;
/// A uid that is in no manifest.
pub const FUZZ_STRANGER_UID: u32 = 4242;

/// Requests one [`fuzz_requests`] input runs at most.
pub const FUZZ_MAX_REQUESTS: usize = 64;
/// Watches one input keeps open at most (the rest are closed at once).
const FUZZ_MAX_WATCHES: usize = 8;
/// Polls of a call before it counts as [`FuzzOutcome::Pending`].
const FUZZ_POLLS: usize = 16;

/// What one request of a [`fuzz_requests`] input came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuzzOutcome {
    /// The bytes are not a message of the selected call.
    Undecodable,
    /// The call succeeded (for List and Watch: the stream was opened).
    Ok,
    /// The call was refused with this code.
    Refused(tonic::Code),
    /// The call had not finished after a bounded number of polls (a TeardownAndDestroy that
    /// waits for finalizers): it is dropped, as a client going away drops it.
    Pending,
}

/// The fuzzing entry of stated's request handling: runs the requests encoded in `data` through
/// a real [`crate::server::StateService`] over a fresh in-memory [`Store`], as the peers that
/// `data` names, and returns what each came to. Whatever the bytes, nothing panics: a bad
/// request is an error. It is the code a socket client reaches, minus the HTTP/2 transport:
/// the same decoding (prost), access checks, validation, queries and watches.
///
/// Layout of `data` (what `fuzz/corpus/stated_requests` holds):
/// - byte 0: bit 0 set is node mode, with the access policy of [`FUZZ_MANIFEST`] (else
///   standalone: every namespace, admin only);
/// - then up to [`FUZZ_MAX_REQUESTS`] frames of `[op, len_lo, len_hi, message...]`: `op & 7`
///   is the call (0 Get, 1 List, 2 Create, 3 Update, 4 Destroy, 5 Watch, 6 Teardown, 7
///   TeardownAndDestroy) unless `op & 8` is set, which makes it a batch write
///   (`talosrs.state.Batch`), `(op >> 4) & 3` the peer (0 uid 0, 1 networkd, 2 the other daemon,
///   3 a stranger), then `len` bytes (little-endian, cut at the end of `data`) of the call's
///   protobuf request message.
///
/// Streams are read as far as they are ready; after every request the open watches are read,
/// so their filters see the writes that follow. A resource the service says it created or
/// updated must be in the store with valid names (else this panics: a fuzzer finding).
pub fn fuzz_requests(data: &[u8]) -> Vec<FuzzOutcome> {
    let Some((&setup, frames)) = data.split_first() else {
        return Vec::new();
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return Vec::new();
    };
    rt.block_on(fuzz_run(setup & 1 == 1, frames))
}

fn fuzz_manifest() -> &'static Manifest {
    static MANIFEST: std::sync::OnceLock<Manifest> = std::sync::OnceLock::new();
    MANIFEST.get_or_init(|| Manifest::parse_substituted(FUZZ_MANIFEST).expect("FUZZ_MANIFEST"))
}

async fn fuzz_run(node: bool, mut frames: &[u8]) -> Vec<FuzzOutcome> {
    use crate::server::{InProcessPeer, StateService};
    use futures::StreamExt;
    use prost::Message;
    use proto::state_server::State;

    let (policy, namespaces) = if node {
        let m = fuzz_manifest();
        let ns = m
            .namespaces
            .iter()
            .map(|n| (n.name.clone(), n.description.clone()))
            .collect();
        (crate::Policy::with_manifest(m.clone()), ns)
    } else {
        (crate::Policy::standalone(), Vec::new())
    };
    // Small limits, so that inputs reach them.
    let limits = crate::store::Limits {
        resources_per_namespace: 64,
        bytes_per_namespace: 1 << 20,
        types_per_namespace: 16,
        history_bytes: 256 << 10,
    };
    let store = Arc::new(
        Store::open(crate::store::StoreConfig {
            run_dir: None,
            state_dir: None,
            durable: Box::new(|_| false),
            namespaces,
            history: 16,
            limits,
        })
        .expect("an in-memory store opens"),
    );
    let service = StateService::new(
        store.clone(),
        Arc::new(policy),
        crate::server::PeerLimits::default(),
    );

    let mut outcomes = Vec::new();
    let mut watches = Vec::new();
    while outcomes.len() < FUZZ_MAX_REQUESTS {
        let [op, lo, hi, rest @ ..] = frames else {
            break;
        };
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        let (msg, tail) = rest.split_at(len);
        frames = tail;
        let uid = match (op >> 4) & 3 {
            0 => 0,
            1 => FUZZ_NETWORKD_UID,
            2 => FUZZ_OTHER_UID,
            _ => FUZZ_STRANGER_UID,
        };
        fn req<T>(uid: u32, msg: T) -> tonic::Request<T> {
            let mut r = tonic::Request::new(msg);
            r.extensions_mut().insert(InProcessPeer(uid));
            r
        }
        macro_rules! call {
            ($ty:ty, |$m:ident| $call:expr) => {
                call!($ty, |$m| $call, |_r| drop(_r))
            };
            ($ty:ty, |$m:ident| $call:expr, |$resp:ident| $on_ok:expr) => {
                match <$ty>::decode(msg) {
                    Err(_) => FuzzOutcome::Undecodable,
                    Ok($m) => match fuzz_bounded($call).await {
                        None => FuzzOutcome::Pending,
                        Some(Err(status)) => FuzzOutcome::Refused(status.code()),
                        Some(Ok($resp)) => {
                            $on_ok;
                            FuzzOutcome::Ok
                        }
                    },
                }
            };
        }
        let s = &service;
        let batch = crate::server::BatchService::new(service.clone());
        outcomes.push(match op & 7 {
            _ if op & 8 != 0 => {
                use proto::talosrs::state::batch_server::Batch;
                call!(
                    proto::talosrs::state::WriteRequest,
                    |m| batch.write(req(uid, m)),
                    |r| {
                        for result in r.into_inner().results {
                            if result.status.is_none() && !result.resource.is_empty() {
                                let written = proto::Resource::decode(result.resource)
                                    .expect("a batch result decodes");
                                fuzz_check_stored(&store, proto::ResourceResponse::new(written));
                            }
                        }
                    }
                )
            }
            0 => call!(proto::GetRequest, |m| s.get(req(uid, m))),
            1 => call!(proto::ListRequest, |m| s.list(req(uid, m)), |r| {
                let mut items = r.into_inner();
                while let Some(Some(_)) = futures::FutureExt::now_or_never(items.next()) {}
            }),
            2 => call!(proto::CreateRequest, |m| s.create(req(uid, m)), |r| {
                fuzz_check_stored(&store, r.into_inner())
            }),
            3 => call!(proto::UpdateRequest, |m| s.update(req(uid, m)), |r| {
                fuzz_check_stored(&store, r.into_inner())
            }),
            4 => call!(proto::DestroyRequest, |m| s.destroy(req(uid, m))),
            5 => call!(proto::WatchRequest, |m| s.watch(req(uid, m)), |r| watches
                .push(r.into_inner())),
            6 => call!(proto::TeardownRequest, |m| s.teardown(req(uid, m))),
            _ => call!(proto::TeardownAndDestroyRequest, |m| s
                .teardown_and_destroy(req(uid, m))),
        });
        // Let the other tasks run, then read what every open stream has ready.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        for w in &mut watches {
            while let Some(Some(_)) = futures::FutureExt::now_or_never(w.next()) {}
        }
        if watches.len() > FUZZ_MAX_WATCHES {
            watches.drain(..watches.len() - FUZZ_MAX_WATCHES);
        }
    }
    outcomes
}

/// Polls `f` at most [`FUZZ_POLLS`] times, letting other tasks run in between.
async fn fuzz_bounded<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    for _ in 0..FUZZ_POLLS {
        if let std::task::Poll::Ready(v) = futures::poll!(f.as_mut()) {
            return Some(v);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// What the service returned as written is in the store, under valid names.
fn fuzz_check_stored(store: &Store, written: proto::ResourceResponse) {
    // As a client decodes it (stated sends the resource encoded).
    let written = prost::Message::decode(prost::Message::encode_to_vec(&written).as_slice())
        .map(|r: proto::ResourceResponse| r.resource)
        .expect("the reply decodes");
    let md = written
        .and_then(|r| r.metadata)
        .expect("a write returns the resource it wrote");
    for (what, name) in [
        ("namespace", &md.namespace),
        ("type", &md.r#type),
        ("id", &md.id),
    ] {
        if let Err(e) = crate::access::check_name(what, name) {
            panic!("the service stored an invalid {what}: {e}");
        }
    }
    if let Err(e) = store.get(&md.namespace, &md.r#type, &md.id) {
        panic!("a written resource is not in the store: {e}");
    }
}
