//! A controller's decoded copy of an input kind ([`Mirror`]), refreshed by
//! [`Context::refresh`](super::Context::refresh) with what changed since the last cycle: a
//! controller reading thousands of resources at every wake-up decodes only the new and changed
//! ones.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use crate::resource::{RawResource, Resource, ResourceSpec, SpecError};

/// The resources of one kind (one namespace), decoded, sorted by ID.
#[derive(Debug)]
pub struct Mirror<S> {
    items: BTreeMap<String, Entry<S>>,
}

#[derive(Debug)]
struct Entry<S> {
    /// Which revision of which incarnation was decoded.
    version: u64,
    created: Option<SystemTime>,
    resource: Resource<S>,
}

impl<S> Default for Mirror<S> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
        }
    }
}

impl<S: ResourceSpec> Mirror<S> {
    /// The resources, sorted by ID.
    pub fn iter(&self) -> impl Iterator<Item = &Resource<S>> {
        self.items.values().map(|e| &e.resource)
    }

    /// How many resources.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Makes the mirror hold exactly `current` (whose IDs `contains` answers for), decoding
    /// only the resources that are new or of another version or incarnation. A resource that
    /// does not decode is an error, and the mirror stays partly refreshed: the next refresh
    /// decodes what is still missing or outdated.
    fn sync<'a>(
        &mut self,
        current: impl IntoIterator<Item = &'a RawResource>,
        contains: impl Fn(&str) -> bool,
    ) -> Result<(), SpecError> {
        self.items.retain(|id, _| contains(id));
        for r in current {
            let md = &r.metadata;
            if self
                .items
                .get(&md.id)
                .is_some_and(|e| e.version == md.version && e.created == md.created)
            {
                continue;
            }
            let resource = Resource::from_raw(r)?;
            self.items.insert(
                md.id.clone(),
                Entry {
                    version: md.version,
                    created: md.created,
                    resource,
                },
            );
        }
        Ok(())
    }

    /// [`sync`](Self::sync) from a map by ID.
    pub(crate) fn sync_map(
        &mut self,
        current: &HashMap<String, RawResource>,
    ) -> Result<(), SpecError> {
        self.sync(current.values(), |id| current.contains_key(id))
    }

    /// [`sync`](Self::sync) from a listing.
    pub(crate) fn sync_list(&mut self, current: &[RawResource]) -> Result<(), SpecError> {
        let ids: std::collections::HashSet<&str> =
            current.iter().map(|r| r.metadata.id.as_str()).collect();
        self.sync(current, |id| ids.contains(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Metadata;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Spec(u32);

    impl ResourceSpec for Spec {
        const TYPE: &'static str = "Specs.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "ns";
    }

    fn raw(id: &str, version: u64, value: u32) -> RawResource {
        let mut r = Resource::new("ns", id, Spec(value))
            .to_raw()
            .expect("encode");
        r.metadata.version = version;
        r
    }

    fn values(m: &Mirror<Spec>) -> Vec<(String, u32)> {
        m.iter().map(|r| (r.id().to_string(), r.spec.0)).collect()
    }

    #[test]
    fn follows_additions_changes_and_removals() {
        let mut m = Mirror::<Spec>::default();
        m.sync_list(&[raw("b", 1, 2), raw("a", 1, 1)])
            .expect("sync");
        assert_eq!(values(&m), vec![("a".into(), 1), ("b".into(), 2)]);
        let mut now = HashMap::new();
        for r in [raw("a", 2, 10), raw("c", 1, 3)] {
            now.insert(r.metadata.id.clone(), r);
        }
        m.sync_map(&now).expect("sync");
        assert_eq!(values(&m), vec![("a".into(), 10), ("c".into(), 3)]);
        assert_eq!(m.len(), 2);
        // The same version is not decoded again: a different spec under it would not show.
        let mut same = raw("a", 2, 99);
        same.metadata.id = "a".into();
        m.sync_list(&[same, raw("c", 1, 3)]).expect("sync");
        assert_eq!(values(&m), vec![("a".into(), 10), ("c".into(), 3)]);
        // A new incarnation at the same version is.
        let mut again = raw("a", 2, 7);
        again.metadata.created = Some(SystemTime::UNIX_EPOCH);
        m.sync_list(&[again]).expect("sync");
        assert_eq!(values(&m), vec![("a".into(), 7)]);
        m.sync_list(&[]).expect("sync");
        assert!(m.is_empty());
    }

    #[test]
    fn an_undecodable_resource_is_an_error() {
        let mut m = Mirror::<Spec>::default();
        let bad = RawResource {
            metadata: Metadata::new("ns", Spec::TYPE, "x"),
            spec: vec![0xff, 0x00],
            ..Default::default()
        };
        assert!(m.sync_list(&[bad]).is_err());
    }
}
