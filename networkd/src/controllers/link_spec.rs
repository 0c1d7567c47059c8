//! LinkSpecController: merged LinkSpecs (`network`) → kernel links (networking.md §3.4).
//!
//! - Order: specs tearing down first, then the running ones with masters before their slaves
//!   (bond slaves in slave-index order).
//! - Tearing down: a logical link networkd created (marked, see [`crate::netlink`]) is deleted;
//!   anything else is left in place. Then the finalizer goes.
//! - Running: a missing logical link is created (a missing physical link waits); a logical link
//!   whose kind, VLAN ID or protocol differs is replaced, if it is networkd's (a foreign one is
//!   reported and left alone); bond and bridge settings are synced (link down, slaves released,
//!   settings set: they re-enslave and come up on later passes); then up/down, MTU, hardware
//!   address, multicast and master, each only when it differs from the kernel.
//!
//! Every change is preceded by a comparison with the kernel's current value, so a pass over a
//! converged kernel (e.g. after a restart of networkd) changes nothing.

use cosi::{Action, Context, Controller, Input, Output, Phase, ReconcileError};
use machinery::resources::network::{
    AdLacpActive, AdSelect, ArpAllTargets, ArpValidate, BondMasterSpec, BondMode,
    BondXmitHashPolicy, FailOverMac, LacpRate, LinkSpec, LinkSpecSpec, PrimaryReselect, KIND_BOND,
    KIND_BRIDGE, KIND_DUMMY, KIND_VLAN, NAMESPACE,
};

use crate::netlink::{
    self, watch, BondInfo, BridgeInfo, Kernel, Link, LinkChange, LinkCreate, LinkKind, VlanInfo,
};

/// The owner and finalizer name.
pub const NAME: &str = "network.LinkSpecController";

/// Applies LinkSpecs to the kernel.
#[derive(Debug)]
pub struct LinkSpecController {
    kernel: Kernel,
}

impl Default for LinkSpecController {
    fn default() -> Self {
        Self {
            kernel: Kernel::new(watch::GROUP_LINK),
        }
    }
}

impl Controller for LinkSpecController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<LinkSpecSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let nl = self
            .kernel
            .connect(&ctx.waker())
            .map_err(|e| ReconcileError::failed("connect to the kernel", e))?
            .clone();
        let mut specs = ctx.list::<LinkSpecSpec>(NAMESPACE).await?;
        specs.sort_by_key(sort_key);
        let mut links = list(&nl).await?;
        ctx.add_finalizers(&specs, NAME).await?;
        let mut errors = Vec::new();
        for spec in &specs {
            let result = match spec.metadata.phase {
                Phase::TearingDown => teardown(ctx, &nl, spec, &mut links).await,
                Phase::Running => converge(&nl, &spec.spec, &mut links).await,
            };
            if let Err(e) = result {
                errors.push(e);
            }
        }
        aggregate("links", errors)
    }
}

/// Teardowns first, then masters before slaves, bond slaves by index (upstream `SortLinks`).
fn sort_key(spec: &LinkSpec) -> (u8, String, u32, String) {
    let s = &spec.spec;
    let phase = u8::from(spec.metadata.phase == Phase::Running);
    if !s.bond_slave.master_name.is_empty() {
        (
            phase,
            s.bond_slave.master_name.clone(),
            s.bond_slave.slave_index.saturating_add(1),
            s.name.clone(),
        )
    } else if !s.bridge_slave.master_name.is_empty() {
        (phase, s.bridge_slave.master_name.clone(), 1, s.name.clone())
    } else {
        (phase, s.name.clone(), 0, String::new())
    }
}

/// Turns per-object failures into one error for the pass (retried with backoff), as upstream's
/// multierror.
pub(crate) fn aggregate(what: &str, errors: Vec<ReconcileError>) -> Result<Action, ReconcileError> {
    match errors.len() {
        0 => Ok(Action::AwaitChange),
        1 => Err(errors
            .into_iter()
            .next()
            .unwrap_or_else(|| ReconcileError::other(what))),
        n => {
            let all = errors
                .iter()
                .map(|e| cosi::error::Chain(e).to_string())
                .collect::<Vec<_>>()
                .join("; ");
            Err(ReconcileError::other(format!("{n} {what} failed: {all}")))
        }
    }
}

