//! AddressStatusController: kernel addresses → AddressStatus (`network`, ID
//! `<link>/<address>/<prefix>`), woken by every burst of link or address events.
//!
//! It keeps the kernel's addresses ([`KernelModel`]) and updates them from the address
//! messages; it lists them again at start, after lost messages and after a link change (a
//! renamed link renames its addresses' IDs).

use std::net::IpAddr;

use cosi::{Action, Context, Controller, Input, Output, ReconcileError};
use ipnet::IpNet;
use machinery::resources::network::{address_id, AddressFlags, AddressStatusSpec, Family, Scope};

use super::kernel_model::KernelModel;
use crate::netlink::watch::Change;
use crate::netlink::{watch, Address, Kernel, Link};

/// The owner name.
pub const NAME: &str = "network.AddressStatusController";

/// Reports kernel addresses.
#[derive(Debug)]
pub struct AddressStatusController {
    kernel: Kernel,
    /// The links as last listed, and the addresses as listed and updated since; `None` until
    /// the first listing.
    model: Option<(Vec<Link>, KernelModel<Address>)>,
}

impl Default for AddressStatusController {
    fn default() -> Self {
        Self {
            kernel: Kernel::recording(watch::GROUP_LINK | watch::GROUPS_ADDRESS),
            model: None,
        }
    }
}

/// Whether two kernel addresses of one status ID are the same address.
fn same_address(a: &Address, b: &Address) -> bool {
    a.index == b.index
        && a.address == b.address
        && a.prefix_len == b.prefix_len
        && a.local == b.local
}

/// Applies the address messages to `model`; `false` if they cannot tell everything (the
/// caller lists again).
fn apply(
    model: &mut KernelModel<Address>,
    links: &[Link],
    changes: Vec<Change>,
) -> Result<bool, ReconcileError> {
    let status = |a: &Address| status(a, links);
    for c in changes {
        match c {
            Change::Link => return Ok(false),
            Change::NewAddress(a) => model.upsert(a, same_address, status)?,
            Change::DelAddress(a) => model.remove(&a, same_address, status)?,
            Change::NewRoute { .. } | Change::DelRoute(_) => {}
        }
    }
    Ok(true)
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
            (Some((links, model)), Some(changes)) => apply(model, links, changes).unwrap_or(false),
            _ => false,
        };
        if !updated {
            // Dropped first: a failed listing lists again next time.
            self.model = None;
            let links = nl
                .links()
                .await
                .map_err(|e| ReconcileError::failed("list links", e))?;
            let addresses = nl
                .addresses()
                .await
                .map_err(|e| ReconcileError::failed("list addresses", e))?;
            let model = KernelModel::listed(addresses, |a| status(a, &links))?;
            self.model = Some((links, model));
        }
        if let Some((_, model)) = &self.model {
            ctx.apply_all_raw(model.resources()).await?;
        }
        Ok(Action::AwaitChange)
    }
}
