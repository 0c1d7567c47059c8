//! The Merge family: per-layer candidates in `network-config` → one spec per ID in `network`,
//! on cosi's generic layered merge (the highest layer wins; equal layers: the greater ID),
//! with upstream's per-type rules (`GenericMergeController` and the `Merge` functions of
//! `network/*_merge.go`):
//!
//! | type | rule |
//! |---|---|
//! | Address, Route, Operator | the highest layer wins, whole |
//! | Link | field by field: every non-zero field of a higher layer overrides ([`LinkSpecSpec::merge`]) |
//! | Hostname | the highest layer with a hostname; on a tie the first by ID |
//! | TimeServer | the highest layer; candidates of that same layer are concatenated (by ID), NTS only if all ask |
//! | Resolver | by family, see [`merge_resolvers`] |
//!
//! Outputs that lose their last candidate are torn down by the runtime; the Spec controllers'
//! finalizers hold them until the kernel is cleaned (the destroy-ready input wakes the merge
//! to destroy them).

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;

use cosi::generic::{Layered, LayeredMerge, Merge, MergeController};
use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Phase, Resource};
use machinery::resources::network::{
    AddressSpecSpec, ConfigLayer, HostnameSpecSpec, LinkSpecSpec, OperatorSpecSpec,
    ResolverSpecSpec, RouteSpecSpec, TimeServerSpecSpec, CONFIG_NAMESPACE, NAMESPACE, RESOLVER_ID,
};

/// `network.AddressMergeController`.
pub fn address_merge() -> MergeController<LayeredMerge<AddressSpecSpec>> {
    MergeController::new(LayeredMerge::new(
        "network.AddressMergeController",
        CONFIG_NAMESPACE,
        NAMESPACE,
    ))
}

/// `network.RouteMergeController`.
pub fn route_merge() -> MergeController<LayeredMerge<RouteSpecSpec>> {
    MergeController::new(LayeredMerge::new(
        "network.RouteMergeController",
        CONFIG_NAMESPACE,
        NAMESPACE,
    ))
}

/// `network.OperatorMergeController`.
pub fn operator_merge() -> MergeController<LayeredMerge<OperatorSpecSpec>> {
    MergeController::new(LayeredMerge::new(
        "network.OperatorMergeController",
        CONFIG_NAMESPACE,
        NAMESPACE,
    ))
}

/// Links merge field by field.
#[derive(Debug, Default)]
pub struct LinkMerge;

impl Merge for LinkMerge {
    type Spec = LinkSpecSpec;

    fn name(&self) -> &'static str {
        "network.LinkMergeController"
    }

    fn input_namespace(&self) -> &str {
        CONFIG_NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        NAMESPACE
    }

    /// Folding from the top down, `lower ⊕ winner` (non-zero fields of the higher override)
    /// gives the same result as upstream's bottom-up fold, as "last non-zero wins" is
    /// associative.
    fn merge(&self, winner: LinkSpecSpec, lower: &LinkSpecSpec) -> LinkSpecSpec {
        let mut out = lower.clone();
        out.merge(&winner);
        out
    }
}

/// `network.LinkMergeController`.
pub fn link_merge() -> MergeController<LinkMerge> {
    MergeController::new(LinkMerge)
}

/// The hostname of the highest layer that has one; on a tie, the first by ID.
#[derive(Debug, Default)]
pub struct HostnameMerge;

impl Merge for HostnameMerge {
    type Spec = HostnameSpecSpec;

    fn name(&self) -> &'static str {
        "network.HostnameMergeController"
    }

    fn input_namespace(&self) -> &str {
        CONFIG_NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        NAMESPACE
    }

    /// Candidates come from the highest (layer, ID) down: a lower ID of the same layer
    /// replaces the winner (ties keep the first by ID), and an empty winner takes anything.
    fn merge(&self, winner: HostnameSpecSpec, lower: &HostnameSpecSpec) -> HostnameSpecSpec {
        if lower.hostname.is_empty() {
            winner
        } else if winner.hostname.is_empty() || lower.layer == winner.layer {
            lower.clone()
        } else {
            winner
        }
    }
}

/// `network.HostnameMergeController`.
pub fn hostname_merge() -> MergeController<HostnameMerge> {
    MergeController::new(HostnameMerge)
}

/// The servers of the highest layer; candidates of the same layer concatenated.
#[derive(Debug, Default)]
pub struct TimeServerMerge;

impl Merge for TimeServerMerge {
    type Spec = TimeServerSpecSpec;