/// Netlink requests a spec controller keeps outstanding at once in a pass. The kernel handles
/// each in `sendto`; having many queued saves a wake-up of the controller and of the
/// connection's task per object, and 32 acknowledgements (a header each, the request too when
/// it failed) fit the socket's receive buffer many times over.
pub(crate) const IN_FLIGHT: usize = 32;

/// Runs a pass's per-object requests with up to [`IN_FLIGHT`] at once; the results in the
/// order they finish. The futures are made by the caller up front: a closure mapping borrowed
/// specs inside the stream's type trips the compiler's `Send` check of the controller's
/// `async fn` (rust-lang/rust#89976).
pub(crate) async fn in_flight<F: std::future::Future>(passes: Vec<F>) -> Vec<F::Output> {
    use futures::StreamExt;
    futures::stream::iter(passes)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await
}

async fn list(nl: &netlink::Netlink) -> Result<Vec<Link>, ReconcileError> {
    nl.links()
        .await
        .map_err(|e| ReconcileError::failed("list links", e))
}

fn kernel_error(context: String) -> impl FnOnce(netlink::Error) -> ReconcileError {
    move |e| ReconcileError::failed(context, e)
}

async fn teardown(
    ctx: &Context,
    nl: &netlink::Netlink,
    spec: &LinkSpec,
    links: &mut Vec<Link>,
) -> Result<(), ReconcileError> {
    let s = &spec.spec;
    if s.logical {
        if let Some(link) = netlink::resolve_link(links, &s.name, true) {
            if link.is_owned() {
                let index = link.index;
                match nl.delete_link(index).await {
                    Ok(()) => tracing::info!(link = %s.name, kind = %s.kind, "link deleted"),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(kernel_error(format!("delete link {}", s.name))(e)),
                }
                *links = list(nl).await?;
            } else {
                tracing::info!(link = %s.name, "link not created by networkd, left in place");
            }
        }
    }
    ctx.remove_finalizer::<LinkSpecSpec>(NAMESPACE, spec.id(), NAME)
        .await
}

/// The kind data a logical spec asks for; `None` for kinds networkd does not create.
fn wanted_kind(s: &LinkSpecSpec, links: &[Link]) -> Option<LinkKind> {
    match s.kind.as_str() {
        KIND_DUMMY => Some(LinkKind::Dummy),
        KIND_VLAN => Some(LinkKind::Vlan(VlanInfo {
            id: s.vlan.vid,
            protocol: s.vlan.protocol.ethertype(),
        })),
        KIND_BOND => Some(LinkKind::Bond(bond_info(&s.bond_master, &s.name, links))),
        KIND_BRIDGE => Some(LinkKind::Bridge(bridge_info(s, None))),
        _ => None,
    }
}

