//! `network.NodeAddressController`: AddressStatus + LinkStatus → the node's address sets
//! `default`, `current`, `routed`, `accumulative`, and each again per NodeAddressFilter
//! (`current-no-k8s`, `routed-only-k8s` ...), as upstream `node_address.go`.
//!
//! - Candidates: global or site scope, not loopback, multicast or link-local.
//! - `current`: candidates on links that are up (operstate up or unknown; a physical link also
//!   needs carrier), sorted by the sort algorithm, without duplicates.
//! - `routed`: `current` without SideroLink ULAs (`fdXX:...` whose 7th byte is 3).
//! - `default`: sticky; it keeps its address while that address is current, otherwise it is the
//!   first current address by link name, then sort order. With no current address it stays.
//! - `accumulative`: every current address ever seen; it never shrinks (it is read back from
//!   stated, so it survives a networkd restart, where upstream's lives with the process).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::future::Future;

use cosi::runtime::{Action, Context, Controller, Input, Mirror, Output, ReconcileError};
use cosi::{Phase, Resource};
use ipnet::IpNet;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE as CONFIG_NS};
use machinery::resources::network::{
    filtered_node_address_id, AddressStatusSpec, LinkStatusSpec, NodeAddressFilterSpec,
    NodeAddressSortAlgorithm, NodeAddressSpec, Scope, NAMESPACE, NODE_ADDRESS_ACCUMULATIVE_ID,
    NODE_ADDRESS_CURRENT_ID, NODE_ADDRESS_DEFAULT_ID, NODE_ADDRESS_ROUTED_ID,
};

/// `network.NodeAddressController`.
#[derive(Debug, Default)]
pub struct NodeAddressController {
    algorithm: super::source::FromConfig<NodeAddressSortAlgorithm>,
    /// The AddressStatuses, decoded; each cycle decodes only what changed (thousands of
    /// addresses are not decoded again at every wake-up).
    addresses: Mirror<AddressStatusSpec>,
    /// The LinkStatuses, likewise.
    links: Mirror<LinkStatusSpec>,
}

/// Whether an address may be a node address.
pub fn is_candidate(a: &AddressStatusSpec) -> bool {
    let ip = a.address.addr();
    let link_local = match ip {
        std::net::IpAddr::V4(v4) => v4.is_link_local(),
        std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    matches!(a.scope, Scope::Global | Scope::Site)
        && !ip.is_loopback()
        && !ip.is_multicast()
        && !link_local
}

/// Orders node addresses by an algorithm.
///
/// v1: by address, then prefix length. v2: IPv4 first, then by network, the longer (more
/// specific) prefix first, then by address; a total order approximating upstream's
/// "contained prefixes first".
pub fn compare(alg: NodeAddressSortAlgorithm, a: &IpNet, b: &IpNet) -> Ordering {
    match alg {
        NodeAddressSortAlgorithm::V1 => (a.addr(), a.prefix_len()).cmp(&(b.addr(), b.prefix_len())),
        NodeAddressSortAlgorithm::V2 => (a.addr().is_ipv6(), a.network())
            .cmp(&(b.addr().is_ipv6(), b.network()))
            .then_with(|| b.prefix_len().cmp(&a.prefix_len()))
            .then_with(|| a.addr().cmp(&b.addr())),
    }
}

fn sorted(alg: NodeAddressSortAlgorithm, mut list: Vec<IpNet>) -> Vec<IpNet> {
    list.sort_by(|a, b| compare(alg, a, b));
    list.dedup();
    list
}

/// A SideroLink ULA: `fd` + 40-bit global ID from the cluster, byte 7 = purpose 3.
fn is_siderolink(net: &IpNet) -> bool {
    match net.addr() {
        std::net::IpAddr::V6(v6) => {
            let o = v6.octets();
            o[0] == 0xfd && o[7] == 3
        }
        std::net::IpAddr::V4(_) => false,
    }
}

/// The address sets, by ID, from the candidates and the previous `default`/`accumulative`.
pub fn compute<'a>(
    alg: NodeAddressSortAlgorithm,
    addresses: impl IntoIterator<Item = &'a AddressStatusSpec>,
    links: &BTreeMap<String, LinkStatusSpec>,
    previous_default: Option<&NodeAddressSpec>,
    previous_accumulative: Option<&NodeAddressSpec>,
) -> BTreeMap<String, NodeAddressSpec> {
    let up = |name: &str| {
        links
            .get(name)
            .is_some_and(|l| l.oper_up() && (!l.physical() || l.link_state))
    };
    let mut on_up: Vec<(&str, IpNet)> = addresses
        .into_iter()
        .filter(|a| is_candidate(a) && up(&a.link_name))
        .map(|a| (a.link_name.as_str(), a.address))
        .collect();
    on_up.sort_by(|(la, a), (lb, b)| la.cmp(lb).then_with(|| compare(alg, a, b)));
    let current = sorted(alg, on_up.iter().map(|(_, a)| *a).collect());
    let routed: Vec<IpNet> = current
        .iter()
        .filter(|a| !is_siderolink(a))
        .copied()
        .collect();

    let default = match previous_default {
        Some(prev)
            if prev.sort_algorithm == alg
                && prev.addresses.iter().all(|a| current.contains(a))
                && !prev.addresses.is_empty() =>
        {
            Some(prev.addresses.clone())
        }
        prev => on_up
            .first()
            .map(|(_, a)| vec![*a])
            .or_else(|| prev.map(|p| p.addresses.clone())),
    };
    let mut accumulative = previous_accumulative
        .map(|p| p.addresses.clone())
        .unwrap_or_default();
    accumulative.extend(current.iter().copied());
    let accumulative = sorted(alg, accumulative);

    let spec = |addresses: Vec<IpNet>| NodeAddressSpec {
        addresses,
        sort_algorithm: alg,
    };
    let mut out = BTreeMap::new();
    if let Some(d) = default {
        out.insert(NODE_ADDRESS_DEFAULT_ID.to_string(), spec(d));
    }
    out.insert(NODE_ADDRESS_CURRENT_ID.to_string(), spec(current));
    out.insert(NODE_ADDRESS_ROUTED_ID.to_string(), spec(routed));
    out.insert(NODE_ADDRESS_ACCUMULATIVE_ID.to_string(), spec(accumulative));
    out
}

