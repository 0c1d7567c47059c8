//! `network.ResolverSpecController`: the merged ResolverSpec becomes the ResolverStatus (the
//! resolvers in effect, which `/etc/resolv.conf` is rendered from).

use cosi::generic::{Transform, TransformController};
use cosi::runtime::ReconcileError;
use cosi::Resource;
use machinery::resources::network::{ResolverSpecSpec, ResolverStatusSpec, NAMESPACE, RESOLVER_ID};

/// ResolverSpec `resolvers` → ResolverStatus `resolvers`.
#[derive(Debug, Default)]
pub struct ResolverSpec;

/// `network.ResolverSpecController`.
pub type ResolverSpecController = TransformController<ResolverSpec>;

impl Transform for ResolverSpec {
    type Input = ResolverSpecSpec;
    type Output = ResolverStatusSpec;

    fn name(&self) -> &'static str {
        "network.ResolverSpecController"
    }

    fn input_namespace(&self) -> &str {
        NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        NAMESPACE
    }

    fn map_id(&self, input: &Resource<ResolverSpecSpec>) -> Option<String> {
        (input.id() == RESOLVER_ID).then(|| RESOLVER_ID.to_string())
    }

    fn transform(
        &self,
        input: &Resource<ResolverSpecSpec>,
    ) -> Result<ResolverStatusSpec, ReconcileError> {
        Ok(ResolverStatusSpec {
            dns_servers: input.spec.dns_servers.clone(),
            search_domains: input.spec.search_domains.clone(),
        })
    }
}
