//! The shape of a controller that follows the kernel's objects of one kind from the kernel's
//! messages instead of dumping them at every wake-up, listing them again only when the messages
//! cannot be trusted to tell everything.
//!
//! - A status controller ([`Observer`]) keeps them grouped by status ID, each group with its
//!   status encoded once ([`KernelModel`]): a wake-up of a node with thousands of routes then
//!   costs what changed, not a dump, a status and an encoding of every route.
//! - A spec controller ([`Follower`]) keeps them by the kernel's identity ([`Table`]), where it
//!   looks up what its specs describe: the status controller of the same kind already follows
//!   them from the messages, so a dump of every route at every pass would be a second reading
//!   of what networkd already knows. What a pass adds or deletes comes back as messages and
//!   wakes it again; a stale belief costs one request answered `EEXIST` or `ENOENT`, which the
//!   spec controllers take as done.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;

use cosi::{Action, Context, RawResource, ReconcileError, Resource, ResourceSpec};
use machinery::resources::network::NAMESPACE;

use crate::netlink::watch::Change;
use crate::netlink::{Error, Kernel, Link, Netlink};

/// A kind of kernel object a controller follows from the kernel's messages.
pub trait Followed: Sized + Send + Sync + 'static {
    /// The kernel's identity of an object as a spec describes it (several objects may share
    /// one, e.g. routes of different types).
    type Key: Hash + Eq + Send + Sync + std::fmt::Debug;
    /// What a listing is, for its error (`list routes`).
    const LISTING: &'static str;
    /// Every object of the kind.
    fn list(nl: &Netlink) -> impl Future<Output = Result<Vec<Self>, Error>> + Send;
    /// Its identity.
    fn key(&self) -> Self::Key;
    /// Whether two objects of one key or status ID are the same kernel object.
    fn same(&self, other: &Self) -> bool;
    /// What a kernel message means for the objects.
    fn step(change: Change) -> Step<Self>;
}

/// A kind of kernel object a status controller reports.
pub trait Observed: Followed {
    /// Its status.
    type Status: ResourceSpec;
    /// Its status ID and status; `None` if it is not reported.
    fn status(&self, links: &[Link]) -> Option<(String, Self::Status)>;
}

/// The kernel's recorded messages applied to `state` with `apply`; `None` when the caller must
/// list again: no state yet, messages lost, or `apply` says they cannot tell everything.
fn updated<S>(
    kernel: &Kernel,
    state: Option<S>,
    apply: impl FnOnce(&mut S, Vec<Change>) -> bool,
) -> Option<S> {
    // Taken before any listing: what arrives during one is applied (again) next time, which
    // changes nothing the listing already has.
    let changes = kernel.changes();
    let (mut state, changes) = (state?, changes?);
    apply(&mut state, changes).then_some(state)
}

/// A spec controller's view of the kernel's objects of one kind: the recording watch and the
/// objects by identity.
#[derive(Debug)]
pub struct Follower<T: Followed> {
    kernel: Kernel,
    /// The objects as listed and updated since; `None` until the first listing.
    table: Option<Table<T>>,
}

impl<T: Followed> Follower<T> {
    /// A follower of the multicast `groups` (`watch::GROUP_*`), which also wake the controller.
    pub fn new(groups: u32) -> Self {
        Self {
            kernel: Kernel::recording(groups),
            table: None,
        }
    }

    /// The request connection and the kernel's objects, brought up to date from the messages
    /// recorded since the last call, or listed (at first, after lost messages, or when a
    /// message cannot tell everything). What changes after this call wakes the controller.
    ///
    /// # Errors
    ///
    /// The kernel cannot be reached or listed.
    pub async fn sync(
        &mut self,
        waker: &cosi::Waker,
    ) -> Result<(Netlink, &Table<T>), ReconcileError> {
        let nl = self
            .kernel
            .connect(waker)
            .map_err(|e| ReconcileError::failed("connect to the kernel", e))?
            .clone();
        let table = match updated(&self.kernel, self.table.take(), Table::apply) {
            Some(table) => table,
            None => Table::listed(
                T::list(&nl)
                    .await
                    .map_err(|e| ReconcileError::failed(T::LISTING, e))?,
            ),
        };
        Ok((nl, self.table.insert(table)))
    }
}

/// Kernel objects of one kind by identity, in the kernel's order within one.
#[derive(Debug)]
pub struct Table<T: Followed> {
    by_key: HashMap<T::Key, Vec<T>>,
}

impl<T: Followed> Table<T> {
    /// The table of a listing.
    pub fn listed(objects: impl IntoIterator<Item = T>) -> Self {
        let mut by_key: HashMap<T::Key, Vec<T>> = HashMap::new();
        for o in objects {
            by_key.entry(o.key()).or_default().push(o);
        }
        Self { by_key }
    }

