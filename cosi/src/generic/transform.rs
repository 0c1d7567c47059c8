//! The transform controller: each input resource maps to at most one output resource, by a
//! pure function. Outputs whose input is gone (or tearing down, or now mapped to `None`) are torn
//! down by the runtime's output tracker.

use crate::resource::{Phase, Resource, ResourceSpec};
use crate::runtime::{Action, Context, Controller, Input, Output, OutputKind, ReconcileError};

/// A pure mapping from resources of one type to resources of another.
pub trait Transform: Send + Sync + 'static {
    /// The input spec.
    type Input: ResourceSpec;
    /// The output spec.
    type Output: ResourceSpec;

    /// The controller name (owner of the outputs).
    fn name(&self) -> &'static str;

    /// Where the inputs live.
    fn input_namespace(&self) -> &str;

    /// Where the outputs are written.
    fn output_namespace(&self) -> &str;

    /// The output ID for an input; `None` skips the input (and removes an earlier output).
    fn map_id(&self, input: &Resource<Self::Input>) -> Option<String>;

    /// The output spec for an input. An error fails the cycle (after the other inputs were
    /// processed), so the runtime retries with backoff and tears nothing down meanwhile.
    fn transform(&self, input: &Resource<Self::Input>) -> Result<Self::Output, ReconcileError>;

    /// Annotations of the output for an input (default: none): what a reader of the output
    /// needs to know of the input it was made from (its version, say).
    fn annotations(&self, _input: &Resource<Self::Input>) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Whether other controllers write the output type too (default: exclusive).
    fn output_kind(&self) -> OutputKind {
        OutputKind::Exclusive
    }
}

/// The controller that runs a [`Transform`].
///
/// Inputs: a weak input on the input kind, and a destroy-ready input on its own output kind
/// (unless that is the input kind). Output: the output type in the output namespace.
#[derive(Debug)]
pub struct TransformController<T> {
    transform: T,
}

impl<T: Transform> TransformController<T> {
    /// A controller running `transform`.
    pub fn new(transform: T) -> Self {
        Self { transform }
    }

    async fn run(&self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let t = &self.transform;
        let inputs = ctx.list::<T::Input>(t.input_namespace()).await?;
        let mut failed: Option<ReconcileError> = None;
        let mut outputs = Vec::new();
        for input in inputs.iter().filter(|r| r.metadata.phase == Phase::Running) {
            let Some(id) = t.map_id(input) else {
                continue;
            };
            match t.transform(input) {
                Ok(spec) => {
                    let mut out = Resource::new(t.output_namespace(), id, spec);
                    out.metadata.annotations.extend(t.annotations(input));
                    outputs.push(out);
                }
                Err(e) => {
                    tracing::debug!(input = %input.metadata.id, error = %crate::error::Chain(&e), "transform failed");
                    failed.get_or_insert(e);
                }
            }
        }
        ctx.apply_all(outputs).await?;
        match failed {
            Some(e) => Err(e),
            None => Ok(Action::AwaitChange),
        }
    }
}

impl<T: Transform> Controller for TransformController<T> {
    fn name(&self) -> &'static str {
        self.transform.name()
    }

    fn inputs(&self) -> Vec<Input> {
        let t = &self.transform;
        let mut inputs = vec![Input::weak::<T::Input>(t.input_namespace())];
        if T::Input::TYPE != T::Output::TYPE || t.input_namespace() != t.output_namespace() {
            inputs.push(Input::destroy_ready::<T::Output>(t.output_namespace()));
        }
        inputs
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::new(
            self.transform.output_namespace(),
            T::Output::TYPE,
            self.transform.output_kind(),
        )]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}