    fn name(&self) -> &'static str {
        "network.TimeServerMergeController"
    }

    fn input_namespace(&self) -> &str {
        CONFIG_NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        NAMESPACE
    }

    /// Lower IDs of the winning layer come first (prepended, as the fold runs down by ID);
    /// NTS stays on only if every candidate of the layer asks for it.
    fn merge(&self, winner: TimeServerSpecSpec, lower: &TimeServerSpecSpec) -> TimeServerSpecSpec {
        if lower.layer != winner.layer {
            return winner;
        }
        let mut servers = lower.ntp_servers.clone();
        servers.extend(winner.ntp_servers);
        TimeServerSpecSpec {
            ntp_servers: servers,
            use_nts: winner.use_nts && lower.use_nts,
            layer: winner.layer,
        }
    }
}

/// `network.TimeServerMergeController`.
pub fn time_server_merge() -> MergeController<TimeServerMerge> {
    MergeController::new(TimeServerMerge)
}

/// Merges resolver candidates as upstream `ResolverMergeController`, folding up from the
/// lowest layer (by layer, then ID):
///
/// - a candidate of the same layer as the result so far appends its servers and unions its
///   search domains;
/// - the `configuration` layer replaces the servers only if it has any; its search domains
///   replace the list if overridden, else are unioned;
/// - any other higher layer replaces per family: if it has no IPv4 (IPv6) servers, the
///   previous IPv4 (IPv6) servers are kept after its own, so DHCPv4 and DHCPv6 do not clobber
///   each other; its search domains are unioned.
///
/// A union puts new domains first, in order, then the old ones not among them.
pub fn merge_resolvers(candidates: &[&ResolverSpecSpec]) -> Option<ResolverSpecSpec> {
    let mut iter = candidates.iter();
    let mut acc = (*iter.next()?).clone();
    for next in iter {
        if next.layer == acc.layer {
            acc.dns_servers.extend(next.dns_servers.iter().copied());
            acc.search_domains = union(&next.search_domains, &acc.search_domains);
        } else if next.layer == ConfigLayer::Configuration {
            if !next.dns_servers.is_empty() {
                acc.dns_servers.clone_from(&next.dns_servers);
            }
            acc.search_domains = if next.search_domains_overridden {
                next.search_domains.clone()
            } else {
                union(&next.search_domains, &acc.search_domains)
            };
        } else {
            let has = |list: &[IpAddr], v4: bool| list.iter().any(|a| a.is_ipv4() == v4);
            let mut servers = next.dns_servers.clone();
            for v4 in [true, false] {
                if !has(&next.dns_servers, v4) {
                    servers.extend(acc.dns_servers.iter().filter(|a| a.is_ipv4() == v4));
                }
            }
            acc.dns_servers = servers;
            acc.search_domains = union(&next.search_domains, &acc.search_domains);
        }
        acc.layer = next.layer;
        acc.search_domains_overridden |= next.search_domains_overridden;
    }
    Some(acc)
}

fn union(first: &[String], then: &[String]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    first
        .iter()
        .chain(then)
        .filter(|d| seen.insert(d.as_str()))
        .cloned()
        .collect()
}

/// `network.ResolverMergeController`: a controller of its own because the resolver rule
/// folds upward from the lowest layer, which cosi's top-down merge hook cannot express.
#[derive(Debug, Default)]
pub struct ResolverMergeController;

impl ResolverMergeController {
    async fn run(&self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let mut candidates: Vec<Resource<ResolverSpecSpec>> = ctx
            .list::<ResolverSpecSpec>(CONFIG_NAMESPACE)
            .await?
            .into_iter()
            .filter(|c| c.metadata.phase == Phase::Running)
            .collect();
        candidates.sort_by(|a, b| (a.spec.layer(), a.id()).cmp(&(b.spec.layer(), b.id())));
        let specs: Vec<&ResolverSpecSpec> = candidates.iter().map(|c| &c.spec).collect();
        if let Some(merged) = merge_resolvers(&specs) {
            ctx.apply(Resource::new(NAMESPACE, RESOLVER_ID, merged))
                .await?;
        }
        Ok(Action::AwaitChange)
    }
}

impl Controller for ResolverMergeController {
    fn name(&self) -> &'static str {
        "network.ResolverMergeController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<ResolverSpecSpec>(CONFIG_NAMESPACE),
            Input::destroy_ready::<ResolverSpecSpec>(NAMESPACE),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::shared::<ResolverSpecSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cosi::generic::merge_candidates;

    fn resolver(layer: ConfigLayer, servers: &[&str], domains: &[&str]) -> ResolverSpecSpec {
        ResolverSpecSpec {
            dns_servers: servers.iter().map(|s| s.parse().expect("ip")).collect(),
            layer,
            search_domains: domains.iter().map(|d| d.to_string()).collect(),
            search_domains_overridden: false,
        }
    }

