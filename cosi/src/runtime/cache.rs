//! The runtime's memory of a cached output kind ([`Output::cached`](super::Output::cached)):
//! every resource of the kind in its declared namespace, kept current by the kind's watch and by
//! the owner's own writes, so that a cycle's view of its outputs costs no List of thousands of
//! resources from stated.
//!
//! A belief may be stale for a moment (an event in flight). Every write is still a
//! compare-and-swap on the believed version, so a stale belief costs a retry from a live read,
//! never a lost write. The one belief a write does not check is "the output exists as desired"
//! (nothing is written then): the cache errs towards forgetting, and a destroy it did not
//! expect wakes the owner, which writes the output again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use crate::client::{Event, EventKind};
use crate::resource::{Phase, RawResource};

/// Destroyed incarnations remembered at most (until their watch event arrives); past that the
/// memory is dropped, which can only let a late event revive a belief the next write corrects.
const MAX_GONE: usize = 65_536;

/// One cached kind. Cheap to share (`Arc`); every method takes the lock briefly.
#[derive(Debug, Default)]
pub(crate) struct KindCache {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The watch delivered the kind's whole contents: the map can stand for a List.
    ready: bool,
    resources: HashMap<String, RawResource>,
    /// Incarnations (creation times) the owner destroyed and whose `Destroyed` event has not
    /// arrived yet: older events of theirs still in flight must not bring them back.
    gone: HashMap<String, Option<SystemTime>>,
}

impl KindCache {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets everything: the watch is opened again and will deliver the contents anew.
    pub(crate) fn reset(&self) {
        let mut s = self.lock();
        s.ready = false;
        s.resources.clear();
        s.gone.clear();
    }

    /// Applies a watch event. Returns whether it removed a resource the cache still held: a
    /// destroy the owner did not make itself (an administrator's, or one lost when stated
    /// restarted without it), which the owner must be woken for.
    pub(crate) fn observe(&self, e: &Event) -> bool {
        let mut s = self.lock();
        let md = &e.resource.metadata;
        match e.kind {
            EventKind::Bootstrapped => {
                s.ready = true;
                false
            }
            EventKind::Noop => false,
            EventKind::Created | EventKind::Updated => {
                s.merge(&e.resource);
                false
            }
            EventKind::Destroyed => {
                if s.gone.get(&md.id).is_some_and(|c| *c == md.created) {
                    s.gone.remove(&md.id);
                }
                // Removed unless the cache holds a later incarnation. A relist's synthesized
                // destroy carries no creation time and always removes: forgetting is safe.
                let later = s
                    .resources
                    .get(&md.id)
                    .is_some_and(|cur| md.created.is_some() && cur.metadata.created > md.created);
                !later && s.resources.remove(&md.id).is_some()
            }
        }
    }

    /// Records what a write of the owner stored.
    pub(crate) fn record(&self, stored: &RawResource) {
        let mut s = self.lock();
        s.gone.remove(&stored.metadata.id);
        s.merge(stored);
    }

    /// Records that the owner destroyed `id` (or found it gone).
    pub(crate) fn forget(&self, id: &str) {
        let mut s = self.lock();
        if let Some(r) = s.resources.remove(id) {
            if s.gone.len() >= MAX_GONE {
                s.gone.clear();
            }
            s.gone.insert(id.to_string(), r.metadata.created);
        }
    }

    /// Records that the owner started tearing `id` down: it no longer stands as a running output.
    pub(crate) fn tearing_down(&self, id: &str) {
        if let Some(r) = self.lock().resources.get_mut(id) {
            r.metadata.phase = Phase::TearingDown;
        }
    }

    /// Runs `f` on the whole kind, or returns `None` while the contents are not all there.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&HashMap<String, RawResource>) -> R) -> Option<R> {
        let s = self.lock();
        s.ready.then(|| f(&s.resources))
    }

    /// Whether the contents are all there.
    pub(crate) fn is_ready(&self) -> bool {
        self.lock().ready
    }
}

