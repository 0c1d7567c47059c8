//! The Config family: machine configuration, kernel command line and defaults → per-layer
//! candidates in `network-config` (`configuration/...`, `cmdline/...`, `default/...`).
//!
//! Every Config controller is a [`ConfigController`] over a [`ConfigPart`] that says which
//! type it writes and how to compute the candidates; the controller reads the shared sources
//! and applies the "invalid configuration changes nothing" rule of [`super::source`].

use std::collections::BTreeMap;
use std::future::Future;
use std::marker::PhantomData;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Resource, ResourceSpec};
use machinery::resources::network::{
    AddressSpecSpec, LinkSpecSpec, LinkStatus, OperatorSpecSpec, RouteSpecSpec, CONFIG_NAMESPACE,
};

use super::cmdline::CmdlineNetwork;
use super::machine_network::MachineNetwork;
use super::plan::{plan, Inputs, Plan};
use super::source::{self, Machine, Sources};

/// What a Config controller derives its candidates from.
#[derive(Debug, Clone, Copy)]
pub struct Derive<'a> {
    /// The machine configuration's network settings, if there is a configuration.
    pub machine: Option<&'a MachineNetwork>,
    /// The kernel command line's network settings.
    pub cmdline: &'a CmdlineNetwork,
    /// The node's links.
    pub links: &'a [LinkStatus],
}

impl Derive<'_> {
    /// The link/address/route/operator plan of these sources.
    pub fn plan(&self) -> Plan {
        plan(Inputs {
            machine: self.machine,
            cmdline: self.cmdline,
            links: self.links,
        })
    }
}

/// One output type of the Config family.
pub trait ConfigPart: Send + Sync + 'static {
    /// The candidate spec.
    type Spec: ResourceSpec;
    /// The controller name.
    const NAME: &'static str;

    /// Inputs beyond the machine configuration, command line and links.
    fn extra_inputs() -> Vec<Input> {
        Vec::new()
    }

    /// The candidates, by ID in `network-config`.
    fn desired<'a>(
        ctx: &'a Context,
        from: Derive<'a>,
    ) -> impl Future<Output = Result<BTreeMap<String, Self::Spec>, ReconcileError>> + Send + 'a;
}

/// A Config controller: writes the candidates of its [`ConfigPart`] to `network-config`.
#[derive(Debug, Default)]
pub struct ConfigController<P> {
    sources: Sources,
    part: PhantomData<fn() -> P>,
}

impl<P: ConfigPart> ConfigController<P> {
    /// A controller with no configuration seen yet.
    pub fn new() -> Self {
        Self {
            sources: Sources::default(),
            part: PhantomData,
        }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let machine = self.sources.machine(ctx).await?;
        let cmdline = self.sources.cmdline(ctx).await?;
        let links = source::links(ctx).await?;
        let machine = match &machine {
            Machine::Keep => {
                source::keep_outputs::<P::Spec>(ctx, CONFIG_NAMESPACE).await?;
                return Ok(Action::AwaitChange);
            }
            Machine::Absent => None,
            Machine::Valid(m) => Some(m.as_ref()),
        };
        let desired = P::desired(
            ctx,
            Derive {
                machine,
                cmdline: &cmdline,
                links: &links,
            },
        )
        .await?;
        ctx.apply_all(
            desired
                .into_iter()
                .map(|(id, spec)| Resource::new(CONFIG_NAMESPACE, id, spec)),
        )
        .await?;
        Ok(Action::AwaitChange)
    }
}

impl<P: ConfigPart> Controller for ConfigController<P> {
    fn name(&self) -> &'static str {
        P::NAME
    }

    fn inputs(&self) -> Vec<Input> {
        let mut inputs = source::inputs();
        inputs.extend(P::extra_inputs());
        inputs
    }

    fn outputs(&self) -> Vec<Output> {
        // Shared: operators write the same types in network-config, merges in network. Kept
        // in memory: the merge of the type reads its candidates there.
        vec![Output::shared::<P::Spec>()
            .in_namespace(CONFIG_NAMESPACE)
            .cached()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

/// LinkSpec candidates: loopback and physical links up, logical links (bond, bridge, VLAN,
/// dummy, WireGuard), MTUs, enslavement.
#[derive(Debug)]
pub struct LinkConfig;

impl ConfigPart for LinkConfig {
    type Spec = LinkSpecSpec;
    const NAME: &'static str = "network.LinkConfigController";

    async fn desired(
        _ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, LinkSpecSpec>, ReconcileError> {
        Ok(from.plan().links)
    }
}

/// AddressSpec candidates: loopback, static addresses, `ip=`.
#[derive(Debug)]
pub struct AddressConfig;

impl ConfigPart for AddressConfig {
    type Spec = AddressSpecSpec;
    const NAME: &'static str = "network.AddressConfigController";

    async fn desired(
        _ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, AddressSpecSpec>, ReconcileError> {
        Ok(from.plan().addresses)
    }
}

/// RouteSpec candidates: static routes, `ip=` gateways.
#[derive(Debug)]
pub struct RouteConfig;

impl ConfigPart for RouteConfig {
    type Spec = RouteSpecSpec;
    const NAME: &'static str = "network.RouteConfigController";

    async fn desired(
        _ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, RouteSpecSpec>, ReconcileError> {
        Ok(from.plan().routes)
    }
}

/// OperatorSpec candidates: DHCP and VIP from the configuration, `ip=...:dhcp`, and default
/// DHCPv4 (see [`super::plan`] for which links get it).
#[derive(Debug)]
pub struct OperatorConfig;

impl ConfigPart for OperatorConfig {
    type Spec = OperatorSpecSpec;
    const NAME: &'static str = "network.OperatorConfigController";

    async fn desired(
        _ctx: &Context,
        from: Derive<'_>,
    ) -> Result<BTreeMap<String, OperatorSpecSpec>, ReconcileError> {
        Ok(from.plan().operators)
    }
}

/// `network.LinkConfigController`.
pub type LinkConfigController = ConfigController<LinkConfig>;
/// `network.AddressConfigController`.
pub type AddressConfigController = ConfigController<AddressConfig>;
/// `network.RouteConfigController`.
pub type RouteConfigController = ConfigController<RouteConfig>;
/// `network.OperatorConfigController`.
pub type OperatorConfigController = ConfigController<OperatorConfig>;