    fn servers(r: &ResolverSpecSpec) -> Vec<String> {
        r.dns_servers.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn resolvers_merge_by_family() {
        let default = resolver(
            ConfigLayer::Default,
            &["1.1.1.1", "8.8.8.8"],
            &["example.com"],
        );
        let dhcp4 = resolver(ConfigLayer::Operator, &["10.0.0.53"], &["corp"]);
        let dhcp6 = resolver(ConfigLayer::Operator, &["fd00::53"], &[]);
        let m = merge_resolvers(&[&default, &dhcp4, &dhcp6]).expect("merged");
        assert_eq!(servers(&m), ["10.0.0.53", "fd00::53"], "same layer appends");
        assert_eq!(m.search_domains, ["corp", "example.com"]);

        let v6_only = resolver(ConfigLayer::Platform, &["fd00::1"], &[]);
        let m = merge_resolvers(&[&default, &v6_only]).expect("merged");
        assert_eq!(servers(&m), ["fd00::1", "1.1.1.1", "8.8.8.8"], "IPv4 kept");

        let config = resolver(ConfigLayer::Configuration, &["9.9.9.9"], &[]);
        let m = merge_resolvers(&[&default, &dhcp4, &dhcp6, &config]).expect("merged");
        assert_eq!(servers(&m), ["9.9.9.9"], "configuration replaces");
        let empty_config = resolver(ConfigLayer::Configuration, &[], &["mine"]);
        let m = merge_resolvers(&[&default, &dhcp4, &empty_config]).expect("merged");
        assert_eq!(servers(&m), ["10.0.0.53"], "empty configuration keeps");
        assert_eq!(m.search_domains, ["mine", "corp", "example.com"]);
        let mut overriding = resolver(ConfigLayer::Configuration, &[], &[]);
        overriding.search_domains_overridden = true;
        let m = merge_resolvers(&[&default, &dhcp4, &overriding]).expect("merged");
        assert!(m.search_domains.is_empty(), "explicit empty list clears");
        assert_eq!(merge_resolvers(&[]), None);
    }

    fn res<S: cosi::ResourceSpec>(id: &str, spec: S) -> Resource<S> {
        Resource::new(CONFIG_NAMESPACE, id, spec)
    }

    #[test]
    fn hostname_highest_non_empty_then_first_by_id() {
        let h = |name: &str, layer| HostnameSpecSpec {
            hostname: name.into(),
            domainname: String::new(),
            layer,
        };
        let merged = merge_candidates(
            &HostnameMerge,
            &[
                res("default/hostname", h("talos-1", ConfigLayer::Default)),
                res("dhcp4/eth0/hostname", h("from-eth0", ConfigLayer::Operator)),
                res("dhcp4/eth1/hostname", h("from-eth1", ConfigLayer::Operator)),
                res("cmdline/hostname", h("cmd", ConfigLayer::Cmdline)),
            ],
        );
        assert_eq!(merged["hostname"].hostname, "from-eth0");
        assert_eq!(merged["hostname"].layer, ConfigLayer::Operator);
    }

    #[test]
    fn time_servers_concatenate_within_the_winning_layer() {
        let t = |servers: &[&str], nts, layer| TimeServerSpecSpec {
            ntp_servers: servers.iter().map(|s| s.to_string()).collect(),
            use_nts: nts,
            layer,
        };
        let merged = merge_candidates(
            &TimeServerMerge,
            &[
                res(
                    "default/timeservers",
                    t(&["time.cloudflare.com"], false, ConfigLayer::Default),
                ),
                res(
                    "dhcp4/eth0/timeservers",
                    t(&["10.0.0.1"], true, ConfigLayer::Operator),
                ),
                res(
                    "dhcp4/eth1/timeservers",
                    t(&["10.1.0.1"], false, ConfigLayer::Operator),
                ),
            ],
        );
        let m = &merged["timeservers"];
        assert_eq!(m.ntp_servers, ["10.0.0.1", "10.1.0.1"]);
        assert!(!m.use_nts);
    }

    #[test]
    fn links_merge_field_by_field() {
        let merged = merge_candidates(
            &LinkMerge,
            &[
                res(
                    "default/eth0",
                    LinkSpecSpec {
                        name: "eth0".into(),
                        up: true,
                        layer: ConfigLayer::Default,
                        ..Default::default()
                    },
                ),
                res(
                    "dhcp4/eth0/eth0",
                    LinkSpecSpec {
                        name: "eth0".into(),
                        mtu: 1400,
                        layer: ConfigLayer::Default,
                        ..Default::default()
                    },
                ),
                res(
                    "configuration/eth0",
                    LinkSpecSpec {
                        name: "eth0".into(),
                        mtu: 9000,
                        layer: ConfigLayer::Configuration,
                        ..Default::default()
                    },
                ),
            ],
        );
        let l = &merged["eth0"];
        assert!(l.up);
        assert_eq!(l.mtu, 9000);
        assert_eq!(l.layer, ConfigLayer::Configuration);
    }
}
