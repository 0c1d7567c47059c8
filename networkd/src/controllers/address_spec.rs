//! AddressSpecController: merged AddressSpecs (`network`) → kernel addresses (networking.md
//! §3.3).
//!
//! - The link is resolved by name, alias, then alternative name; an unresolved link is retried
//!   on the next link event.
//! - Running: an address that exists with the same scope, managed flags and route priority is
//!   left alone, whoever added it; otherwise it is replaced (delete, add marked as networkd's).
//!   Only the managed flags are compared, never the kernel's own (secondary, tentative ...:
//!   upstream #13932), so a converged kernel sees no change.
//! - Tearing down: the address is deleted only if networkd added it; then the finalizer goes.
//! - An IPv4 address added with `announceWithARP` (a shared IP) is announced with one
//!   gratuitous ARP on an Ethernet link ([`crate::arp`]).
//!
//! Unlike upstream, the controller also watches the address groups, so an address deleted behind
//! networkd's back is restored at once rather than on the next link event. The kernel's
//! addresses are followed from its messages ([`Follower`]), not dumped at every pass: a pass
//! looks them up by link and prefix (not a scan per spec) and has up to `link_spec::IN_FLIGHT`
//! (32) netlink requests outstanding.

use cosi::runtime::Mirror;
use cosi::{Action, Context, Controller, Input, Output, Phase, ReconcileError};
use machinery::resources::network::{AddressFlags, AddressSpec, AddressSpecSpec, NAMESPACE};

use crate::netlink::{self, watch, Address, AddressAdd, Link};

use super::kernel_model::{Follower, Table};
use super::link_spec::{aggregate, in_flight};

/// The owner and finalizer name.
pub const NAME: &str = "network.AddressSpecController";

/// Applies AddressSpecs to the kernel.
#[derive(Debug)]
pub struct AddressSpecController {
    /// The kernel's addresses.
    addresses: Follower<Address>,
    /// The specs, decoded once per version.
    specs: Mirror<AddressSpecSpec>,
}

impl Default for AddressSpecController {
    fn default() -> Self {
        Self {
            addresses: Follower::new(watch::GROUP_LINK | watch::GROUPS_ADDRESS),
            specs: Mirror::default(),
        }
    }
}

impl Controller for AddressSpecController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<AddressSpecSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        ctx.refresh(NAMESPACE, &mut self.specs).await?;
        let specs = &self.specs;
        let (nl, addresses) = self.addresses.sync(&ctx.waker()).await?;
        let links = nl
            .links()
            .await
            .map_err(|e| ReconcileError::failed("list links", e))?;
        ctx.add_finalizers(specs.iter(), NAME).await?;
        let mut errors = Vec::new();
        // Teardowns first, one by one, so that a replaced address is gone before its successor
        // comes; then every running spec, many requests in flight.
        for spec in specs
            .iter()
            .filter(|s| s.metadata.phase == Phase::TearingDown)
        {
            if let Err(e) = teardown(ctx, &nl, spec, &links, addresses).await {
                errors.push(e);
            }
        }
        let passes = specs
            .iter()
            .filter(|s| s.metadata.phase == Phase::Running)
            .map(|s| converge(&nl, &s.spec, &links, addresses));
        let results = in_flight(passes.collect()).await;
        errors.extend(results.into_iter().filter_map(Result::err));
        aggregate("addresses", errors)
    }
}

/// The kernel address a spec describes on `link` (the first of several with different peers).
fn find<'a>(
    addresses: &'a Table<Address>,
    link: &Link,
    s: &AddressSpecSpec,
) -> Option<&'a Address> {
    addresses
        .get(&(link.index, s.address.addr(), s.address.prefix_len()))
        .first()
}

/// Whether the kernel address already is what the spec asks for.
pub(crate) fn matches(a: &Address, s: &AddressSpecSpec) -> bool {
    a.scope == s.scope.number()
        && AddressFlags(a.flags).managed() == s.flags.managed()
        && a.priority == s.priority
}

