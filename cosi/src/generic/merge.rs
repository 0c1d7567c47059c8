//! The layered merge controller: candidates of one type, each from a configuration layer
//! (defaults, platform, DHCP, machine config, operator …), become one resource per merge key.
//! The highest layer wins; a hook may fold lower layers into the winner field by field.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use crate::resource::{Phase, Resource, ResourceSpec};
use crate::runtime::{
    Action, Context, Controller, Input, Mirror, Output, OutputKind, ReconcileError,
};

/// A spec that is a candidate from a layer.
pub trait Layered: ResourceSpec {
    /// The layer order: a higher layer overrides a lower one.
    type Layer: Ord;

    /// The layer this candidate comes from.
    fn layer(&self) -> Self::Layer;

    /// What candidates compete for: the ID of the merged resource (e.g. `eth0/10.0.0.2/24`).
    fn merge_key(&self) -> String;
}

/// A merge of [`Layered`] candidates from one namespace into winners in another.
pub trait Merge: Send + Sync + 'static {
    /// The spec of candidates and winners.
    type Spec: Layered;

    /// The controller name (owner of the merged resources).
    fn name(&self) -> &'static str;

    /// Where the candidates live.
    fn input_namespace(&self) -> &str;

    /// Where the merged resources are written.
    fn output_namespace(&self) -> &str;

    /// Folds a lower-layer candidate into the current result; called from the next-highest
    /// layer down. The default keeps the winner as it is.
    fn merge(&self, winner: Self::Spec, lower: &Self::Spec) -> Self::Spec {
        let _ = lower;
        winner
    }

    /// Whether other controllers write the type too. Default shared: candidates of the same
    /// type are usually written by the config controllers.
    fn output_kind(&self) -> OutputKind {
        OutputKind::Shared
    }
}

/// A candidate with what orders it: layer, then ID.
type Ranked<'a, S> = (<S as Layered>::Layer, &'a str, &'a S);

/// Merges running candidates into one spec per merge key: the candidate of the highest layer
/// wins (between equal layers, the one with the greater ID), then [`Merge::merge`] folds in the
/// others from the highest remaining down.
pub fn merge_candidates<'a, M: Merge>(
    merge: &M,
    candidates: impl IntoIterator<Item = &'a Resource<M::Spec>>,
) -> BTreeMap<String, M::Spec> {
    let mut groups: BTreeMap<String, Vec<Ranked<'a, M::Spec>>> = BTreeMap::new();
    for c in candidates
        .into_iter()
        .filter(|c| c.metadata.phase == Phase::Running)
    {
        groups.entry(c.spec.merge_key()).or_default().push((
            c.spec.layer(),
            c.metadata.id.as_str(),
            &c.spec,
        ));
    }
    groups
        .into_iter()
        .filter_map(|(key, mut group)| {
            group.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            let (_, _, winner) = group.pop()?;
            let merged = group
                .iter()
                .rev()
                .fold(winner.clone(), |acc, (_, _, lower)| merge.merge(acc, lower));
            Some((key, merged))
        })
        .collect()
}

/// The controller that runs a [`Merge`]. Inputs: a weak input on the candidates, a
/// destroy-ready input on its own outputs. Output: the type in the output namespace, kept in
/// the runtime's memory.
#[derive(Debug)]
pub struct MergeController<M: Merge> {
    merge: M,
    /// The candidates, decoded once per version.
    candidates: Mirror<M::Spec>,
}

impl<M: Merge> MergeController<M> {
    /// A controller running `merge`.
    pub fn new(merge: M) -> Self {
        Self {
            merge,
            candidates: Mirror::default(),
        }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let m = &self.merge;
        ctx.refresh(m.input_namespace(), &mut self.candidates)
            .await?;
        ctx.apply_all(
            merge_candidates(m, self.candidates.iter())
                .into_iter()
                .map(|(id, spec)| Resource::new(m.output_namespace(), id, spec)),
        )
        .await?;
        Ok(Action::AwaitChange)
    }
}

impl<M: Merge> Controller for MergeController<M> {
    fn name(&self) -> &'static str {
        self.merge.name()
    }

    fn inputs(&self) -> Vec<Input> {
        let m = &self.merge;
        let mut inputs = vec![Input::weak::<M::Spec>(m.input_namespace())];
        if m.input_namespace() != m.output_namespace() {
            inputs.push(Input::destroy_ready::<M::Spec>(m.output_namespace()));
        }
        inputs
    }

    /// Cached ([`Output::cached`]): the merged kind is kept in memory, so a cycle compares
    /// with it instead of listing it, and the spec controller applying it (a strong input in
    /// the same runtime) reads it there instead of listing every spec at every pass.
    fn outputs(&self) -> Vec<Output> {
        vec![Output::new(
            self.merge.output_namespace(),
            <M::Spec as ResourceSpec>::TYPE,
            self.merge.output_kind(),
        )
        .cached()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

/// A [`Merge`] with the default hook (the winner is taken whole), for types that need no
/// field-by-field merge.
pub struct LayeredMerge<S> {
    name: &'static str,
    input_namespace: String,
    output_namespace: String,
    spec: PhantomData<fn() -> S>,
}

impl<S> std::fmt::Debug for LayeredMerge<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayeredMerge")
            .field("name", &self.name)
            .field("input_namespace", &self.input_namespace)
            .field("output_namespace", &self.output_namespace)
            .finish()
    }
}

