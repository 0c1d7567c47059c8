//! `k8s.AddressFilterController` (upstream's name; here in networkd, which writes the
//! `network` namespace): NodeAddressFilters `no-k8s` (everything but the pod and service
//! networks) and `only-k8s` (only them), from `cluster.network`.

use std::future::Future;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::network::{
    NodeAddressFilterSpec, FILTER_NO_K8S, FILTER_ONLY_K8S, NAMESPACE,
};

use super::source::{self, Machine, Sources};

/// `k8s.AddressFilterController`.
#[derive(Debug, Default)]
pub struct AddressFilterController {
    sources: Sources,
}

impl AddressFilterController {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let m = match self.sources.machine(ctx).await? {
            Machine::Absent => return Ok(Action::AwaitChange),
            Machine::Keep => {
                source::keep_outputs::<NodeAddressFilterSpec>(ctx, NAMESPACE).await?;
                return Ok(Action::AwaitChange);
            }
            Machine::Valid(m) => m,
        };
        let k8s: Vec<_> = m
            .pod_subnets
            .iter()
            .chain(&m.service_subnets)
            .copied()
            .collect();
        ctx.apply(Resource::new(
            NAMESPACE,
            FILTER_NO_K8S,
            NodeAddressFilterSpec {
                include_subnets: Vec::new(),
                exclude_subnets: k8s.clone(),
            },
        ))
        .await?;
        ctx.apply(Resource::new(
            NAMESPACE,
            FILTER_ONLY_K8S,
            NodeAddressFilterSpec {
                include_subnets: k8s,
                exclude_subnets: Vec::new(),
            },
        ))
        .await?;
        Ok(Action::AwaitChange)
    }
}

impl Controller for AddressFilterController {
    fn name(&self) -> &'static str {
        "k8s.AddressFilterController"
    }

    fn inputs(&self) -> Vec<Input> {
        source::inputs()
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<NodeAddressFilterSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}
