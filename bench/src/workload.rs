//! What both brokers are measured with: the shared state of one throughput run (update counter,
//! acknowledgement times, stop flag) and the spec format that carries an update's identity.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::time::{Interval, MissedTickBehavior};

use crate::hist::Hist;

/// Most updates one run can record (acknowledgement times are kept per update).
pub const MAX_UPDATES: usize = 4_000_000;

/// Shared state of one throughput run.
pub struct RunCtx {
    base: Instant,
    /// Index of the next update (allocated before it is sent).
    pub next: AtomicU64,
    /// Updates acknowledged so far.
    pub acked: AtomicU64,
    /// Acknowledgement time (ns since `base`, +1) of each update; 0 while not acknowledged.
    acks: Vec<AtomicU64>,
    /// Set when writers must stop.
    pub stop: AtomicBool,
    /// Updates with an index from this one on are measured (after the warm-up).
    pub measure_from: AtomicU64,
    /// Total updates the watchers must see; `u64::MAX` while writers still run.
    pub expected: AtomicU64,
    /// Size of each spec in bytes.
    pub spec_size: usize,
    /// Interval between the updates of one writer; `None`: as fast as acknowledged.
    pub pace: Option<Duration>,
}

impl RunCtx {
    /// A new run.
    pub fn new(spec_size: usize, pace: Option<Duration>) -> Self {
        Self {
            base: Instant::now(),
            next: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            acks: (0..MAX_UPDATES).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            measure_from: AtomicU64::new(u64::MAX),
            expected: AtomicU64::new(u64::MAX),
            spec_size,
            pace,
        }
    }

    /// What paces a writer of this run.
    pub fn pacer(&self) -> Pacer {
        Pacer(self.pace.map(|p| {
            let mut i = tokio::time::interval(p);
            i.set_missed_tick_behavior(MissedTickBehavior::Skip);
            i
        }))
    }

    /// Nanoseconds since the run started (monotonic clock, the same for writers and watchers).
    pub fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Allocates the next update, or `None` when the run is over.
    pub fn begin(&self) -> Option<u64> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let u = self.next.fetch_add(1, Ordering::Relaxed);
        if u as usize >= MAX_UPDATES {
            self.stop.store(true, Ordering::Relaxed);
            return None;
        }
        Some(u)
    }

    /// Records that update `u` was acknowledged now.
    pub fn ack(&self, u: u64) {
        let t = self.now() + 1;
        if let Some(a) = self.acks.get(u as usize) {
            a.store(t, Ordering::Release);
        }
        self.acked.fetch_add(1, Ordering::Relaxed);
    }

    fn ack_time(&self, u: u64) -> Option<u64> {
        match self.acks.get(u as usize).map(|a| a.load(Ordering::Acquire)) {
            Some(0) | None => None,
            Some(t) => Some(t - 1),
        }
    }
}

/// Paces a writer at a fixed rate (open loop), or not at all.
pub struct Pacer(Option<Interval>);

impl Pacer {
    /// Waits for the next slot.
    pub async fn wait(&mut self) {
        if let Some(i) = self.0.as_mut() {
            i.tick().await;
        }
    }
}

/// A spec of `size` bytes (at least 18) carrying update `u` and its send time: a CBOR byte string,
/// so it is also a valid self-describing talos-rs spec.
pub fn make_spec(u: u64, sent: u64, size: usize) -> Vec<u8> {
    let size = size.clamp(18, usize::from(u16::MAX) + 3);
    let mut v = Vec::with_capacity(size);
    if let Ok(len) = u8::try_from(size - 2) {
        v.extend_from_slice(&[0x58, len]);
    } else {
        v.push(0x59);
        v.extend_from_slice(&u16::try_from(size - 3).unwrap_or(u16::MAX).to_be_bytes());
    }
    v.extend_from_slice(&u.to_le_bytes());
    v.extend_from_slice(&sent.to_le_bytes());
    v.resize(size, b'x');
    v
}

/// Update index and send time from a spec made by [`make_spec`].
pub fn parse_spec(spec: &[u8]) -> Option<(u64, u64)> {
    let body = match spec.first()? {
        0x58 => spec.get(2..)?,
        0x59 => spec.get(3..)?,
        _ => return None,
    };
    let u = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
    let sent = u64::from_le_bytes(body.get(8..16)?.try_into().ok()?);
    Some((u, sent))
}

/// What one watcher saw.
#[derive(Default)]
pub struct WatchStats {
    /// Update events received (all, including the warm-up).
    pub events: u64,
    /// Events that did not carry a bench spec.
    pub foreign: u64,
    /// Latency from the update's acknowledgement to the event's arrival (measured updates only;
    /// an event that arrived before the writer saw the acknowledgement counts as 0).
    pub ack_to_event: Hist,
    /// Measured events that arrived before the writer saw the acknowledgement.
    pub before_ack: u64,
    /// Latency from sending the update to the event's arrival (measured updates only).
    pub send_to_event: Hist,
}

impl WatchStats {
    /// Records an event carrying `spec` that arrived at `recv`.
    pub fn record(&mut self, ctx: &RunCtx, spec: &[u8], recv: u64) {
        self.events += 1;
        let Some((u, sent)) = parse_spec(spec) else {
            self.foreign += 1;
            return;
        };
        if u < ctx.measure_from.load(Ordering::Relaxed) {
            return;
        }
        self.send_to_event.record(recv.saturating_sub(sent));
        match ctx.ack_time(u) {
            Some(ack) if ack <= recv => self.ack_to_event.record(recv - ack),
            _ => {
                self.before_ack += 1;
                self.ack_to_event.record(0);
            }
        }
    }

    /// Whether the watcher has seen every update of the run.
    pub fn done(&self, ctx: &RunCtx) -> bool {
        self.events >= ctx.expected.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip() {
        for size in [18, 200, 300, 1000] {
            let s = make_spec(42, 7, size);
            assert_eq!(s.len(), size);
            assert_eq!(parse_spec(&s), Some((42, 7)));
        }
        let s = make_spec(1, 2, 200);
        assert_eq!(&s[..2], &[0x58, 198]);
    }
}
