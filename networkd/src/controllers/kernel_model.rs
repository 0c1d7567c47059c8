//! The shape of a status controller that updates from the kernel's messages: the kernel's objects
//! of one kind grouped by status ID, each group with its status encoded once, rebuilt from a
//! listing when the messages cannot be trusted to tell everything and otherwise updated one
//! message at a time. A wake-up of a node with thousands of routes then costs what changed, not
//! a dump, a status and an encoding of every route.

use std::collections::HashMap;
use std::future::Future;

use cosi::{Action, Context, RawResource, ReconcileError, Resource, ResourceSpec};
use machinery::resources::network::NAMESPACE;

use crate::netlink::watch::Change;
use crate::netlink::{Error, Kernel, Link, Netlink};

/// A kind of kernel object a status controller reports and follows from the kernel's messages.
pub trait Observed: Sized + Send + Sync + 'static {
    /// Its status.
    type Status: ResourceSpec;
    /// What a listing is, for its error (`list routes`).
    const LISTING: &'static str;
    /// Every object of the kind.
    fn list(nl: &Netlink) -> impl Future<Output = Result<Vec<Self>, Error>> + Send;
    /// Its status ID and status; `None` if it is not reported.
    fn status(&self, links: &[Link]) -> Option<(String, Self::Status)>;
    /// Whether two objects of one status ID are the same kernel object.
    fn same(&self, other: &Self) -> bool;
    /// What a kernel message means for the objects.
    fn step(change: Change) -> Step<Self>;
}

/// What a kernel message means for a [`KernelModel`].
#[derive(Debug)]
pub enum Step<T> {
    /// The object appeared or changed.
    Upsert(T),
    /// The object vanished.
    Remove(T),
    /// Nothing for this kind.
    Ignore,
    /// The messages cannot tell everything: list again.
    Relist,
}

/// A status controller's kernel side: the recording watch and the model of the objects.
#[derive(Debug)]
pub struct Observer<T> {
    kernel: Kernel,
    /// The links as last listed, and the objects as listed and updated since; `None` until the
    /// first listing.
    model: Option<(Vec<Link>, KernelModel<T>)>,
}

impl<T: Observed> Observer<T> {
    /// An observer of the multicast `groups` (`watch::GROUP_*`).
    pub fn new(groups: u32) -> Self {
        Self {
            kernel: Kernel::recording(groups),
            model: None,
        }
    }

    /// Brings the model up to date (from the messages, or a listing when they cannot tell
    /// everything) and asserts every status.
    ///
    /// # Errors
    ///
    /// The kernel cannot be reached or listed; a status does not encode; writes to stated.
    pub async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nl = self
            .kernel
            .connect(&ctx.waker())
            .map_err(|e| ReconcileError::failed("connect to the kernel", e))?
            .clone();
        // Taken before any listing: what arrives during one is applied (again) next time,
        // which changes nothing the listing already has.
        let changes = self.kernel.changes();
        let updated = match (self.model.as_mut(), changes) {
            // A status that does not encode leaves the model half updated: listed again
            // (where the error is reported).
            (Some((links, model)), Some(changes)) => model.apply(links, changes).unwrap_or(false),
            _ => false,
        };
        if !updated {
            // Dropped first: a failed listing lists again next time.
            self.model = None;
            let links = nl
                .links()
                .await
                .map_err(|e| ReconcileError::failed("list links", e))?;
            let objects = T::list(&nl)
                .await
                .map_err(|e| ReconcileError::failed(T::LISTING, e))?;
            let model = KernelModel::listed(objects, |o| o.status(&links))?;
            self.model = Some((links, model));
        }
        if let Some((_, model)) = &self.model {
            ctx.apply_all_raw(model.resources()).await?;
        }
        Ok(Action::AwaitChange)
    }
}

impl<T: Observed> KernelModel<T> {
    /// Applies the kernel's messages in order; `false` if they cannot tell everything (the
    /// caller lists again).
    ///
    /// # Errors
    ///
    /// A status that does not encode.
    pub fn apply(&mut self, links: &[Link], changes: Vec<Change>) -> Result<bool, ReconcileError> {
        let status = |o: &T| o.status(links);
        for c in changes {
            match T::step(c) {
                Step::Upsert(o) => self.upsert(o, T::same, status)?,
                Step::Remove(o) => self.remove(&o, T::same, status)?,
                Step::Ignore => {}
                Step::Relist => return Ok(false),
            }
        }
        Ok(true)
    }
}

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
