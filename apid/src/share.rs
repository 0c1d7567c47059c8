//! Fair shares of what apid holds for its clients: open watches (they count against apid's own
//! limit at stated), etcd operations (k8sd runs them one after another), followed logs (each
//! holds one of init's streams). One client (a client certificate; without one, an address)
//! holds at most its share, a client without a certificate a smaller one, and a part of each
//! resource is kept for the admins (os:admin, os:operator), so that a reader, or an anonymous
//! caller of the maintenance API, can never keep an admin out.
//!
//! A stream that its client stops reading releases what it holds after [`STALL`]
//! ([`stall_bounded`]): a client cannot keep a share by not reading.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tonic::Status;

use crate::auth::Caller;

/// How long a stream's next message may wait for its client to read it.
pub const STALL: Duration = Duration::from_secs(60);

/// The bounds of one resource.
#[derive(Clone, Copy, Debug)]
pub struct ShareLimits {
    /// Held at once, by everyone.
    pub total: usize,
    /// Held by one client with a certificate.
    pub per_client: usize,
    /// Held by one client without a certificate (its address).
    pub per_anonymous: usize,
    /// Of `total`, kept for admins: the others together hold at most `total - this`.
    pub admin_reserve: usize,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    not_admin: usize,
    per_client: HashMap<String, usize>,
}

/// The shares of one resource.
#[derive(Debug)]
pub struct Shares {
    what: &'static str,
    limits: ShareLimits,
    held: Mutex<Held>,
}

/// One unit of a resource, held by one client until dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    client: String,
    admin: bool,
}

impl Shares {
    /// The shares of `what` (named in refusals: "open watches").
    pub fn new(what: &'static str, limits: ShareLimits) -> Arc<Self> {
        Arc::new(Self {
            what,
            limits,
            held: Mutex::default(),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One unit for `caller`.
    ///
    /// # Errors
    ///
    /// `ResourceExhausted`, saying which bound was reached.
    pub fn take(self: &Arc<Self>, caller: &Caller) -> Result<Share, Status> {
        let l = &self.limits;
        let mut h = self.held();
        let mine = h.per_client.get(&caller.key).copied().unwrap_or(0);
        let own = if caller.anonymous {
            l.per_anonymous
        } else {
            l.per_client
        };
        let what = self.what;
        if mine >= own {
            return Err(Status::resource_exhausted(format!(
                "this client ({}) holds {mine} {what}, its share: close some first",
                caller.key
            )));
        }
        if h.total >= l.total {
            return Err(Status::resource_exhausted(format!(
                "the node's {what} are all in use ({}): try again later",
                l.total
            )));
        }
        if !caller.admin && h.not_admin >= l.total.saturating_sub(l.admin_reserve) {
            return Err(Status::resource_exhausted(format!(
                "the node's {what} for clients that are not admins are all in use ({}; {} are \
                 kept for admins): try again later",
                l.total.saturating_sub(l.admin_reserve),
                l.admin_reserve
            )));
        }
        h.total += 1;
        if !caller.admin {
            h.not_admin += 1;
        }
        *h.per_client.entry(caller.key.clone()).or_insert(0) += 1;
        Ok(Share {
            shares: self.clone(),
            client: caller.key.clone(),
            admin: caller.admin,
        })
    }

    /// Units held now, in all (tests, logs).
    pub fn in_use(&self) -> usize {
        self.held().total
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut h = self.shares.held();
        h.total = h.total.saturating_sub(1);
        if !self.admin {
            h.not_admin = h.not_admin.saturating_sub(1);
        }
        if let Some(n) = h.per_client.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.per_client.remove(&self.client);
            }
        }
    }
}

/// Every resource apid shares among its clients.
#[derive(Clone, Debug)]
pub struct Pool {
    /// COSI watches (each is one of apid's watches at stated, whose limit is 1024 per daemon:
    /// 768 for clients leaves apid's own controllers theirs).
    pub watches: Arc<Shares>,
    /// etcd operations (k8sd answers them one after another).
    pub etcd: Arc<Shares>,
    /// Followed logs and kernel logs (each holds one of init's streams; init keeps a part of
    /// them for root).
    pub follows: Arc<Shares>,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            watches: Shares::new(
                "open watches",
                ShareLimits {
                    total: 768,
                    per_client: 64,
                    per_anonymous: 8,
                    admin_reserve: 256,
                },
            ),
            etcd: Shares::new(
                "etcd operations in progress",
                ShareLimits {
                    total: 4,
                    per_client: 1,
                    // In maintenance every etcd call is refused (FailedPrecondition): one lets
                    // the caller learn why.
                    per_anonymous: 1,
                    admin_reserve: 1,
                },
            ),
            follows: Shares::new(
                "followed logs",
                ShareLimits {
                    total: crate::share::FOLLOWS,
                    per_client: 8,
                    per_anonymous: 2,
                    admin_reserve: 16,
                },
            ),
        }
    }
}

