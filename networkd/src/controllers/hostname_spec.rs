//! HostnameSpecController: the merged HostnameSpec (`network/hostname`) → HostnameStatus, read
//! from the kernel.
//!
//! networkd does not set the hostname: `sethostname(2)` needs CAP_SYS_ADMIN, which networkd is
//! not granted (DESIGN §5). init, which owns the node's UTS namespace, applies the spec
//! (`init::hostname`). This controller only observes: the status holds the kernel's hostname and
//! domain name (`/proc/sys/kernel/{hostname,domainname}`, unprivileged) once they are the
//! spec's. While they differ (init has not applied a change yet, or does not own a UTS
//! namespace, as in development mode) the kernel is polled with backoff, since nothing signals a
//! hostname change; a status whose names the kernel still has is kept meanwhile, any other
//! goes. On teardown nothing in the kernel changes (as upstream): the status goes and the
//! finalizer is released.

use std::time::Duration;

use cosi::{Action, Context, Controller, Input, Output, Phase, ReconcileError, Resource};
use machinery::resources::network::{HostnameSpecSpec, HostnameStatusSpec, HOSTNAME_ID, NAMESPACE};

use crate::netlink;

/// The owner and finalizer name.
pub const NAME: &str = "network.HostnameSpecController";

/// First delay before reading the kernel again while it differs from the spec.
pub const POLL_INITIAL: Duration = Duration::from_millis(200);
/// Longest delay between two readings while the kernel differs from the spec.
pub const POLL_MAX: Duration = Duration::from_secs(10);

/// Reports HostnameStatus once the kernel has the HostnameSpec's names.
#[derive(Debug)]
pub struct HostnameSpecController {
    poll: Duration,
}

impl Default for HostnameSpecController {
    fn default() -> Self {
        Self { poll: POLL_INITIAL }
    }
}

impl HostnameSpecController {
    /// The next poll delay while the kernel differs (doubling up to [`POLL_MAX`]).
    fn next_poll(&mut self) -> Duration {
        let d = self.poll;
        self.poll = (self.poll * 2).min(POLL_MAX);
        d
    }
}

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
            self.poll = POLL_INITIAL;
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
            tracing::warn!(error = %e, "invalid hostname spec, not reported");
            return Ok(Action::AwaitChange);
        }
        let (hostname, domainname) =
            netlink::hostname().map_err(|e| ReconcileError::failed("read the hostname", e))?;
        let kernel = HostnameStatusSpec {
            hostname,
            domainname,
        };
        if kernel.hostname == s.hostname && kernel.domainname == s.domainname {
            self.poll = POLL_INITIAL;
            ctx.apply(Resource::new(NAMESPACE, HOSTNAME_ID, kernel))
                .await?;
            return Ok(Action::AwaitChange);
        }
        // Not applied (yet): keep a status that is still true, drop one that is not.
        let current = ctx
            .get::<HostnameStatusSpec>(NAMESPACE, HOSTNAME_ID)
            .await?
            .filter(|r| r.metadata.phase == Phase::Running && r.spec == kernel);
        if current.is_some() {
            ctx.apply(Resource::new(NAMESPACE, HOSTNAME_ID, kernel.clone()))
                .await?;
        }
        let delay = self.next_poll();
        tracing::debug!(
            kernel = %kernel.fqdn(),
            spec = %s.fqdn(),
            retry_in = ?delay,
            "the kernel does not have the hostname spec's names (yet): init sets them"
        );
        Ok(Action::RequeueAfter(delay))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_backs_off_up_to_the_maximum() {
        let mut c = HostnameSpecController::default();
        let delays: Vec<Duration> = (0..8).map(|_| c.next_poll()).collect();
        assert_eq!(delays[0], POLL_INITIAL);
        assert_eq!(delays[1], POLL_INITIAL * 2);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap_or(&Duration::ZERO), POLL_MAX);
    }
}
