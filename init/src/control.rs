//! The control socket (`/run/init/init.sock`): list, start, stop and restart daemons and
//! services, tail and follow their output and the kernel log, shut down or reboot the node, apply a machine
//! configuration ([`crate::apply`]). gRPC (`talos.init`).
//! Only uid 0 and the one daemon the manifest marks `initControl` (apid, which serves these
//! calls to its authorized clients) may call it, checked on every request from the kernel's peer
//! credentials (SO_PEERCRED), not from anything the caller says. The socket file is also
//! root's, 0600, or 0660 with that daemon's own gid as its group (its directory is 0755: it also
//! holds the manifest and seccomp profiles that daemons may read).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use proto::init::init_server::{Init, InitServer};
use proto::init::{
    ApplyRequest, ApplyResponse, AuditRequest, AuditResponse, DaemonAudit, DmesgRequest,
    ListRequest, ListResponse, LogLine, LogsRequest, PowerRequest, PowerResponse, Service,
    ServiceRequest, ServiceResponse,
};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::apply::Applier;
use crate::supervisor::{ControlError, Supervisor};
use crate::PowerAction;

/// The control API over a supervisor.
pub struct Control {
    supervisor: Arc<Supervisor>,
    power: mpsc::UnboundedSender<PowerAction>,
    /// The daemon admitted beside root (`initControl`): its name and uid.
    delegate: Option<(String, u32)>,
    /// The config writer (none without a broker to write to).
    applier: Option<Arc<Applier>>,
    /// Slots of the streams that stay open (a followed log, the kernel log): each holds a task
    /// and, for the kernel log, a file descriptor of init's, so their number is bounded.
    streams: Arc<tokio::sync::Semaphore>,
    /// Of those, the ones the delegate (apid, for every client on the network) may hold: the
    /// rest stays root's, so that a node's own administrator can always follow a log.
    delegate_streams: Arc<tokio::sync::Semaphore>,
}

/// Streams open at once ([`Control`]'s `streams`): followed logs and kernel logs together.
pub const MAX_OPEN_STREAMS: usize = 64;
/// Of [`MAX_OPEN_STREAMS`], what the delegate may hold (apid shares them among its clients).
pub const DELEGATE_STREAMS: usize = 48;

/// A stream's slot: one of all, and for the delegate one of its part.
pub struct StreamSlot {
    _all: tokio::sync::OwnedSemaphorePermit,
    _delegate: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Control {
    /// The API; power requests go to `power`; `delegate` (a daemon's name and uid) may call it
    /// beside root; configurations are applied by `applier`.
    pub fn new(
        supervisor: Arc<Supervisor>,
        power: mpsc::UnboundedSender<PowerAction>,
        delegate: Option<(String, u32)>,
        applier: Option<Arc<Applier>>,
    ) -> Self {
        Control {
            supervisor,
            power,
            delegate,
            applier,
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_OPEN_STREAMS)),
            delegate_streams: Arc::new(tokio::sync::Semaphore::new(DELEGATE_STREAMS)),
        }
    }

    /// Refuses every caller that is neither uid 0 nor the delegate's uid.
    fn admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let uid = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .map(|c| c.uid());
        match (uid, &self.delegate) {
            (Some(0), _) => Ok(()),
            (Some(uid), Some((_, d))) if uid == *d => Ok(()),
            (Some(uid), Some((name, _))) => Err(Status::permission_denied(format!(
                "uid {uid} may not use init's control socket (root and {name} only)"
            ))),
            (Some(uid), None) => Err(Status::permission_denied(format!(
                "uid {uid} may not use init's control socket (root only)"
            ))),
            (None, _) => Err(Status::permission_denied(
                "the peer's credentials are unknown",
            )),
        }
    }

    /// A slot for a stream that stays open, or RESOURCE_EXHAUSTED: the delegate takes one of
    /// its [`DELEGATE_STREAMS`] too.
    fn stream_slot<T>(&self, req: &Request<T>) -> Result<StreamSlot, Status> {
        let uid = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .map(|c| c.uid());
        let delegate = match (uid, &self.delegate) {
            (Some(0), _) | (None, _) | (_, None) => None,
            (Some(_), Some((name, _))) => Some(
                self.delegate_streams
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| {
                        Status::resource_exhausted(format!(
                            "{name} holds its {DELEGATE_STREAMS} followed logs and kernel logs \
                             on init's control socket: close some first"
                        ))
                    })?,
            ),
        };
        let all = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{MAX_OPEN_STREAMS} followed logs and kernel logs are open on init's control \
                 socket: close some first"
            ))
        })?;
        Ok(StreamSlot {
            _all: all,
            _delegate: delegate,
        })
    }
}