/// Followed logs apid holds at most: init lets its delegate hold 48 of its 64 streams (the
/// rest is root's, on the node).
pub const FOLLOWS: usize = 48;

type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// `stream`, relayed by a task of its own that holds `hold` (a [`Share`], say) while it runs:
/// when the client has not taken a message for [`STALL`] while the next one waits, the relay
/// stops, dropping `stream` and `hold` (what the stream held upstream, a watch at stated, is
/// released), and the client's stream ends with `DeadlineExceeded` once it reads again.
pub fn stall_bounded<T, H>(stream: Streamed<T>, hold: H, stall: Duration) -> Streamed<T>
where
    T: Send + 'static,
    H: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<T, Status>>(8);
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stalled.clone();
    tokio::spawn(async move {
        let _hold = hold;
        let mut stream = stream;
        while let Some(item) = tokio::select! {
            item = stream.next() => item,
            () = tx.closed() => None,
        } {
            match tx.send_timeout(item, stall).await {
                Ok(()) => {}
                Err(tokio::sync::mpsc::error::SendTimeoutError::Timeout(_)) => {
                    flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(
                        "a client did not read its stream for {} s: ended",
                        stall.as_secs()
                    );
                    return;
                }
                Err(tokio::sync::mpsc::error::SendTimeoutError::Closed(_)) => return,
            }
        }
    });
    let received = tokio_stream::wrappers::ReceiverStream::new(rx);
    let end = futures::stream::once(async move {
        stalled.load(std::sync::atomic::Ordering::Relaxed).then(|| {
            Status::deadline_exceeded(format!(
                "the client did not read this stream for {} s: ended",
                stall.as_secs()
            ))
        })
    })
    .filter_map(|s| async move { s.map(Err) });
    Box::pin(received.chain(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(key: &str, admin: bool, anonymous: bool) -> Caller {
        Caller {
            key: key.to_string(),
            admin,
            anonymous,
        }
    }

    #[test]
    fn a_client_holds_its_share_and_the_admins_reserve_stays_theirs() {
        let s = Shares::new(
            "things",
            ShareLimits {
                total: 6,
                per_client: 2,
                per_anonymous: 1,
                admin_reserve: 2,
            },
        );
        let r1 = caller("r1", false, false);
        let held: Vec<_> = (0..2).map(|_| s.take(&r1).unwrap()).collect();
        let e = s.take(&r1).unwrap_err();
        assert!(e.message().contains("its share"), "{}", e.message());
        let anon = caller("address 10.0.0.9", false, true);
        let a = s.take(&anon).unwrap();
        assert!(s.take(&anon).is_err());
        let r2 = caller("r2", false, false);
        let b = s.take(&r2).unwrap();
        // 4 held by non-admins: the rest is the admins'.
        let e = s.take(&r2).unwrap_err();
        assert!(e.message().contains("kept for admins"), "{}", e.message());
        let admin = caller("admin", true, false);
        let x = s.take(&admin).unwrap();
        let y = s.take(&admin).unwrap();
        let e = s.take(&caller("admin2", true, false)).unwrap_err();
        assert!(e.message().contains("all in use"), "{}", e.message());
        assert_eq!(s.in_use(), 6);
        drop((held, a, b, x, y));
        assert_eq!(s.in_use(), 0);
        s.take(&r1).unwrap();
    }

    #[tokio::test]
    async fn a_stream_nobody_reads_releases_what_it_holds() {
        let s = Shares::new(
            "things",
            ShareLimits {
                total: 1,
                per_client: 1,
                per_anonymous: 1,
                admin_reserve: 0,
            },
        );
        let c = caller("c", false, false);
        let share = s.take(&c).unwrap();
        let endless: Streamed<u64> = Box::pin(futures::stream::iter(0..).map(Ok));
        let mut out = stall_bounded(endless, share, Duration::from_millis(200));
        assert_eq!(out.next().await.unwrap().unwrap(), 0);
        // Not read: the relay gives up, and the share comes back.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while s.in_use() != 0 {
            assert!(std::time::Instant::now() < end, "the share was kept");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // What was relayed is read, then the stream ends with the reason.
        let mut last = None;
        while let Some(item) = out.next().await {
            last = Some(item);
        }
        let e = last.unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    }
}