async fn teardown(
    ctx: &Context,
    nl: &netlink::Netlink,
    spec: &AddressSpec,
    links: &[Link],
    addresses: &Table<Address>,
) -> Result<(), ReconcileError> {
    let s = &spec.spec;
    // A missing link took its addresses with it.
    if let Some(link) = netlink::resolve_link(links, &s.link_name, false) {
        if let Some(a) = find(addresses, link, s) {
            if a.is_owned() {
                match nl.delete_address(a).await {
                    Ok(()) => {
                        tracing::info!(link = %s.link_name, address = %s.address, "address deleted")
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        return Err(ReconcileError::failed(
                            format!("delete address {} from {}", s.address, s.link_name),
                            e,
                        ))
                    }
                }
            } else {
                tracing::info!(link = %s.link_name, address = %s.address,
                    "address not added by networkd, left in place");
            }
        }
    }
    ctx.remove_finalizer::<AddressSpecSpec>(NAMESPACE, spec.id(), NAME)
        .await
}

async fn converge(
    nl: &netlink::Netlink,
    s: &AddressSpecSpec,
    links: &[Link],
    addresses: &Table<Address>,
) -> Result<(), ReconcileError> {
    let Some(link) = netlink::resolve_link(links, &s.link_name, false) else {
        tracing::debug!(link = %s.link_name, address = %s.address, "link missing");
        return Ok(());
    };
    if let Some(a) = find(addresses, link, s) {
        if matches(a, s) {
            return Ok(());
        }
        tracing::info!(link = %s.link_name, address = %s.address, scope = a.scope,
            flags = a.flags, priority = a.priority, "address differs from its spec, replacing");
        match nl.delete_address(a).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                return Err(ReconcileError::failed(
                    format!("delete address {} from {}", s.address, s.link_name),
                    e,
                ))
            }
        }
    }
    let add = AddressAdd {
        index: link.index,
        address: s.address.addr(),
        prefix_len: s.address.prefix_len(),
        scope: s.scope.number(),
        flags: s.flags.managed().0,
        priority: s.priority,
    };
    match nl.add_address(&add).await {
        Ok(()) => {
            tracing::info!(link = %s.link_name, address = %s.address, "address added");
            if let (true, std::net::IpAddr::V4(ip)) = (s.announce_with_arp, s.address.addr()) {
                // Best effort, as upstream: the address stays whatever the send says.
                match crate::arp::announce(link, ip) {
                    Ok(true) => tracing::info!(link = %s.link_name, %ip, "gratuitous ARP sent"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(link = %s.link_name, %ip, error = %e,
                        "cannot send the gratuitous ARP"),
                }
            }
            Ok(())
        }
        Err(e) if e.is_exists() => Ok(()),
        Err(e) => Err(ReconcileError::failed(
            format!("add address {} to {}", s.address, s.link_name),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::network::{ConfigLayer, Family, Scope};

    #[test]
    fn only_managed_flags_are_compared() {
        let s = AddressSpecSpec {
            address: "10.0.0.2/24".parse().expect("prefix"),
            link_name: "eth0".into(),
            family: Family::Inet4,
            scope: Scope::Global,
            flags: AddressFlags::PERMANENT,
            announce_with_arp: false,
            priority: 0,
            layer: ConfigLayer::Configuration,
        };
        let mut a = Address {
            index: 2,
            address: s.address.addr(),
            prefix_len: 24,
            local: None,
            broadcast: None,
            anycast: None,
            multicast: None,
            scope: 0,
            // permanent + secondary (kernel-set): still a match.
            flags: 0x80 | 0x01,
            priority: 0,
            protocol: 0,
        };
        assert!(matches(&a, &s));
        a.flags = 0x80 | 0x200;
        assert!(!matches(&a, &s), "noprefixroute is managed");
        a.flags = 0x80;
        a.priority = 1024;
        assert!(!matches(&a, &s));
    }
}
