//! The DHCPv6 operator: one task per link running the RFC 8415 client state machine (SOLICIT
//! → bound → RENEW at T1 → REBIND at T2 → expiry at the end of the valid lifetime), publishing
//! its current lease.
//!
//! As the DHCPv4 operator ([`crate::dhcp::operator`]), and unlike upstream (which solicits
//! again at half the valid lifetime and keeps addresses forever after a failure):
//! - a lease restored from stated (a restarted networkd, a link that came back) is renewed at
//!   once instead of starting over, so nothing in the kernel changes;
//! - an unanswered RENEW falls back to REBIND at T2, and the lease is dropped at expiry;
//! - the previous address is hinted in SOLICIT, and repeated failures are logged once, then at
//!   debug level until the next success.
//!
//! Before its first message the operator waits (up to 30 s, as upstream) for the link's
//! link-local address to pass duplicate address detection: it is the source of every message.

use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::client::{link_local_ready, Client, Error};
use super::lease::Lease;
use super::packet::Identity;

/// Shortest wait between two attempts (upstream's floor).
pub const MIN_RETRY: Duration = Duration::from_secs(5);
/// Longest wait between two SOLICIT rounds.
pub const MAX_RETRY: Duration = Duration::from_secs(60);
/// How long to wait for a usable link-local address (upstream: 30 s).
pub const LINK_LOCAL_WAIT: Duration = Duration::from_secs(30);

/// What the operator publishes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The current lease, if bound.
    pub lease: Option<Lease>,
}

