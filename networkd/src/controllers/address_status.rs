//! AddressStatusController: kernel addresses → AddressStatus (`network`, ID
//! `<link>/<address>/<prefix>`), re-listed on every burst of link or address events.

use std::collections::BTreeSet;
use std::net::IpAddr;

use cosi::{Action, Context, Controller, Input, Output, ReconcileError, Resource};
use ipnet::IpNet;
use machinery::resources::network::{
    address_id, AddressFlags, AddressStatusSpec, Family, Scope, NAMESPACE,
};

use crate::netlink::{watch, Address, Kernel, Link};

/// The owner name.
pub const NAME: &str = "network.AddressStatusController";

/// Reports kernel addresses.
#[derive(Debug)]
pub struct AddressStatusController {
    kernel: Kernel,
}

impl Default for AddressStatusController {
    fn default() -> Self {
        Self {
            kernel: Kernel::new(watch::GROUP_LINK | watch::GROUPS_ADDRESS),
        }
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
        vec![Output::exclusive::<AddressStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nl = self
            .kernel
            .connect(&ctx.waker())
            .map_err(|e| ReconcileError::failed("connect to the kernel", e))?
            .clone();
        let links = nl
            .links()
            .await
            .map_err(|e| ReconcileError::failed("list links", e))?;
        let addresses = nl
            .addresses()
            .await
            .map_err(|e| ReconcileError::failed("list addresses", e))?;
        let mut seen = BTreeSet::new();
        // One write per ID and pass, whatever the kernel lists twice.
        let statuses = addresses
            .iter()
            .filter_map(|a| status(a, &links))
            .filter(|(id, _)| seen.insert(id.clone()))
            .map(|(id, spec)| Resource::new(NAMESPACE, id, spec));
        ctx.apply_all(statuses.collect::<Vec<_>>()).await?;
        Ok(Action::AwaitChange)
    }
}
