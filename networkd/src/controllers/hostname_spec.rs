//! HostnameSpecController: the merged HostnameSpec (`network/hostname`) → the kernel's hostname
//! and domain name (`sethostname(2)`, `setdomainname(2)`), and HostnameStatus.
//!
//! The kernel is written only when its value differs. The status reports what the kernel has
//! after the change. On teardown nothing in the kernel changes (as upstream): the status goes
//! and the finalizer is released.

use cosi::{Action, Context, Controller, Input, Output, Phase, ReconcileError, Resource};
use machinery::resources::network::{HostnameSpecSpec, HostnameStatusSpec, HOSTNAME_ID, NAMESPACE};

use crate::netlink;

/// The owner and finalizer name.
pub const NAME: &str = "network.HostnameSpecController";

/// Applies the HostnameSpec to the kernel and reports HostnameStatus.
#[derive(Debug, Default)]
pub struct HostnameSpecController;

impl Controller for HostnameSpecController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::strong::<HostnameSpecSpec>(NAMESPACE).with_id(HOSTNAME_ID)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<HostnameStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(spec) = ctx.get::<HostnameSpecSpec>(NAMESPACE, HOSTNAME_ID).await? else {
            return Ok(Action::AwaitChange);
        };
        if spec.metadata.phase == Phase::TearingDown {
            ctx.remove_finalizer::<HostnameSpecSpec>(NAMESPACE, HOSTNAME_ID, NAME)
                .await?;
            return Ok(Action::AwaitChange);
        }
        if !spec.metadata.finalizers.contains(NAME) {
            ctx.add_finalizer::<HostnameSpecSpec>(NAMESPACE, HOSTNAME_ID, NAME)
                .await?;
        }
        let s = &spec.spec;
        if let Err(e) = s.validate() {
            // A bad spec is reported, not retried: only a new spec can fix it.
            tracing::warn!(error = %e, "invalid hostname spec, not applied");
            return Ok(Action::AwaitChange);
        }
        let (host, domain) =
            netlink::hostname().map_err(|e| ReconcileError::failed("read the hostname", e))?;
        if host != s.hostname || domain != s.domainname {
            netlink::set_hostname(&s.hostname, &s.domainname)
                .map_err(|e| ReconcileError::failed("set the hostname", e))?;
            tracing::info!(hostname = %s.hostname, domainname = %s.domainname, "hostname set");
        }
        ctx.apply(Resource::new(
            NAMESPACE,
            HOSTNAME_ID,
            HostnameStatusSpec {
                hostname: s.hostname.clone(),
                domainname: s.domainname.clone(),
            },
        ))
        .await?;
        Ok(Action::AwaitChange)
    }
}