/// Why an existing logical link must be recreated, if it must.
fn replace_reason(s: &LinkSpecSpec, link: &Link) -> Option<String> {
    if link.kind != s.kind {
        return Some(format!("kind {:?} ≠ {:?}", link.kind, s.kind));
    }
    // Compare the type only when the spec sets one, so a spec without it never loops.
    if s.r#type.0 != 0 && link.link_type != s.r#type.0 {
        return Some(format!("type {} ≠ {}", link.link_type, s.r#type.0));
    }
    if s.kind == KIND_VLAN {
        let want = (s.vlan.vid, s.vlan.protocol.ethertype());
        let have = link.vlan.map(|v| (v.id, v.protocol));
        if have != Some(want) {
            return Some(format!("VLAN {have:?} ≠ {want:?}"));
        }
    }
    None
}

async fn converge(
    nl: &netlink::Netlink,
    s: &LinkSpecSpec,
    links: &mut Vec<Link>,
) -> Result<(), ReconcileError> {
    let mut existing = netlink::resolve_link(links, &s.name, s.logical).cloned();

    if s.logical {
        if let Some(link) = &existing {
            if let Some(reason) = replace_reason(s, link) {
                if !link.is_owned() {
                    tracing::warn!(link = %s.name, %reason,
                        "link exists, was not created by networkd and differs from its spec: left alone");
                    return Ok(());
                }
                tracing::info!(link = %s.name, %reason, "replacing link");
                nl.delete_link(link.index)
                    .await
                    .map_err(kernel_error(format!(
                        "delete link {} to replace it",
                        s.name
                    )))?;
                *links = list(nl).await?;
                existing = None;
            }
        }
        if existing.is_none() {
            let Some(kind) = wanted_kind(s, links) else {
                tracing::warn!(link = %s.name, kind = %s.kind, "cannot create links of this kind");
                return Ok(());
            };
            let parent = if s.parent_name.is_empty() {
                None
            } else {
                match netlink::resolve_link(links, &s.parent_name, false) {
                    Some(p) => Some(p.index),
                    // Retried on the parent's link event.
                    None => {
                        tracing::debug!(link = %s.name, parent = %s.parent_name, "parent missing");
                        return Ok(());
                    }
                }
            };
            let created = nl
                .create_link(&LinkCreate {
                    name: s.name.clone(),
                    kind,
                    parent,
                    hardware_addr: s.hardware_address.as_ref().map(|h| h.0.clone()),
                    master: None,
                })
                .await;
            match created {
                Ok(_) => tracing::info!(link = %s.name, kind = %s.kind, "link created"),
                Err(e) if e.is_exists() => {}
                Err(e) => return Err(kernel_error(format!("create link {}", s.name))(e)),
            }
            *links = list(nl).await?;
            existing = netlink::resolve_link(links, &s.name, true).cloned();
        }
    }
    let Some(mut link) = existing else {
        // A physical link that is not there (yet).
        return Ok(());
    };

    if s.logical && sync_kind_settings(nl, s, &link, links).await? {
        *links = list(nl).await?;
        match netlink::resolve_link(links, &s.name, true) {
            Some(l) => link = l.clone(),
            None => return Ok(()),
        }
    }

    let mut change = LinkChange::default();
    if s.up && !link.is_up() {
        change.up = Some(true);
    } else if !s.up && link.is_up() && link.master == 0 && s.logical {
        // Only logical links are brought down by a spec; enslaved links are the master's.
        change.up = Some(false);
    }
    if s.mtu != 0 && link.mtu != s.mtu {
        change.mtu = Some(s.mtu);
    }
    if let Some(hw) = &s.hardware_address {
        if !hw.0.is_empty() && link.hardware_addr != hw.0 {
            change.hardware_addr = Some(hw.0.clone());
        }
    }
    if let Some(m) = s.multicast {
        let has = link.flags & 0x1000 != 0;
        if has != m {
            change.multicast = Some(m);
        }
    }
    if change != LinkChange::default() {
        nl.change_link(link.index, &change)
            .await
            .map_err(kernel_error(format!("change link {}", s.name)))?;
        tracing::info!(link = %s.name, change = ?change, "link changed");
    }

    // Master last: enslaving needs the link down; it comes back up on the next pass.
    let master_name = if !s.bond_slave.master_name.is_empty() {
        Some(s.bond_slave.master_name.as_str())
    } else if !s.bridge_slave.master_name.is_empty() {
        Some(s.bridge_slave.master_name.as_str())
    } else {
        None
    };
    let wanted = match master_name {
        // A master that does not exist yet is skipped: its creation wakes us again.
        Some(m) => netlink::resolve_link(links, m, true).map(|master| master.index),
        None => {
            // Release the link only from a master networkd created.
            let ours = links
                .iter()
                .find(|l| l.index == link.master)
                .is_some_and(Link::is_owned);
            (link.master != 0 && ours).then_some(0)
        }
    };
    if let Some(w) = wanted {
        if w != link.master {
            nl.change_link(
                link.index,
                &LinkChange {
                    up: Some(false),
                    ..LinkChange::default()
                },
            )
            .await
            .map_err(kernel_error(format!(
                "set link {} down to change its master",
                s.name
            )))?;
            nl.change_link(
                link.index,
                &LinkChange {
                    master: Some(w),
                    ..LinkChange::default()
                },
            )
            .await
            .map_err(kernel_error(format!("set the master of link {}", s.name)))?;
            tracing::info!(link = %s.name, master = ?master_name, "link master changed");
        }
    }
    Ok(())
}

/// The bridge settings to send: VLAN filtering only when it is wanted on, or must be turned
/// off (a kernel without VLAN filtering refuses the attribute, even `false`).
fn bridge_info(s: &LinkSpecSpec, have: Option<&BridgeInfo>) -> BridgeInfo {
    let filtering = s.bridge_master.vlan.filtering_enabled;
    let reported_on = have.and_then(|h| h.vlan_filtering).unwrap_or(false);
    BridgeInfo {
        stp: s.bridge_master.stp.enabled,
        vlan_filtering: (filtering || reported_on).then_some(filtering),
    }
}

/// Syncs bond and bridge settings; returns whether it changed the kernel.
async fn sync_kind_settings(
    nl: &netlink::Netlink,
    s: &LinkSpecSpec,
    link: &Link,
    links: &[Link],
) -> Result<bool, ReconcileError> {
    let kind = match (s.kind.as_str(), &link.bond, &link.bridge) {
        (KIND_BOND, Some(have), _) => {
            let want = bond_info(&s.bond_master, &s.name, links);
            let primary_drift = primary_drifted(&want, have, link, links);
            if bond_canonical(&want) == bond_canonical(have) && !primary_drift {
                return Ok(false);
            }
            LinkKind::Bond(want)
        }
        (KIND_BRIDGE, _, Some(have)) => {
            let want = bridge_info(s, Some(have));
            if want.stp == have.stp
                && s.bridge_master.vlan.filtering_enabled == have.vlan_filtering.unwrap_or(false)
            {
                return Ok(false);
            }
            LinkKind::Bridge(want)
        }
        _ => return Ok(false),
    };
    // As upstream: down, release every slave, set; slaves re-enslave on later passes.
    let err = |what: &str| kernel_error(format!("{what} of link {}", s.name));
    nl.change_link(
        link.index,
        &LinkChange {
            up: Some(false),
            ..LinkChange::default()
        },
    )
    .await
    .map_err(err("set down to update the settings"))?;
    for slave in links.iter().filter(|l| l.master == link.index) {
        nl.change_link(
            slave.index,
            &LinkChange {
                master: Some(0),
                ..LinkChange::default()
            },
        )
        .await
        .map_err(err("release a slave to update the settings"))?;
    }
    nl.change_link_kind(link.index, &kind)
        .await
        .map_err(err("update the settings"))?;
    tracing::info!(link = %s.name, kind = %s.kind, "updated link settings");
    Ok(true)
}

/// Whether the bond's primary differs from the spec's: only when the wanted primary exists, is
/// enslaved to this bond, and the kernel reports another (a kernel without one is no drift: it
/// drops the primary when that slave goes away, upstream #13969).
fn primary_drifted(want: &BondInfo, have: &BondInfo, bond: &Link, links: &[Link]) -> bool {
    let Some(p) = want.primary else { return false };
    let enslaved = links.iter().any(|l| l.index == p && l.master == bond.index);
    enslaved && have.primary.is_some_and(|h| h != p)
}

/// The bond settings that are compared: what is encoded for the mode (networking.md §3.4), with
/// upstream's lenient rules (primary compared separately; no LACP-active means on).
fn bond_canonical(b: &BondInfo) -> BondInfo {
    let lacp = b.mode == BondMode::Lacp.number();
    let tlb_alb = matches!(b.mode, 5 | 6);
    let lacp_like = b.is_lacp_or_tlb();
    BondInfo {
        mode: b.mode,
        xmit_hash_policy: b.xmit_hash_policy,
        arp_all_targets: b.arp_all_targets,
        primary_reselect: b.primary_reselect,
        fail_over_mac: b.fail_over_mac,
        ad_select: b.ad_select,
        miimon: b.miimon,
        resend_igmp: b.resend_igmp,
        min_links: b.min_links,
        lp_interval: b.lp_interval,
        num_peer_notif: b.num_peer_notif,
        all_slaves_active: b.all_slaves_active,
        use_carrier: b.use_carrier,
        lacp_rate: if lacp { b.lacp_rate } else { 0 },
        ad_lacp_active: if lacp {
            Some(b.ad_lacp_active.unwrap_or(true))
        } else {
            None
        },
        ad_actor_sys_prio: if lacp { b.ad_actor_sys_prio } else { 0 },
        ad_user_port_key: if lacp { b.ad_user_port_key } else { 0 },
        arp_validate: if lacp_like { 0 } else { b.arp_validate },
        arp_interval: if lacp_like { 0 } else { b.arp_interval },
        arp_ip_targets: if lacp_like {
            Vec::new()
        } else {
            b.arp_ip_targets.clone()
        },
        ns_ip6_targets: if lacp_like {
            Vec::new()
        } else {
            b.ns_ip6_targets.clone()
        },
        updelay: if b.miimon != 0 { b.updelay } else { 0 },
        downdelay: if b.miimon != 0 { b.downdelay } else { 0 },
        peer_notify_delay: if b.miimon != 0 {
            b.peer_notify_delay
        } else {
            0
        },
        packets_per_slave: if b.mode == 0 { b.packets_per_slave } else { 0 },
        tlb_dynamic_lb: if tlb_alb { b.tlb_dynamic_lb } else { 0 },
        missed_max: if lacp_like { 0 } else { b.missed_max },
        primary: None,
    }
}

/// The position of `v` in an enum's declaration order, which for the bond enums is the kernel's
/// numbering.
fn number<T: PartialEq>(all: &[T], v: &T) -> u8 {
    all.iter()
        .position(|x| x == v)
        .and_then(|p| u8::try_from(p).ok())
        .unwrap_or(0)
}

/// The kernel settings of a bond spec; the primary is resolved by name against the live links.
pub(crate) fn bond_info(b: &BondMasterSpec, _bond: &str, links: &[Link]) -> BondInfo {
    let primary = if b.primary.is_empty() {
        b.primary_index
    } else {
        netlink::resolve_link(links, &b.primary, false).map(|l| l.index)
    };
    BondInfo {
        mode: b.mode.number(),
        xmit_hash_policy: number(BondXmitHashPolicy::ALL, &b.xmit_hash_policy),
        lacp_rate: number(LacpRate::ALL, &b.lacp_rate),
        arp_validate: u32::from(number(ArpValidate::ALL, &b.arp_validate)),
        arp_all_targets: u32::from(number(ArpAllTargets::ALL, &b.arp_all_targets)),
        primary,
        primary_reselect: number(PrimaryReselect::ALL, &b.primary_reselect),
        fail_over_mac: number(FailOverMac::ALL, &b.fail_over_mac),
        ad_select: number(AdSelect::ALL, &b.ad_select),
        miimon: b.miimon,
        updelay: b.updelay,
        downdelay: b.downdelay,
        arp_interval: b.arp_interval,
        resend_igmp: b.resend_igmp,
        min_links: b.min_links,
        lp_interval: b.lp_interval,
        packets_per_slave: b.packets_per_slave,
        num_peer_notif: b.num_peer_notif,
        tlb_dynamic_lb: b.tlb_dynamic_lb,
        all_slaves_active: b.all_slaves_active,
        use_carrier: b.use_carrier,
        ad_actor_sys_prio: b.ad_actor_sys_prio,
        ad_user_port_key: b.ad_user_port_key,
        peer_notify_delay: b.peer_notify_delay,
        ad_lacp_active: b.ad_lacp_active.map(|a| a == AdLacpActive::On),
        missed_max: b.missed_max,
        arp_ip_targets: b
            .arp_ip_targets
            .iter()
            .filter_map(|a| match a {
                std::net::IpAddr::V4(v4) => Some(*v4),
                std::net::IpAddr::V6(_) => None,
            })
            .collect(),
        ns_ip6_targets: b
            .ns_ip6_targets
            .iter()
            .filter_map(|a| match a {
                std::net::IpAddr::V6(v6) => Some(*v6),
                std::net::IpAddr::V4(_) => None,
            })
            .collect(),
    }
}

/// The spec form of kernel bond settings (for LinkStatus).
pub(crate) fn bond_master_spec(b: &BondInfo, links: &[Link]) -> BondMasterSpec {
    fn pick<T: Copy + Default>(all: &[T], n: u32) -> T {
        usize::try_from(n)
            .ok()
            .and_then(|i| all.get(i).copied())
            .unwrap_or_default()
    }
    BondMasterSpec {
        mode: pick(BondMode::ALL, u32::from(b.mode)),
        xmit_hash_policy: pick(BondXmitHashPolicy::ALL, u32::from(b.xmit_hash_policy)),
        lacp_rate: pick(LacpRate::ALL, u32::from(b.lacp_rate)),
        arp_validate: pick(ArpValidate::ALL, b.arp_validate),
        arp_all_targets: pick(ArpAllTargets::ALL, b.arp_all_targets),
        primary: b
            .primary
            .and_then(|p| links.iter().find(|l| l.index == p))
            .map(|l| l.name.clone())
            .unwrap_or_default(),
        primary_index: b.primary,
        primary_reselect: pick(PrimaryReselect::ALL, u32::from(b.primary_reselect)),
        fail_over_mac: pick(FailOverMac::ALL, u32::from(b.fail_over_mac)),
        ad_select: pick(AdSelect::ALL, u32::from(b.ad_select)),
        miimon: b.miimon,
        updelay: b.updelay,
        downdelay: b.downdelay,
        arp_interval: b.arp_interval,
        resend_igmp: b.resend_igmp,
        min_links: b.min_links,
        lp_interval: b.lp_interval,
        packets_per_slave: b.packets_per_slave,
        num_peer_notif: b.num_peer_notif,
        tlb_dynamic_lb: b.tlb_dynamic_lb,
        all_slaves_active: b.all_slaves_active,
        use_carrier: b.use_carrier,
        ad_actor_sys_prio: b.ad_actor_sys_prio,
        ad_user_port_key: b.ad_user_port_key,
        peer_notify_delay: b.peer_notify_delay,
        arp_ip_targets: b.arp_ip_targets.iter().map(|a| (*a).into()).collect(),
        ns_ip6_targets: b.ns_ip6_targets.iter().map(|a| (*a).into()).collect(),
        ad_lacp_active: b.ad_lacp_active.map(|a| {
            if a {
                AdLacpActive::On
            } else {
                AdLacpActive::Off
            }
        }),
        missed_max: b.missed_max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::network::{ConfigLayer, LinkSpecSpec};

    fn spec(name: &str, phase: Phase) -> LinkSpec {
        let mut r = LinkSpec::new(
            NAMESPACE,
            name,
            LinkSpecSpec {
                name: name.into(),
                layer: ConfigLayer::Configuration,
                ..LinkSpecSpec::default()
            },
        );
        r.metadata.phase = phase;
        r
    }

    #[test]
    fn masters_before_slaves_and_teardown_first() {
        let mut slave1 = spec("eth1", Phase::Running);
        slave1.spec.bond_slave.master_name = "bond0".into();
        slave1.spec.bond_slave.slave_index = 1;
        let mut slave0 = spec("eth0", Phase::Running);
        slave0.spec.bond_slave.master_name = "bond0".into();
        let mut specs = [
            slave1,
            spec("bond0", Phase::Running),
            spec("zz", Phase::TearingDown),
            slave0,
            spec("a", Phase::Running),
        ];
        specs.sort_by_key(sort_key);
        let names: Vec<_> = specs.iter().map(|s| s.spec.name.as_str()).collect();
        assert_eq!(names, ["zz", "a", "bond0", "eth0", "eth1"]);
    }

    #[test]
    fn bond_settings_round_trip_without_drift() {
        let mut spec = BondMasterSpec {
            mode: BondMode::ActiveBackup,
            miimon: 100,
            updelay: 200,
            ..BondMasterSpec::default()
        };
        spec.fill_defaults();
        let kernel = bond_info(&spec, "bond0", &[]);
        let back = bond_master_spec(&kernel, &[]);
        assert_eq!(bond_info(&back, "bond0", &[]), kernel);
        // What the kernel reports beyond what the mode uses is not drift.
        let mut reported = kernel.clone();
        reported.ad_actor_sys_prio = 65535;
        reported.lacp_rate = 1;
        assert_eq!(bond_canonical(&reported), bond_canonical(&kernel));
        reported.miimon = 50;
        assert_ne!(bond_canonical(&reported), bond_canonical(&kernel));
    }

    #[test]
    fn vlan_replacement() {
        let mut s = spec("eth0.10", Phase::Running).spec;
        s.kind = KIND_VLAN.into();
        s.vlan.vid = 10;
        let mut link = Link {
            name: "eth0.10".into(),
            kind: "vlan".into(),
            vlan: Some(VlanInfo {
                id: 10,
                protocol: 0x8100,
            }),
            ..Link::default()
        };
        assert_eq!(replace_reason(&s, &link), None);
        link.vlan = Some(VlanInfo {
            id: 11,
            protocol: 0x8100,
        });
        assert!(replace_reason(&s, &link).is_some());
        link.kind = "dummy".into();
        assert!(replace_reason(&s, &link).is_some());
    }
}