/// The filtered sets for one filter: `current-<f>`, `routed-<f>`, `accumulative-<f>`.
pub fn filtered(
    sets: &BTreeMap<String, NodeAddressSpec>,
    filter_id: &str,
    filter: &NodeAddressFilterSpec,
) -> Vec<(String, NodeAddressSpec)> {
    [
        NODE_ADDRESS_CURRENT_ID,
        NODE_ADDRESS_ROUTED_ID,
        NODE_ADDRESS_ACCUMULATIVE_ID,
    ]
    .iter()
    .filter_map(|kind| {
        let set = sets.get(*kind)?;
        Some((
            filtered_node_address_id(kind, filter_id),
            NodeAddressSpec {
                addresses: set
                    .addresses
                    .iter()
                    .filter(|a| filter.matches(a))
                    .copied()
                    .collect(),
                sort_algorithm: set.sort_algorithm,
            },
        ))
    })
    .collect()
}

impl NodeAddressController {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let algorithm = *self
            .algorithm
            .get(ctx, |yaml, previous| {
                match &super::source::parsed(yaml).config {
                    Ok(config) => config
                        .machine()
                        .and_then(|m| m.features.as_ref())
                        .and_then(|f| f.node_address_sort_algorithm.as_deref())
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_default(),
                    // An undecodable configuration keeps the algorithm in use.
                    Err(_) => *previous,
                }
            })
            .await?;
        let running = |phase: Phase| phase == Phase::Running;
        ctx.refresh(NAMESPACE, &mut self.addresses).await?;
        ctx.refresh(NAMESPACE, &mut self.links).await?;
        let addresses = self
            .addresses
            .iter()
            .filter(|r| running(r.metadata.phase))
            .map(|r| &r.spec);
        let links: BTreeMap<String, LinkStatusSpec> = self
            .links
            .iter()
            .filter(|r| running(r.metadata.phase))
            .map(|r| (r.metadata.id.clone(), r.spec.clone()))
            .collect();
        let previous_default = ctx
            .get::<NodeAddressSpec>(NAMESPACE, NODE_ADDRESS_DEFAULT_ID)
            .await?;
        let previous_accumulative = ctx
            .get::<NodeAddressSpec>(NAMESPACE, NODE_ADDRESS_ACCUMULATIVE_ID)
            .await?;
        let sets = compute(
            algorithm,
            addresses,
            &links,
            previous_default.as_ref().map(|r| &r.spec),
            previous_accumulative.as_ref().map(|r| &r.spec),
        );
        let filters = ctx.list::<NodeAddressFilterSpec>(NAMESPACE).await?;
        let mut all: Vec<(String, NodeAddressSpec)> = Vec::new();
        for f in filters.iter().filter(|f| running(f.metadata.phase)) {
            all.extend(filtered(&sets, f.id(), &f.spec));
        }
        all.extend(sets);
        for (id, spec) in all {
            ctx.apply(Resource::new(NAMESPACE, id, spec)).await?;
        }
        Ok(Action::AwaitChange)
    }
}

