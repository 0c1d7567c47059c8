//! etcd on a control plane: configuration → spec → certificates on disk → the service init
//! runs → its health. One module per controller, upstream's names.

pub mod args;
pub mod config;
pub mod health;
pub mod join;
pub mod operation;
pub mod pki;
pub mod recover;
pub mod service;
pub mod vip;

use cosi::runtime::{Context, ReconcileError};
use cosi::ResourceSpec;

/// Keeps an output as it is this cycle (upstream's "skip reconcile": inputs not ready, the
/// output is neither changed nor removed).
pub(crate) async fn keep<S: ResourceSpec>(
    ctx: &mut Context,
    namespace: &str,
    id: &str,
) -> Result<(), ReconcileError> {
    if let Some(r) = ctx.get::<S>(namespace, id).await? {
        ctx.apply(r).await?;
    }
    Ok(())
}
