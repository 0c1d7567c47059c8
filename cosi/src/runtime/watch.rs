//! One aggregated kind watch per (namespace, type), fanned out to the controllers whose inputs
//! match, as coalesced wake-ups.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::client::{Client, Event, EventKind, WatchSpec};
use crate::resource::{Metadata, Phase};
use crate::runtime::cache::KindCache;
use crate::runtime::controller::InputKind;
use crate::runtime::task::Backoff;

/// A controller's interest in a kind: an optional ID, the input kind, and its wake channel.
#[derive(Clone, Debug)]
pub(crate) struct Subscriber {
    pub(crate) id: Option<String>,
    pub(crate) kind: InputKind,
    pub(crate) wake: mpsc::Sender<()>,
}

impl Subscriber {
    /// Whether a change of a resource with this metadata wakes the subscriber.
    fn wants(&self, md: &Metadata) -> bool {
        if self.id.as_ref().is_some_and(|id| *id != md.id) {
            return false;
        }
        match self.kind {
            InputKind::Weak | InputKind::Strong => true,
            InputKind::DestroyReady => md.phase == Phase::TearingDown && md.finalizers.is_empty(),
        }
    }
}

/// What the runtime watches a kind for.
#[derive(Debug, Default)]
pub(crate) struct Watched {
    /// Controllers reading the kind.
    pub(crate) subscribers: Vec<Subscriber>,
    /// The kind's memory, if it is a cached output.
    pub(crate) cache: Option<Arc<KindCache>>,
    /// The wake channels of the controllers writing the cached kind: a destroy they did not
    /// make wakes them.
    pub(crate) owners: Vec<mpsc::Sender<()>>,
}

/// Wakes the subscribers an event concerns. A wake-up is a non-blocking send on a capacity-1
/// channel: when one is already pending, the new one merges into it.
pub(crate) fn dispatch(subscribers: &[Subscriber], event: &Event) {
    for s in subscribers {
        let wake = match event.kind {
            // The watch is (re-)established: anything may have changed before it.
            EventKind::Noop | EventKind::Bootstrapped => true,
            EventKind::Created | EventKind::Updated | EventKind::Destroyed => {
                s.wants(&event.resource.metadata)
            }
        };
        if wake {
            let _ = s.wake.try_send(());
        }
    }
}

/// Watches one kind forever, waking subscribers and keeping its memory (a cached output kind);
/// reopens the watch with backoff if it ends. (The client already resumes across transport
/// failures and stated restarts.)
pub(crate) async fn watch_kind(client: Client, namespace: String, r#type: String, w: Watched) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
    loop {
        if let Some(cache) = &w.cache {
            cache.reset();
        }
        let mut watch = client.watch(WatchSpec {
            namespace: namespace.clone(),
            r#type: r#type.clone(),
            // A cached kind starts from its contents; a read one only needs to know the watch
            // is there.
            bootstrap: w.cache.is_some(),
            bootstrap_bookmark: w.cache.is_none(),
            // Controllers read their inputs; only the resource's metadata wakes them (a cache
            // keeps the resource as it is now, not as it was).
            omit_old: true,
            ..WatchSpec::default()
        });
        while let Some(batch) = watch.next_batch().await {
            match batch {
                Ok(events) => {
                    backoff.reset();
                    let mut unexpected = false;
                    for e in &events {
                        if let Some(cache) = &w.cache {
                            unexpected |= cache.observe(e);
                        }
                        dispatch(&w.subscribers, e);
                    }
                    if unexpected {
                        for o in &w.owners {
                            let _ = o.try_send(());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watch failed; reopening");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::RawResource;

    fn event(kind: EventKind, id: &str, phase: Phase, finalizers: &[&str]) -> Event {
        let mut md = Metadata::new("ns", "T", id);
        md.phase = phase;
        md.finalizers = finalizers.iter().map(|f| f.to_string()).collect();
        Event {
            kind,
            resource: RawResource {
                metadata: md,
                ..Default::default()
            },
            old: None,
            bookmark: None,
        }
    }

    #[test]
    fn fan_out_filters_and_coalesces() {
        let (weak_tx, mut weak) = mpsc::channel(1);
        let (id_tx, mut by_id) = mpsc::channel(1);
        let (dr_tx, mut dr) = mpsc::channel(1);
        let subs = vec![
            Subscriber {
                id: None,
                kind: InputKind::Weak,
                wake: weak_tx,
            },
            Subscriber {
                id: Some("b".into()),
                kind: InputKind::Strong,
                wake: id_tx,
            },
            Subscriber {
                id: None,
                kind: InputKind::DestroyReady,
                wake: dr_tx,
            },
        ];
        for _ in 0..100 {
            dispatch(&subs, &event(EventKind::Updated, "a", Phase::Running, &[]));
        }
        assert!(weak.try_recv().is_ok());
        assert!(weak.try_recv().is_err(), "a burst is one wake-up");
        assert!(by_id.try_recv().is_err());
        assert!(dr.try_recv().is_err());

        dispatch(
            &subs,
            &event(EventKind::Updated, "b", Phase::TearingDown, &["f"]),
        );
        assert!(by_id.try_recv().is_ok());
        assert!(dr.try_recv().is_err(), "finalizers remain");

        dispatch(
            &subs,
            &event(EventKind::Updated, "b", Phase::TearingDown, &[]),
        );
        assert!(dr.try_recv().is_ok());

        dispatch(&subs, &event(EventKind::Noop, "", Phase::Running, &[]));
        assert!(weak.try_recv().is_ok() && by_id.try_recv().is_ok() && dr.try_recv().is_ok());
    }
}
