//! AddressStatusController: kernel addresses → AddressStatus (`network`, ID
//! `<link>/<address>/<prefix>`), woken by every burst of link or address events.
//!
//! It keeps the kernel's addresses (an [`Observer`]) and updates them from the address
//! messages; it lists them again at start, after lost messages and after a link change (a
//! renamed link renames its addresses' IDs).

use std::net::IpAddr;

use cosi::{Action, Context, Controller, Input, Output, ReconcileError};
use ipnet::IpNet;
use machinery::resources::network::{address_id, AddressFlags, AddressStatusSpec, Family, Scope};

use super::kernel_model::{Followed, Observed, Observer, Step};
use crate::netlink::watch::Change;
use crate::netlink::{watch, Address, Error, Link, Netlink};

/// The owner name.
pub const NAME: &str = "network.AddressStatusController";

/// Reports kernel addresses.
#[derive(Debug)]
pub struct AddressStatusController {
    observer: Observer<Address>,
}

impl Default for AddressStatusController {
    fn default() -> Self {
        Self {
            observer: Observer::new(watch::GROUP_LINK | watch::GROUPS_ADDRESS),
        }
    }
}

impl Followed for Address {
    /// Link index, address and prefix length.
    type Key = (u32, IpAddr, u8);
    const LISTING: &'static str = "list addresses";

    fn list(nl: &Netlink) -> impl std::future::Future<Output = Result<Vec<Self>, Error>> + Send {
        nl.addresses()
    }

    fn key(&self) -> Self::Key {
        (self.index, self.address, self.prefix_len)
    }

    fn same(&self, b: &Self) -> bool {
        self.index == b.index
            && self.address == b.address
            && self.prefix_len == b.prefix_len
            && self.local == b.local
    }

    fn step(change: Change) -> Step<Self> {
        match change {
            // A renamed link renames its addresses' IDs; a deleted one takes its addresses.
            Change::Link => Step::Relist,
            Change::NewAddress(a) => Step::Upsert(a),
            Change::DelAddress(a) => Step::Remove(a),
            Change::NewRoute { .. } | Change::DelRoute(_) => Step::Ignore,
        }
    }
}

impl Observed for Address {
    type Status = AddressStatusSpec;

    fn status(&self, links: &[Link]) -> Option<(String, AddressStatusSpec)> {
        status(self, links)
    }
}

/// The ID and status of one kernel address; `None` if its link is unknown or its prefix invalid.
pub(crate) fn status(a: &Address, links: &[Link]) -> Option<(String, AddressStatusSpec)> {
    let link = links.iter().find(|l| l.index == a.index)?;
    let address = IpNet::new(a.address, a.prefix_len).ok()?;
    let spec = AddressStatusSpec {
        address,
        local: a.local,
        broadcast: a.broadcast.map(IpAddr::V4),
        anycast: a.anycast.map(IpAddr::V6),
        multicast: a.multicast.map(IpAddr::V6),
        link_index: a.index,
        link_name: link.name.clone(),
        family: Family::of(&a.address),
        scope: Scope::from_number(a.scope).unwrap_or_default(),
        flags: AddressFlags(a.flags),
        priority: a.priority,
    };
    Some((address_id(&link.name, &address), spec))
}

impl Controller for AddressStatusController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<AddressStatusSpec>().cached()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        self.observer.reconcile(ctx).await
    }
}
