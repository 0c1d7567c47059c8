//! The controller contract: a name, declared inputs and outputs, and one reconcile function.

use std::future::Future;
use std::time::Duration;

use crate::resource::ResourceSpec;
use crate::runtime::context::Context;
use crate::runtime::error::ReconcileError;

/// A controller: declares what it reads and writes, and reconciles its outputs from its inputs.
///
/// The runtime owns the loop: it wakes the controller when an input changes (a burst of changes
/// is one wake-up), calls [`reconcile`](Controller::reconcile), then tears down every output the
/// cycle did not assert. Reconcile is level-triggered: it reads all inputs through the
/// [`Context`] and writes the full desired set of outputs, whatever woke it.
///
/// An implementation may write `async fn reconcile(&mut self, ctx: &mut Context) -> ...`; the
/// future must be `Send`.
///
/// # Errors and panics
///
/// A reconcile that returns `Err` or panics is retried after an exponential backoff (100 ms
/// doubling to 30 s, reset by a successful cycle); no outputs are torn down after a failed cycle.
/// A panic leaves `self` as it was at the panic: keep state that must survive in resources.
pub trait Controller: Send + 'static {
    /// The controller name, unique in a runtime. It is the owner string of every resource the
    /// controller writes: renaming a controller orphans its outputs.
    fn name(&self) -> &'static str;

    /// The resources whose changes wake the controller (and that it may read).
    fn inputs(&self) -> Vec<Input>;

    /// The types the controller writes.
    fn outputs(&self) -> Vec<Output>;

    /// Reads the inputs and writes the desired outputs.
    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a;
}

/// What a controller wants after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Sleep until an input changes.
    AwaitChange,
    /// Reconcile again after this long, or earlier if an input changes (timers, refreshes).
    RequeueAfter(Duration),
}

/// How an input relates to the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InputKind {
    /// Wakes the controller on any change.
    Weak,
    /// Wakes the controller on any change; the controller may put finalizers on it.
    Strong,
    /// Wakes the controller only when a resource is tearing down with no finalizers left
    /// (meant for the controller's own outputs, so that it can destroy them).
    DestroyReady,
}

/// A declared input: resources of one type in one namespace, optionally one ID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Input {
    /// Namespace.
    pub namespace: String,
    /// Resource type.
    pub r#type: String,
    /// Only this resource, or the whole kind when `None`.
    pub id: Option<String>,
    /// How the input wakes the controller.
    pub kind: InputKind,
}

impl Input {
    /// An input of `kind` on `r#type` in `namespace` (for type-erased callers).
    pub fn new(namespace: impl Into<String>, r#type: impl Into<String>, kind: InputKind) -> Self {
        Self {
            namespace: namespace.into(),
            r#type: r#type.into(),
            id: None,
            kind,
        }
    }

    /// A weak input on resources of `S` in `namespace`.
    pub fn weak<S: ResourceSpec>(namespace: impl Into<String>) -> Self {
        Self::new(namespace, S::TYPE, InputKind::Weak)
    }

    /// A strong input on resources of `S` in `namespace`: the controller may hold finalizers.
    pub fn strong<S: ResourceSpec>(namespace: impl Into<String>) -> Self {
        Self::new(namespace, S::TYPE, InputKind::Strong)
    }

    /// A destroy-ready input on resources of `S` in `namespace`.
    pub fn destroy_ready<S: ResourceSpec>(namespace: impl Into<String>) -> Self {
        Self::new(namespace, S::TYPE, InputKind::DestroyReady)
    }

    /// Narrows the input to the resource with `id`.
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Whether this input covers the resource `namespace/r#type/id`; `id: None` asks about the
    /// whole kind, which an input narrowed to one ID does not cover.
    pub fn covers(&self, namespace: &str, r#type: &str, id: Option<&str>) -> bool {
        self.namespace == namespace
            && self.r#type == r#type
            && match (&self.id, id) {
                (None, _) => true,
                (Some(mine), Some(asked)) => mine == asked,
                (Some(_), None) => false,
            }
    }
}

/// Whether other controllers may write an output type too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutputKind {
    /// This controller is the only writer of the type in the runtime.
    Exclusive,
    /// Several controllers write the type, each only the resources it owns.
    Shared,
}

/// A declared output: a resource type, and the namespace its leftovers are cleaned up in.
///
/// A controller may write its output types in any namespace; after each successful cycle the
/// runtime tears down unasserted resources it owns in the declared namespace and in every
/// namespace it wrote the type to since it started. The declared namespace is what lets a
/// restarted daemon remove outputs it no longer asserts; the daemon must be able to list it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Output {
    /// Namespace (by default the type's default namespace).
    pub namespace: String,
    /// Resource type.
    pub r#type: String,
    /// Exclusive or shared.
    pub kind: OutputKind,
    /// Kept in memory by the runtime from a watch of the kind ([`cached`](Self::cached)).
    pub cached: bool,
}

impl Output {
    /// An output of `kind` on `r#type` in `namespace` (for type-erased callers).
    pub fn new(namespace: impl Into<String>, r#type: impl Into<String>, kind: OutputKind) -> Self {
        Self {
            namespace: namespace.into(),
            r#type: r#type.into(),
            kind,
            cached: false,
        }
    }

    /// An exclusive output of `S`, in its default namespace.
    pub fn exclusive<S: ResourceSpec>() -> Self {
        Self::new(S::DEFAULT_NAMESPACE, S::TYPE, OutputKind::Exclusive)
    }

    /// A shared output of `S`, in its default namespace.
    pub fn shared<S: ResourceSpec>() -> Self {
        Self::new(S::DEFAULT_NAMESPACE, S::TYPE, OutputKind::Shared)
    }

    /// Sets the namespace the output lives in.
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Keeps the kind (in the declared namespace) in memory, current from a watch of it and
    /// from the controller's own writes: a cycle then compares its outputs with that instead
    /// of listing them from stated, and a destroy the controller did not make wakes it; other
    /// controllers of the runtime that read the kind, as weak or strong inputs, read it there
    /// too. For controllers with many outputs that reconcile often (kernel statuses) or whose
    /// outputs others apply (merged specs); it costs one more watch and a copy of the kind.
    #[must_use]
    pub fn cached(mut self) -> Self {
        self.cached = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Spec;

    impl ResourceSpec for Spec {
        const TYPE: &'static str = "Specs.test.talos.dev";
        const DEFAULT_NAMESPACE: &'static str = "default-ns";
    }

    #[test]
    fn constructors() {
        let i = Input::strong::<Spec>("ns").with_id("a");
        assert_eq!(i.r#type, Spec::TYPE);
        assert_eq!(i.kind, InputKind::Strong);
        assert!(i.covers("ns", Spec::TYPE, Some("a")));
        assert!(!i.covers("ns", Spec::TYPE, Some("b")));
        assert!(!i.covers("ns", Spec::TYPE, None));
        assert!(Input::weak::<Spec>("ns").covers("ns", Spec::TYPE, None));
        assert!(!Input::weak::<Spec>("ns").covers("other", Spec::TYPE, None));

        let o = Output::exclusive::<Spec>();
        assert_eq!(o.namespace, "default-ns");
        assert_eq!(o.kind, OutputKind::Exclusive);
        assert_eq!(Output::shared::<Spec>().in_namespace("x").namespace, "x");
        assert!(!o.cached && Output::exclusive::<Spec>().cached().cached);
    }
}