impl State {
    /// Keeps `r` unless the cache holds something newer: a later version of the same
    /// incarnation, a later incarnation, or the incarnation is one the owner destroyed.
    fn merge(&mut self, r: &RawResource) {
        let md = &r.metadata;
        if self.gone.get(&md.id).is_some_and(|c| *c == md.created) {
            return;
        }
        if let Some(cur) = self.resources.get_mut(&md.id) {
            let c = &cur.metadata;
            let newer = if c.created == md.created {
                md.version > c.version
            } else {
                md.created > c.created
            };
            if newer {
                cur.clone_from(r);
            }
            return;
        }
        self.resources.insert(md.id.clone(), r.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Metadata;
    use std::time::Duration;

    fn res(id: &str, version: u64, created: u64, spec: &[u8]) -> RawResource {
        let mut metadata = Metadata::new("ns", "T", id);
        metadata.version = version;
        metadata.created = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(created));
        RawResource {
            metadata,
            spec: spec.to_vec(),
            ..Default::default()
        }
    }

    fn event(kind: EventKind, resource: RawResource) -> Event {
        Event {
            kind,
            resource,
            old: None,
            bookmark: None,
        }
    }

    fn spec_of(c: &KindCache, id: &str) -> Option<Vec<u8>> {
        c.with(|m| m.get(id).map(|r| r.spec.clone())).flatten()
    }

    #[test]
    fn not_ready_until_bootstrapped() {
        let c = KindCache::default();
        c.observe(&event(EventKind::Created, res("a", 1, 1, b"x")));
        assert!(!c.is_ready());
        assert_eq!(c.with(|m| m.len()), None);
        c.observe(&event(EventKind::Bootstrapped, RawResource::default()));
        assert_eq!(c.with(|m| m.len()), Some(1));
        c.reset();
        assert!(!c.is_ready());
    }

    #[test]
    fn a_late_event_never_goes_back_in_time() {
        let c = KindCache::default();
        c.observe(&event(EventKind::Bootstrapped, RawResource::default()));
        // The owner's write returns before the watch delivers the versions before it.
        c.record(&res("a", 3, 1, b"v3"));
        c.observe(&event(EventKind::Created, res("a", 1, 1, b"v1")));
        c.observe(&event(EventKind::Updated, res("a", 2, 1, b"v2")));
        assert_eq!(spec_of(&c, "a").as_deref(), Some(&b"v3"[..]));
        // Another party's later update is taken.
        c.observe(&event(EventKind::Updated, res("a", 4, 1, b"v4")));
        assert_eq!(spec_of(&c, "a").as_deref(), Some(&b"v4"[..]));
        // An older incarnation's destroy leaves a newer incarnation alone.
        c.record(&res("b", 1, 20, b"new"));
        assert!(!c.observe(&event(EventKind::Destroyed, res("b", 5, 10, b"old"))));
        assert_eq!(spec_of(&c, "b").as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn what_the_owner_destroyed_does_not_come_back() {
        let c = KindCache::default();
        c.observe(&event(EventKind::Bootstrapped, RawResource::default()));
        c.record(&res("a", 2, 1, b"v2"));
        c.forget("a");
        // Events of the destroyed incarnation still in flight.
        c.observe(&event(EventKind::Updated, res("a", 2, 1, b"v2")));
        assert_eq!(spec_of(&c, "a"), None);
        assert!(
            !c.observe(&event(EventKind::Destroyed, res("a", 2, 1, b"v2"))),
            "the owner's own destroy wakes nobody"
        );
        // Re-created by the owner: a new incarnation.
        c.record(&res("a", 1, 5, b"again"));
        assert_eq!(spec_of(&c, "a").as_deref(), Some(&b"again"[..]));
    }

    #[test]
    fn a_destroy_by_someone_else_is_reported() {
        let c = KindCache::default();
        c.observe(&event(EventKind::Created, res("a", 1, 1, b"x")));
        c.observe(&event(EventKind::Bootstrapped, RawResource::default()));
        assert!(c.observe(&event(EventKind::Destroyed, res("a", 1, 1, b"x"))));
        assert_eq!(spec_of(&c, "a"), None);
        // A relist's synthesized destroy (no creation time) removes too.
        c.record(&res("b", 1, 1, b"y"));
        let gone = RawResource {
            metadata: Metadata::new("ns", "T", "b"),
            ..Default::default()
        };
        assert!(c.observe(&event(EventKind::Destroyed, gone)));
        assert_eq!(spec_of(&c, "b"), None);
    }

    #[test]
    fn teardown_is_remembered() {
        let c = KindCache::default();
        c.observe(&event(EventKind::Bootstrapped, RawResource::default()));
        c.record(&res("a", 1, 1, b"x"));
        c.tearing_down("a");
        assert_eq!(
            c.with(|m| m.get("a").map(|r| r.metadata.phase)).flatten(),
            Some(Phase::TearingDown)
        );
    }
}