fn service(id: &str, s: &machinery::resources::runtime::ServiceStatusSpec) -> Service {
    Service {
        id: id.to_string(),
        kind: s.kind.as_str().to_string(),
        requested_by: s.requested_by.clone(),
        state: s.state.as_str().to_string(),
        pid: s.pid,
        restarts: s.restarts,
        last_exit: s.last_exit.clone(),
        ready: s.ready,
        healthy: s.healthy,
        message: s.message.clone(),
    }
}

fn status(e: ControlError) -> Status {
    match e {
        ControlError::NotFound(_) => Status::not_found(e.to_string()),
        ControlError::Refused(..) => Status::failed_precondition(e.to_string()),
        ControlError::Gone(_) => Status::unavailable(e.to_string()),
    }
}

type LogStream = Pin<Box<dyn Stream<Item = Result<LogLine, Status>> + Send>>;

#[tonic::async_trait]
impl Init for Control {
    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        self.admin(&req)?;
        let services = self
            .supervisor
            .units()
            .iter()
            .map(|u| service(&u.id, &u.snapshot()))
            .collect();
        Ok(Response::new(ListResponse { services }))
    }

    async fn start(
        &self,
        req: Request<ServiceRequest>,
    ) -> Result<Response<ServiceResponse>, Status> {
        self.admin(&req)?;
        let id = req.into_inner().id;
        let s = self.supervisor.start(&id).await.map_err(status)?;
        Ok(Response::new(ServiceResponse {
            service: Some(service(&id, &s)),
        }))
    }

    async fn stop(
        &self,
        req: Request<ServiceRequest>,
    ) -> Result<Response<ServiceResponse>, Status> {
        self.admin(&req)?;
        let id = req.into_inner().id;
        let s = self.supervisor.stop(&id).await.map_err(status)?;
        Ok(Response::new(ServiceResponse {
            service: Some(service(&id, &s)),
        }))
    }

    async fn restart(
        &self,
        req: Request<ServiceRequest>,
    ) -> Result<Response<ServiceResponse>, Status> {
        self.admin(&req)?;
        let id = req.into_inner().id;
        let s = self.supervisor.restart(&id).await.map_err(status)?;
        Ok(Response::new(ServiceResponse {
            service: Some(service(&id, &s)),
        }))
    }

    type LogsStream = LogStream;

    async fn logs(&self, req: Request<LogsRequest>) -> Result<Response<LogStream>, Status> {
        self.admin(&req)?;
        let slot = if req.get_ref().follow {
            Some(self.stream_slot(&req)?)
        } else {
            None
        };
        let r = req.into_inner();
        let unit = self
            .supervisor
            .get(&r.id)
            .ok_or_else(|| status(ControlError::NotFound(r.id.clone())))?;
        // Subscribe before taking the tail, then skip what the tail already had.
        let mut rx = unit.logs.subscribe();
        let tail = unit.logs.tail(usize::try_from(r.tail).ok());
        let mut last = tail.last().map(|l| l.seq);
        let (tx, out) = mpsc::channel::<Result<LogLine, Status>>(64);
        let follow = r.follow;
        tokio::spawn(async move {
            let _slot = slot;
            for l in tail {
                if tx
                    .send(Ok(LogLine {
                        line: l.text.to_vec(),
                        error: String::new(),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if !follow {
                return;
            }
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    line = rx.recv() => match line {
                        Ok(l) => {
                            if last.is_some_and(|s| l.seq <= s) {
                                continue;
                            }
                            last = Some(l.seq);
                            if tx.send(Ok(LogLine { line: l.text.to_vec(), error: String::new() })).await.is_err() {
                                return;
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            let note = format!("init: {n} lines dropped (reader too slow)");
                            if tx.send(Ok(LogLine { line: note.into_bytes(), error: String::new() })).await.is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    type DmesgStream = LogStream;

    /// The node's kernel log ([`crate::kmsg`]); a container-mode node has none of its own and
    /// says so (FailedPrecondition).
    async fn dmesg(&self, req: Request<DmesgRequest>) -> Result<Response<LogStream>, Status> {
        self.admin(&req)?;
        let slot = self.stream_slot(&req)?;
        let r = req.into_inner();
        let records = crate::kmsg::read(Path::new(crate::kmsg::KMSG), r.follow, r.tail).map_err(
            |e| match e {
                crate::kmsg::KmsgError::NotHere => Status::failed_precondition(e.to_string()),
                crate::kmsg::KmsgError::Io { .. } => Status::unavailable(e.to_string()),
            },
        )?;
        let lines = tokio_stream::wrappers::ReceiverStream::new(records).map(move |r| {
            let _slot = &slot;
            Ok(match r {
                Ok(line) => LogLine {
                    line: line.into_bytes(),
                    error: String::new(),
                },
                Err(error) => LogLine {
                    line: Vec::new(),
                    error,
                },
            })
        });
        Ok(Response::new(Box::pin(lines)))
    }

    /// The node's mounted filesystems ([`crate::mounts`]): the node's own mount namespace, as
    /// init sees it.
    async fn mounts(
        &self,
        req: Request<proto::init::MountsRequest>,
    ) -> Result<Response<proto::init::MountsResponse>, Status> {
        self.admin(&req)?;
        let stats =
            tokio::task::spawn_blocking(|| crate::mounts::stats(Path::new("/proc/self/mounts")))
                .await
                .map_err(|e| Status::internal(format!("reading the mounts ended: {e}")))?
                .map_err(|e| Status::unavailable(format!("cannot read /proc/self/mounts: {e}")))?;
        Ok(Response::new(proto::init::MountsResponse { stats }))
    }

    async fn shutdown(
        &self,
        req: Request<PowerRequest>,
    ) -> Result<Response<PowerResponse>, Status> {
        self.admin(&req)?;
        self.power
            .send(PowerAction::PowerOff)
            .map_err(|_| Status::unavailable("already shutting down"))?;
        Ok(Response::new(PowerResponse {}))
    }

    async fn audit(&self, req: Request<AuditRequest>) -> Result<Response<AuditResponse>, Status> {
        self.admin(&req)?;
        let daemons = self
            .supervisor
            .audit_now()
            .await
            .into_iter()
            .map(|(name, r)| match r {
                Ok(spec) => DaemonAudit {
                    name,
                    security_json: serde_json::to_string(&spec).unwrap_or_default(),
                    error: String::new(),
                },
                Err(error) => DaemonAudit {
                    name,
                    security_json: String::new(),
                    error,
                },
            })
            .collect();
        Ok(Response::new(AuditResponse { daemons }))
    }

    async fn apply_configuration(
        &self,
        req: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        self.admin(&req)?;
        let Some(applier) = &self.applier else {
            return Err(Status::unavailable(
                "this node has no broker to hold a machine configuration",
            ));
        };
        applier.apply(req.into_inner()).await.map(Response::new)
    }

    async fn reboot(&self, req: Request<PowerRequest>) -> Result<Response<PowerResponse>, Status> {
        self.admin(&req)?;
        self.power
            .send(PowerAction::Reboot)
            .map_err(|_| Status::unavailable("already shutting down"))?;
        Ok(Response::new(PowerResponse {}))
    }
}

/// Binds the control socket, replacing a stale one: root's and 0600, or with `group` as its
/// group and 0660 (the delegate daemon's gid).
pub fn bind(path: &Path, group: Option<u32>) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    // Mode first, then the group: until the chown the group is root's. Whoever the mode lets
    // connect, every request is still checked by uid (SO_PEERCRED).
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, Some(0), Some(gid))?;
    }
    Ok(listener)
}

/// Serves the control API on `listener` forever.
pub async fn serve(
    listener: UnixListener,
    control: Control,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(InitServer::new(control))
        .serve_with_incoming(UnixListenerStream::new(listener))
        .await
}