/// A running operator; dropping it stops the task without RELEASE.
#[derive(Debug)]
pub struct Operator {
    link: String,
    identity: Identity,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Operator {
    /// Starts the operator on `link`, from `restored` (a lease kept in stated, used only if it
    /// was granted to this identity and is still valid); `notify` is called after every change
    /// of the published [`State`].
    pub fn spawn(
        link: &str,
        identity: Identity,
        restored: Option<Lease>,
        notify: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let now = SystemTime::now();
        let restored = restored.filter(|l| !l.expired(now) && l.belongs_to(link, &identity));
        let state = Arc::new(Mutex::new(State {
            lease: restored.clone(),
        }));
        let task = tokio::spawn(run(
            link.to_string(),
            identity.clone(),
            restored,
            state.clone(),
            notify,
        ));
        Self {
            link: link.to_string(),
            identity,
            state,
            task,
        }
    }

    /// The published state.
    pub fn state(&self) -> State {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The identity it was started with (a changed one restarts it).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Stops the operator; with `release`, sends RELEASE for the current lease first (and
    /// waits briefly for the server's REPLY).
    pub async fn stop(self, release: bool) {
        self.task.abort();
        let lease = self.state().lease;
        let (true, Some(lease)) = (release, lease) else {
            return;
        };
        let result = match Client::open(&self.link, self.identity.clone()) {
            Ok(c) => c.release(&lease).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(acknowledged) => {
                tracing::info!(link = %self.link, address = %lease.address, acknowledged,
                    "DHCPv6 lease released");
            }
            Err(e) => {
                tracing::warn!(link = %self.link, error = %cosi::error::Chain(&e),
                    "DHCPv6 release failed");
            }
        }
    }
}

/// Logs a failure at warn the first time, at debug while it repeats.
struct FailureLog {
    failing: bool,
}

impl FailureLog {
    fn failed(&mut self, link: &str, what: &str, e: &Error) {
        if self.failing {
            tracing::debug!(link, error = %cosi::error::Chain(e), "{what} failed again");
        } else {
            tracing::warn!(link, error = %cosi::error::Chain(e), "{what} failed");
            self.failing = true;
        }
    }

    fn ok(&mut self) {
        self.failing = false;
    }
}

fn publish(state: &Mutex<State>, lease: Option<Lease>, notify: &impl Fn()) {
    let changed = match state.lock() {
        Ok(mut s) => {
            let changed = s.lease != lease;
            s.lease = lease;
            changed
        }
        Err(_) => false,
    };
    if changed {
        notify();
    }
}

/// Waits until the link-local address of `link` is usable, at most [`LINK_LOCAL_WAIT`].
async fn wait_link_local(link: &str) {
    let deadline = tokio::time::Instant::now() + LINK_LOCAL_WAIT;
    let nl = match crate::netlink::Netlink::connect() {
        Ok(nl) => nl,
        Err(e) => {
            tracing::warn!(link, error = %cosi::error::Chain(&e),
                "cannot watch for the IPv6 link-local address, trying DHCPv6 anyway");
            return;
        }
    };
    while !link_local_ready(&nl, link).await {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                link,
                "no usable IPv6 link-local address yet, trying DHCPv6 anyway"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(
    link: String,
    identity: Identity,
    restored: Option<Lease>,
    state: Arc<Mutex<State>>,
    notify: impl Fn() + Send + Sync + 'static,
) {
    wait_link_local(&link).await;
    let mut lease = restored;
    // A restored lease is confirmed at once (RENEW, or REBIND past T2).
    let mut confirm = lease.is_some();
    let mut previous: Option<Ipv6Addr> = lease.as_ref().map(|l| l.address);
    let mut retry = MIN_RETRY;
    let mut log = FailureLog { failing: false };
    loop {
        let client = match Client::open(&link, identity.clone()) {
            Ok(c) => c,
            Err(e) => {
                log.failed(&link, "DHCPv6 socket", &e);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        };
        let Some(current) = lease.clone() else {
            match client.acquire(previous).await {
                Ok(new) => {
                    tracing::info!(link = %link, address = %new.address,
                        server = %new.server_id, valid = new.valid_lifetime,
                        t1 = new.renewal, t2 = new.rebinding, "DHCPv6 lease acquired");
                    log.ok();
                    retry = MIN_RETRY;
                    previous = Some(new.address);
                    lease = Some(new.clone());
                    publish(&state, Some(new), &notify);
                }
                Err(e) => {
                    if e.lease_lost() {
                        previous = None;
                    }
                    log.failed(&link, "DHCPv6 solicitation", &e);
                    drop(client);
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
            continue;
        };
        let now = SystemTime::now();
        if current.expired(now) {
            tracing::warn!(link = %link, address = %current.address, "DHCPv6 lease expired");
            lease = None;
            publish(&state, None, &notify);
            continue;
        }
        let to_t1 = current.until_renewal(now);
        if !confirm && !to_t1.is_zero() {
            // Bound: sleep until T1, with the socket closed meanwhile.
            drop(client);
            tokio::time::sleep(to_t1).await;
            continue;
        }
        let to_t2 = current.until_rebinding(now);
        let rebind = to_t2.is_zero();
        // RENEW until T2, REBIND until the valid lifetime ends (RFC 8415 §18.2.4, §18.2.5).
        let within = if rebind {
            current.until_expiry(now)
        } else {
            to_t2
        };
        confirm = false;
        match client.extend(&current, rebind, within).await {
            Ok(new) => {
                let what = if rebind { "rebound" } else { "renewed" };
                tracing::info!(link = %link, address = %new.address, valid = new.valid_lifetime,
                    "DHCPv6 lease {what}");
                log.ok();
                previous = Some(new.address);
                lease = Some(new.clone());
                publish(&state, Some(new), &notify);
            }
            Err(e) if e.lease_lost() => {
                tracing::warn!(link = %link, address = %current.address, error = %e,
                    "DHCPv6 lease refused, soliciting again");
                lease = None;
                publish(&state, None, &notify);
            }
            Err(e) => {
                // Keep the lease; go on in this state or move to the next one.
                let what = if rebind {
                    "DHCPv6 rebind"
                } else {
                    "DHCPv6 renewal"
                };
                log.failed(&link, what, &e);
                if !matches!(e, Error::Timeout { .. }) {
                    tokio::time::sleep(MIN_RETRY).await;
                }
            }
        }
    }
}
