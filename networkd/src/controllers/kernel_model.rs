//! The shape of a status controller that updates from the kernel's messages: the kernel's objects
//! of one kind grouped by status ID, each group with its status encoded once, rebuilt from a
//! listing when the messages cannot be trusted to tell everything and otherwise updated one
//! message at a time. A wake-up of a node with thousands of routes then costs what changed, not
//! a dump, a status and an encoding of every route.

use std::collections::HashMap;

use cosi::{RawResource, ReconcileError, Resource, ResourceSpec};
use machinery::resources::network::NAMESPACE;

/// Kernel objects of one kind by status ID.
#[derive(Debug)]
pub struct KernelModel<T> {
    by_id: HashMap<String, Group<T>>,
}

/// The kernel objects one status ID stands for (almost always one: the ID does not tell
/// everything apart, e.g. routes of different types) and the status of the first, encoded.
#[derive(Debug)]
struct Group<T> {
    objects: Vec<T>,
    resource: RawResource,
}

impl<T> Default for KernelModel<T> {
    fn default() -> Self {
        Self {
            by_id: HashMap::new(),
        }
    }
}

impl<T> KernelModel<T> {
    /// The model of a listing, in the kernel's order; `status` gives an object's ID and status
    /// (`None`: not reported).
    ///
    /// # Errors
    ///
    /// A status that does not encode.
    pub fn listed<S: ResourceSpec>(
        objects: impl IntoIterator<Item = T>,
        status: impl Fn(&T) -> Option<(String, S)>,
    ) -> Result<Self, ReconcileError> {
        let mut m = Self::default();
        for o in objects {
            if let Some((id, spec)) = status(&o) {
                m.push(id, spec, o)?;
            }
        }
        Ok(m)
    }

    fn push<S: ResourceSpec>(&mut self, id: String, spec: S, o: T) -> Result<(), ReconcileError> {
        match self.by_id.get_mut(&id) {
            // The ID is reported for the first object the kernel has for it.
            Some(g) => g.objects.push(o),
            None => {
                let resource = Resource::new(NAMESPACE, id.clone(), spec).to_raw()?;
                self.by_id.insert(
                    id,
                    Group {
                        objects: vec![o],
                        resource,
                    },
                );
            }
        }
        Ok(())
    }

    /// An object appeared or changed: it replaces the object of its group that `same` says it
    /// is, or joins the group.
    ///
    /// # Errors
    ///
    /// A status that does not encode.
    pub fn upsert<S: ResourceSpec>(
        &mut self,
        o: T,
        same: impl Fn(&T, &T) -> bool,
        status: impl Fn(&T) -> Option<(String, S)>,
    ) -> Result<(), ReconcileError> {
        let Some((id, spec)) = status(&o) else {
            return Ok(());
        };
        let Some(g) = self.by_id.get_mut(&id) else {
            return self.push(id, spec, o);
        };
        match g.objects.iter().position(|x| same(x, &o)) {
            Some(0) => {
                g.resource = Resource::new(NAMESPACE, id, spec).to_raw()?;
                g.objects[0] = o;
            }
            Some(i) => g.objects[i] = o,
            None => g.objects.push(o),
        }
        Ok(())
    }

    /// An object vanished: it leaves its group, and a group left empty leaves the model.
    ///
    /// # Errors
    ///
    /// A status that does not encode.
    pub fn remove<S: ResourceSpec>(
        &mut self,
        o: &T,
        same: impl Fn(&T, &T) -> bool,
        status: impl Fn(&T) -> Option<(String, S)>,
    ) -> Result<(), ReconcileError> {
        let Some((id, _)) = status(o) else {
            return Ok(());
        };
        let Some(g) = self.by_id.get_mut(&id) else {
            return Ok(());
        };
        let Some(i) = g.objects.iter().position(|x| same(x, o)) else {
            return Ok(());
        };
        g.objects.remove(i);
        if g.objects.is_empty() {
            self.by_id.remove(&id);
        } else if i == 0 {
            // The next object stands for the ID now.
            if let Some((_, spec)) = status(&g.objects[0]) {
                g.resource = Resource::new(NAMESPACE, id, spec).to_raw()?;
            }
        }
        Ok(())
    }

    /// Every status, encoded.
    pub fn resources(&self) -> impl Iterator<Item = &RawResource> {
        self.by_id.values().map(|g| &g.resource)
    }

    /// How many statuses.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::network::HostnameStatusSpec;

    /// Objects `(id, what)`: the status is the `what` of the first object of an ID.
    fn status(o: &(&'static str, &'static str)) -> Option<(String, HostnameStatusSpec)> {
        (o.0 != "hidden").then(|| {
            (
                o.0.to_string(),
                HostnameStatusSpec {
                    hostname: o.1.to_string(),
                    domainname: String::new(),
                },
            )
        })
    }

    fn same(a: &(&str, &str), b: &(&str, &str)) -> bool {
        a == b
    }

    fn reported(m: &KernelModel<(&'static str, &'static str)>) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = m
            .resources()
            .map(|r| {
                let s = Resource::<HostnameStatusSpec>::from_raw(r).expect("decodes");
                (s.metadata.id, s.spec.hostname)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn updates_agree_with_a_new_listing() {
        let mut m = KernelModel::listed(
            vec![("a", "1"), ("b", "1"), ("b", "2"), ("hidden", "x")],
            status,
        )
        .expect("model");
        assert_eq!(
            reported(&m),
            vec![("a".into(), "1".into()), ("b".into(), "1".into())]
        );
        // The first object of `b` goes: the second stands for it.
        m.remove(&("b", "1"), same, status).expect("remove");
        m.upsert(("c", "1"), same, status).expect("upsert");
        m.upsert(("a", "1"), same, status).expect("again");
        m.remove(&("zzz", "1"), same, status).expect("unknown");
        m.remove(&("a", "nope"), same, status)
            .expect("not the object");
        let relisted =
            KernelModel::listed(vec![("a", "1"), ("b", "2"), ("c", "1")], status).expect("model");
        assert_eq!(reported(&m), reported(&relisted));
        assert_eq!(m.len(), 3);
        m.remove(&("c", "1"), same, status).expect("remove");
        m.remove(&("b", "2"), same, status).expect("remove");
        m.remove(&("a", "1"), same, status).expect("remove");
        assert!(m.is_empty());
    }
}