impl<S: Layered> LayeredMerge<S> {
    /// A merge named `name` of candidates in `input_namespace` into `output_namespace`.
    pub fn new(
        name: &'static str,
        input_namespace: impl Into<String>,
        output_namespace: impl Into<String>,
    ) -> Self {
        Self {
            name,
            input_namespace: input_namespace.into(),
            output_namespace: output_namespace.into(),
            spec: PhantomData,
        }
    }
}

impl<S: Layered> Merge for LayeredMerge<S> {
    type Spec = S;

    fn name(&self) -> &'static str {
        self.name
    }

    fn input_namespace(&self) -> &str {
        &self.input_namespace
    }

    fn output_namespace(&self) -> &str {
        &self.output_namespace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Route {
        dest: String,
        layer: u8,
        gateway: Option<String>,
        metric: Option<u32>,
    }

    impl ResourceSpec for Route {
        const TYPE: &'static str = "Routes.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "config";
    }

    impl Layered for Route {
        type Layer = u8;
        fn layer(&self) -> u8 {
            self.layer
        }
        fn merge_key(&self) -> String {
            self.dest.clone()
        }
    }

    fn cand(
        id: &str,
        dest: &str,
        layer: u8,
        gw: Option<&str>,
        metric: Option<u32>,
    ) -> Resource<Route> {
        Resource::new(
            "config",
            id,
            Route {
                dest: dest.into(),
                layer,
                gateway: gw.map(str::to_string),
                metric,
            },
        )
    }

    /// Fills unset fields of the winner from lower layers.
    struct FieldMerge;
    impl Merge for FieldMerge {
        type Spec = Route;
        fn name(&self) -> &'static str {
            "test.RouteMerge"
        }
        fn input_namespace(&self) -> &str {
            "config"
        }
        fn output_namespace(&self) -> &str {
            "net"
        }
        fn merge(&self, mut winner: Route, lower: &Route) -> Route {
            winner.gateway = winner.gateway.or_else(|| lower.gateway.clone());
            winner.metric = winner.metric.or(lower.metric);
            winner
        }
    }

    #[test]
    fn highest_layer_wins_then_ties_by_id() {
        let m = LayeredMerge::<Route>::new("test.RouteMerge", "config", "net");
        let mut torn = cand("z/default", "0.0.0.0/0", 9, Some("torn"), None);
        torn.metadata.phase = Phase::TearingDown;
        let merged = merge_candidates(
            &m,
            &[
                cand("default/a", "0.0.0.0/0", 0, Some("a"), None),
                cand("operator/a", "0.0.0.0/0", 3, Some("op"), None),
                cand("config/a", "0.0.0.0/0", 2, Some("cfg"), Some(5)),
                cand("x/b", "10.0.0.0/8", 1, Some("x"), None),
                cand("y/b", "10.0.0.0/8", 1, Some("y"), None),
                torn,
            ],
        );
        let table: Vec<(&str, Option<&str>)> = merged
            .iter()
            .map(|(k, v)| (k.as_str(), v.gateway.as_deref()))
            .collect();
        assert_eq!(
            table,
            [("0.0.0.0/0", Some("op")), ("10.0.0.0/8", Some("y"))]
        );
        assert_eq!(
            merged["0.0.0.0/0"].metric, None,
            "default hook keeps the winner whole"
        );
    }

    #[test]
    fn hook_folds_from_next_highest_down() {
        let merged = merge_candidates(
            &FieldMerge,
            &[
                cand("a", "d", 0, Some("lowest"), Some(1)),
                cand("b", "d", 1, Some("middle"), None),
                cand("c", "d", 2, None, None),
            ],
        );
        assert_eq!(merged["d"].gateway.as_deref(), Some("middle"));
        assert_eq!(merged["d"].metric, Some(1));
        assert_eq!(merged["d"].layer, 2);
    }

    #[test]
    fn declarations() {
        let c = MergeController::new(FieldMerge);
        assert_eq!(c.name(), "test.RouteMerge");
        assert_eq!(c.inputs().len(), 2);
        assert_eq!(c.outputs()[0].namespace, "net");
        assert_eq!(c.outputs()[0].kind, OutputKind::Shared);
    }
}