    /// Applies the kernel's messages in order; `false` if they cannot tell everything (the
    /// caller lists again).
    pub fn apply(&mut self, changes: Vec<Change>) -> bool {
        for c in changes {
            match T::step(c) {
                Step::Upsert(o) => {
                    let group = self.by_key.entry(o.key()).or_default();
                    match group.iter().position(|x| x.same(&o)) {
                        Some(i) => group[i] = o,
                        None => group.push(o),
                    }
                }
                Step::Remove(o) => {
                    let key = o.key();
                    if let Some(group) = self.by_key.get_mut(&key) {
                        group.retain(|x| !x.same(&o));
                        if group.is_empty() {
                            self.by_key.remove(&key);
                        }
                    }
                }
                Step::Ignore => {}
                Step::Relist => return false,
            }
        }
        true
    }

    /// The objects of one identity, in the kernel's order.
    pub fn get(&self, key: &T::Key) -> &[T] {
        self.by_key.get(key).map_or(&[], Vec::as_slice)
    }

    /// Every object (what the tests compare with a listing).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.by_key.values().flatten()
    }
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
        // A status that does not encode leaves the model half updated: listed again (where
        // the error is reported).
        let model = updated(
            &self.kernel,
            self.model.take(),
            |(links, model), changes| model.apply(links, changes).unwrap_or(false),
        );
        let model = match model {
            Some(model) => model,
            None => {
                let links = nl
                    .links()
                    .await
                    .map_err(|e| ReconcileError::failed("list links", e))?;
                let objects = T::list(&nl)
                    .await
                    .map_err(|e| ReconcileError::failed(T::LISTING, e))?;
                let model = KernelModel::listed(objects, |o| o.status(&links))?;
                (links, model)
            }
        };
        let (_, model) = self.model.insert(model);
        ctx.apply_all_raw(model.resources()).await?;
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

    fn route(dst: &str, gateway: Option<&str>, mtu: u32) -> crate::netlink::Route {
        crate::netlink::Route {
            family: crate::netlink::AF_INET,
            dst: Some(dst.parse().expect("ip")),
            dst_len: 24,
            src: None,
            gateway: gateway.map(|g| g.parse().expect("ip")),
            oif: 2,
            table: 254,
            priority: 0,
            scope: 0,
            protocol: 4,
            kind: 1,
            flags: 0,
            mtu,
            multipath: vec![],
        }
    }

    fn address() -> crate::netlink::Address {
        crate::netlink::Address {
            index: 2,
            address: "10.1.0.1".parse().expect("ip"),
            prefix_len: 24,
            local: None,
            broadcast: None,
            anycast: None,
            multicast: None,
            scope: 0,
            flags: 0,
            priority: 0,
            protocol: 0,
        }
    }

    fn sorted(t: &Table<crate::netlink::Route>) -> Vec<String> {
        let mut v: Vec<String> = t.iter().map(|r| format!("{r:?}")).collect();
        v.sort();
        v
    }

    /// A spec controller's table updated from messages holds what a new listing would, and a
    /// message that cannot tell everything asks for the listing.
    #[test]
    fn a_followed_table_agrees_with_a_new_listing() {
        let a = route("10.1.0.0", None, 0);
        let b = route("10.2.0.0", Some("10.0.0.1"), 0);
        let mut t = Table::listed(vec![a.clone(), b.clone()]);
        // Another route of b's key (another link): both kept, in order.
        let b2 = crate::netlink::Route {
            oif: 3,
            ..b.clone()
        };
        let b_mtu = crate::netlink::Route {
            mtu: 1400,
            ..b.clone()
        };
        let c = route("10.3.0.0", None, 0);
        let cloned = crate::netlink::Route {
            flags: 0x200,
            ..route("10.4.0.0", None, 0)
        };
        let new = |route| Change::NewRoute {
            route,
            replace: false,
        };
        assert!(t.apply(vec![
            new(b2.clone()),
            new(c.clone()),
            Change::DelRoute(a.clone()),
            new(b_mtu.clone()),
            new(cloned),
            Change::NewAddress(address()),
            Change::DelRoute(route("10.9.0.0", None, 0)),
        ]));
        let relisted = Table::listed(vec![b_mtu.clone(), b2.clone(), c.clone()]);
        assert_eq!(sorted(&t), sorted(&relisted));
        assert_eq!(t.get(&b.key()), [b_mtu, b2]);
        assert!(t.get(&a.key()).is_empty(), "a removed key leaves the table");
        for relist in [
            Change::Link,
            Change::NewRoute {
                route: c.clone(),
                replace: true,
            },
            Change::DelAddress(address()),
        ] {
            assert!(!t.apply(vec![relist.clone()]), "{relist:?} must relist");
        }
    }
}