impl Controller for NodeAddressController {
    fn name(&self) -> &'static str {
        "network.NodeAddressController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<AddressStatusSpec>(NAMESPACE),
            Input::weak::<LinkStatusSpec>(NAMESPACE),
            Input::weak::<NodeAddressFilterSpec>(NAMESPACE),
            Input::weak::<MachineConfigSpec>(CONFIG_NS).with_id(ACTIVE_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<NodeAddressSpec>()]
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
    use machinery::resources::network::{Family, LinkType, OperationalState};

    fn net(s: &str) -> IpNet {
        s.parse().expect("prefix")
    }

    #[test]
    fn v2_puts_ipv4_and_specific_prefixes_first() {
        let mut list = [
            net("fd00::1/64"),
            net("10.0.0.5/8"),
            net("10.0.0.2/24"),
            net("10.0.0.2/16"),
        ];
        list.sort_by(|a, b| compare(NodeAddressSortAlgorithm::V2, a, b));
        assert_eq!(
            list.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.0.0.2/24", "10.0.0.2/16", "10.0.0.5/8", "fd00::1/64"]
        );
        list.sort_by(|a, b| compare(NodeAddressSortAlgorithm::V1, a, b));
        assert_eq!(list[0], net("10.0.0.2/16"));
    }

    #[test]
    fn sets_and_stickiness() {
        let addr = |link: &str, a: &str, scope| AddressStatusSpec {
            address: net(a),
            local: None,
            broadcast: None,
            anycast: None,
            multicast: None,
            link_index: 0,
            link_name: link.into(),
            family: Family::of(&net(a).addr()),
            scope,
            flags: Default::default(),
            priority: 0,
        };
        let link = |state, carrier| LinkStatusSpec {
            r#type: LinkType::ETHER,
            operational_state: state,
            link_state: carrier,
            ..Default::default()
        };
        let mut links = BTreeMap::new();
        links.insert("eth0".to_string(), link(OperationalState::Up, true));
        links.insert("eth1".to_string(), link(OperationalState::Up, false));
        let addresses = vec![
            addr("eth0", "10.0.0.9/24", Scope::Global),
            addr("eth0", "10.0.0.2/24", Scope::Global),
            addr("eth0", "fe80::1/64", Scope::Link),
            addr("eth1", "10.1.0.2/24", Scope::Global),
            addr("lo", "127.0.0.1/8", Scope::Host),
        ];
        let alg = NodeAddressSortAlgorithm::V1;
        let sets = compute(alg, &addresses, &links, None, None);
        assert_eq!(
            sets["current"].addresses,
            [net("10.0.0.2/24"), net("10.0.0.9/24")],
            "no carrier on eth1"
        );
        assert_eq!(sets["default"].addresses, [net("10.0.0.2/24")]);

        let sticky = NodeAddressSpec {
            addresses: vec![net("10.0.0.9/24")],
            sort_algorithm: alg,
        };
        let sets = compute(alg, &addresses, &links, Some(&sticky), Some(&sticky));
        assert_eq!(
            sets["default"].addresses,
            [net("10.0.0.9/24")],
            "default is sticky"
        );

        let gone = compute(
            alg,
            &addresses[1..2],
            &links,
            Some(&sticky),
            Some(&sets["accumulative"]),
        );
        assert_eq!(gone["default"].addresses, [net("10.0.0.2/24")]);
        assert_eq!(
            gone["accumulative"].addresses,
            [net("10.0.0.2/24"), net("10.0.0.9/24")],
            "never shrinks"
        );

        let filter = NodeAddressFilterSpec {
            include_subnets: vec![],
            exclude_subnets: vec![net("10.0.0.9/32")],
        };
        let f = filtered(&sets, "no-k8s", &filter);
        assert_eq!(f[0].0, "current-no-k8s");
        assert_eq!(f[0].1.addresses, [net("10.0.0.2/24")]);
    }
}
