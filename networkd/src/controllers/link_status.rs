//! LinkStatusController: kernel links → LinkStatus (`network`, ID = link name), re-listed on
//! every burst of link events (networking.md §3.6). Vanished links lose their status when the
//! runtime cleans up what the pass did not assert.
//!
//! Not reported (no ethtool/sysfs here): bus path, PCI ID, driver and firmware versions, speed,
//! port, duplex; `linkState` is the kernel's carrier (`IFLA_CARRIER`).

use cosi::{Action, Context, Controller, Input, Output, ReconcileError, Resource};
use machinery::resources::network::{
    BridgeMasterSpec, BridgeVlanSpec, HardwareAddr, LinkFlags, LinkStatusSpec, LinkType,
    OperationalState, StpSpec, VlanProtocol, VlanSpec, NAMESPACE,
};

use crate::netlink::{watch, Kernel, Link};

use super::link_spec::bond_master_spec;

/// The owner name.
pub const NAME: &str = "network.LinkStatusController";

/// Reports kernel links.
#[derive(Debug)]
pub struct LinkStatusController {
    kernel: Kernel,
}

impl Default for LinkStatusController {
    fn default() -> Self {
        Self {
            kernel: Kernel::new(watch::GROUP_LINK),
        }
    }
}

/// The status of one kernel link.
pub(crate) fn status(l: &Link, links: &[Link]) -> LinkStatusSpec {
    LinkStatusSpec {
        alias: l.alias.clone(),
        alt_names: l.alt_names.clone(),
        index: l.index,
        r#type: LinkType(l.link_type),
        link_index: l.parent,
        flags: LinkFlags(l.flags),
        hardware_addr: HardwareAddr(l.hardware_addr.clone()),
        permanent_addr: HardwareAddr(l.permanent_addr.clone()),
        broadcast_addr: HardwareAddr(l.broadcast_addr.clone()),
        mtu: l.mtu,
        queue_disc: l.queue_disc.clone(),
        master_index: l.master,
        operational_state: OperationalState::ALL
            .get(usize::from(l.operstate))
            .copied()
            .unwrap_or_default(),
        kind: l.kind.clone(),
        slave_kind: l.slave_kind.clone(),
        link_state: l.carrier,
        vlan: l
            .vlan
            .map(|v| VlanSpec {
                vid: v.id,
                protocol: VlanProtocol::ALL
                    .iter()
                    .copied()
                    .find(|p| p.ethertype() == v.protocol)
                    .unwrap_or_default(),
            })
            .unwrap_or_default(),
        bridge_master: l
            .bridge
            .map(|b| BridgeMasterSpec {
                stp: StpSpec { enabled: b.stp },
                vlan: BridgeVlanSpec {
                    filtering_enabled: b.vlan_filtering.unwrap_or(false),
                },
            })
            .unwrap_or_default(),
        bond_master: l
            .bond
            .as_ref()
            .map(|b| bond_master_spec(b, links))
            .unwrap_or_default(),
        ..LinkStatusSpec::default()
    }
}

impl Controller for LinkStatusController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<LinkStatusSpec>().cached()]
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
        for l in &links {
            if l.name.is_empty() {
                continue;
            }
            ctx.apply(Resource::new(NAMESPACE, l.name.clone(), status(l, &links)))
                .await?;
        }
        Ok(Action::AwaitChange)
    }
}
