//! The DHCPv4 operator: one task per link running the RFC 2131 state machine (INIT → BOUND →
//! RENEWING at T1, unicast → REBINDING at T2, broadcast → expiry), publishing its current lease.
//!
//! Differences from upstream (networking.md §3.8, §6.6), on purpose:
//! - a lease restored from stated (a restarted networkd, a link that came back) is renewed at
//!   once instead of starting over, so nothing in the kernel changes;
//! - an unanswered renewal falls back to a broadcast REBIND at T2, and the lease is dropped at
//!   expiry (upstream keeps addresses forever after a failure);
//! - the previous address is requested in DISCOVER (option 50), and repeated failures are logged
//!   once, then at debug level until the next success.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::client::{Client, Error};
use super::lease::Lease;
use super::packet::Identity;

/// Shortest wait between two attempts (upstream's floor).
pub const MIN_RETRY: Duration = Duration::from_secs(5);
/// Longest wait between two DISCOVER rounds.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

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
    /// Starts the operator on `link`, from `restored` (a lease kept in stated) if any; `notify`
    /// is called after every change of the published [`State`].
    pub fn spawn(
        link: &str,
        identity: Identity,
        restored: Option<Lease>,
        notify: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let now = SystemTime::now();
        let restored = restored.filter(|l| !l.expired(now) && l.link_name == link);
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

    /// Whether the operator was started with this identity (a changed spec restarts it).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Stops the operator; with `release`, sends DHCPRELEASE for the current lease first.
    pub async fn stop(self, release: bool) {
        self.task.abort();
        let lease = self.state().lease;
        if let (true, Some(lease)) = (release, lease) {
            match Client::open(&self.link, self.identity.clone()) {
                Ok(c) => match c.release(&lease).await {
                    Ok(()) => {
                        tracing::info!(link = %self.link, address = %lease.address, "DHCP lease released")
                    }
                    Err(e) => {
                        tracing::warn!(link = %self.link, error = %cosi::error::Chain(&e), "DHCP release failed")
                    }
                },
                Err(e) => {
                    tracing::warn!(link = %self.link, error = %cosi::error::Chain(&e), "DHCP release failed")
                }
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

async fn run(
    link: String,
    identity: Identity,
    restored: Option<Lease>,
    state: Arc<Mutex<State>>,
    notify: impl Fn() + Send + Sync + 'static,
) {
    let mut lease = restored;
    // A restored lease is confirmed at once (RENEWING, or REBINDING past T2).
    let mut confirm = lease.is_some();
    let mut previous: Option<Ipv4Addr> = lease.as_ref().map(|l| l.address);
    let mut retry = MIN_RETRY;
    let mut log = FailureLog { failing: false };
    loop {
        let client = match Client::open(&link, identity.clone()) {
            Ok(c) => c,
            Err(e) => {
                log.failed(&link, "DHCP socket", &e);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        };
        let Some(current) = lease.clone() else {
            match client.acquire(previous).await {
                Ok(new) => {
                    tracing::info!(link = %link, address = %new.address, prefix = new.prefix_len,
                        server = %new.server, lease_time = new.lease_time, "DHCP lease acquired");
                    log.ok();
                    retry = MIN_RETRY;
                    previous = Some(new.address);
                    lease = Some(new.clone());
                    publish(&state, Some(new), &notify);
                }
                Err(e) => {
                    if matches!(e, Error::Nak { .. }) {
                        previous = None;
                    }
                    log.failed(&link, "DHCP discovery", &e);
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
            continue;
        };
        let now = SystemTime::now();
        if current.expired(now) {
            tracing::warn!(link = %link, address = %current.address, "DHCP lease expired");
            lease = None;
            publish(&state, None, &notify);
            continue;
        }
        let to_t1 = current.until_renewal(now);
        if !confirm && !to_t1.is_zero() {
            // BOUND: sleep until T1, with the socket closed meanwhile.
            drop(client);
            tokio::time::sleep(to_t1).await;
            continue;
        }
        let to_t2 = current.until_rebinding(now);
        let rebind = to_t2.is_zero();
        // Wait for the answer half the time left in this state, at least MIN_RETRY (RFC 2131
        // §4.4.5 says 60 s; upstream 5 s), never past the state's end.
        let left = if rebind {
            current.until_expiry(now)
        } else {
            to_t2
        };
        let wait = (left / 2)
            .max(MIN_RETRY)
            .min(left.max(Duration::from_secs(1)));
        match client.extend(&current, rebind, wait).await {
            Ok(new) => {
                let what = if rebind { "rebound" } else { "renewed" };
                tracing::info!(link = %link, address = %new.address, lease_time = new.lease_time,
                    "DHCP lease {what}");
                log.ok();
                confirm = false;
                previous = Some(new.address);
                lease = Some(new.clone());
                publish(&state, Some(new), &notify);
            }
            Err(Error::Nak { .. }) => {
                tracing::warn!(link = %link, address = %current.address, "DHCP lease refused (NAK)");
                confirm = false;
                previous = None;
                lease = None;
                publish(&state, None, &notify);
            }
            Err(e) => {
                // Keep the lease; retry in this state or move on to the next one.
                confirm = false;
                let what = if rebind {
                    "DHCP rebind"
                } else {
                    "DHCP renewal"
                };
                log.failed(&link, what, &e);
                if matches!(e, Error::Socket { .. } | Error::Send { .. }) {
                    tokio::time::sleep(MIN_RETRY).await;
                }
            }
        }
    }
}
