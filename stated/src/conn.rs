//! Accepting connections within limits: each peer (uid, from the kernel's SO_PEERCRED) may hold
//! a bounded number of connections, and a connection that sends nothing after it was accepted
//! (a half-open client that never speaks HTTP/2) is closed after a while. Without this, idle and
//! half-open connections were all kept, for as long as their peers liked.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::{Connected, UdsConnectInfo};

use crate::access::{Peer, Policy};
use crate::server::PeerLimits;

/// Who a connection's peer counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Class {
    Admin,
    Daemon(u32),
    Stranger(u32),
}

#[derive(Default)]
struct Counts {
    per_uid: HashMap<Class, usize>,
    strangers: usize,
    refused: u64,
}

/// The connection counts of one server.
pub struct Gate {
    policy: Arc<Policy>,
    limits: PeerLimits,
    counts: Arc<Mutex<Counts>>,
}

/// A connection accepted within its peer's limit; its slot is given back when it closes.
pub struct Conn {
    inner: UnixStream,
    _slot: Slot,
    /// Until the first byte arrives: the deadline for it.
    first_bytes: Option<Pin<Box<tokio::time::Sleep>>>,
}

struct Slot {
    counts: Arc<Mutex<Counts>>,
    class: Class,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.per_uid.get_mut(&self.class) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_uid.remove(&self.class);
            }
        }
        if matches!(self.class, Class::Stranger(_)) {
            c.strangers = c.strangers.saturating_sub(1);
        }
    }
}

impl Gate {
    /// A gate for peers identified by `policy`.
    pub fn new(policy: Arc<Policy>, limits: PeerLimits) -> Self {
        Self {
            policy,
            limits,
            counts: Arc::default(),
        }
    }

    /// Admits `stream` if its peer is under its limits.
    fn admit(&self, stream: UnixStream) -> Option<Conn> {
        let uid = stream.peer_cred().ok().map(|c| c.uid());
        let class = match self.policy.identify(uid) {
            Peer::Admin => Class::Admin,
            Peer::Daemon { .. } => Class::Daemon(uid.unwrap_or(u32::MAX)),
            Peer::Stranger(u) => Class::Stranger(u),
        };
        let l = &self.limits;
        let max = match class {
            Class::Admin => l.connections_admin,
            Class::Daemon(_) => l.connections_per_daemon,
            Class::Stranger(_) => l.connections_per_stranger,
        };
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.per_uid.get(&class).copied().unwrap_or(0);
        let strangers_full =
            matches!(class, Class::Stranger(_)) && c.strangers >= l.connections_strangers;
        if n >= max || strangers_full {
            c.refused += 1;
            // Once, then every 1000th: a flood of refusals must not flood the log.
            if c.refused % 1000 == 1 {
                tracing::warn!(
                    ?class,
                    open = n,
                    refused = c.refused,
                    "connection refused: the peer holds its limit of connections"
                );
            }
            return None;
        }
        *c.per_uid.entry(class).or_insert(0) += 1;
        if matches!(class, Class::Stranger(_)) {
            c.strangers += 1;
        }
        drop(c);
        Some(Conn {
            inner: stream,
            _slot: Slot {
                counts: self.counts.clone(),
                class,
            },
            first_bytes: Some(Box::pin(tokio::time::sleep(l.first_bytes_within))),
        })
    }

    /// Open connections of uid `uid` (tests).
    pub fn open(&self, uid: u32) -> usize {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.per_uid
            .iter()
            .filter(|(k, _)| match k {
                Class::Admin => uid == 0,
                Class::Daemon(u) | Class::Stranger(u) => *u == uid,
            })
            .map(|(_, n)| *n)
            .sum()
    }

    /// The connections of `listener` that are within their limits, forever.
    pub fn incoming(
        self: Arc<Self>,
        listener: UnixListener,
    ) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
        futures::stream::unfold((self, listener), |(gate, listener)| async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        if let Some(conn) = gate.admit(stream) {
                            return Some((Ok(conn), (gate, listener)));
                        }
                    }
                    // Out of fds, or a connection reset before accept: keep serving the
                    // others (a short pause so that EMFILE does not spin).
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        })
    }
}

impl Connected for Conn {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> UdsConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Some(deadline) = this.first_bytes.as_mut() {
            if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
                this.first_bytes = None;
            } else if r.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer sent nothing after connecting",
                )));
            }
        }
        r
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
