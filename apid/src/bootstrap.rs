//! `MachineService.Bootstrap`: apid cannot see etcd's data directory nor start etcd, so it
//! asks k8sd: a request in its own namespace (`apid/EtcdBootstrapRequests`, a random ID), which
//! k8sd answers under that ID in `etcd/EtcdBootstrapAnswers` (accepted, or the gRPC code and
//! message upstream returns: `AlreadyExists` for a node with etcd data, `FailedPrecondition`
//! for a node that runs no etcd). The request is removed however the call ends.

use std::time::Duration;

use cosi::ResourceSpec as _;
use machinery::resources::apid::EtcdBootstrapRequestSpec;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::etcd::{EtcdBootstrapAnswerSpec, NAMESPACE as ETCD};
use proto::machine::BootstrapRequest;
use tonic::Status;

/// The owner of the requests apid writes.
const OWNER: &str = "apid.Bootstrap";
/// One bootstrap request at a time: what callers send cannot pile requests up in stated.
static IN_FLIGHT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// How long k8sd has to answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

use crate::request::unavailable;

/// The status of k8sd's answer (`Ok` when accepted).
pub fn status_of(answer: &EtcdBootstrapAnswerSpec) -> Result<(), Status> {
    let m = answer.message.clone();
    match answer.code.as_str() {
        "" => Ok(()),
        "AlreadyExists" => Err(Status::already_exists(m)),
        "FailedPrecondition" => Err(Status::failed_precondition(m)),
        "Unimplemented" => Err(Status::unimplemented(m)),
        other => Err(Status::internal(format!("{other}: {m}"))),
    }
}

/// Asks k8sd to bootstrap etcd on this node and returns its answer.
///
/// # Errors
///
/// k8sd's refusal; `ResourceExhausted` while another call is being answered;
/// `Unimplemented` in maintenance (no configuration); `Unavailable` without
/// stated; `DeadlineExceeded` when k8sd does not answer within [`ANSWER_TIMEOUT`].
pub async fn bootstrap(client: &cosi::Client, req: BootstrapRequest) -> Result<(), Status> {
    let _permit = IN_FLIGHT.try_acquire().map_err(|_| {
        Status::resource_exhausted("a bootstrap request is being answered: try again")
    })?;
    match client
        .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
        .await
    {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {
            return Err(Status::unimplemented(
                "bootstrap is not available in maintenance mode: apply a configuration first",
            ))
        }
        Err(e) => return Err(unavailable(&e)),
    }
    let request = crate::request::Pending::create(
        client,
        OWNER,
        EtcdBootstrapRequestSpec {
            recover_etcd: req.recover_etcd,
            recover_skip_hash_check: req.recover_skip_hash_check,
        },
    )
    .await?;
    let answer = request
        .answer::<EtcdBootstrapAnswerSpec>(
            ETCD,
            ANSWER_TIMEOUT,
            "k8sd did not answer the bootstrap request (is k8sd running? `talosctl service k8sd`)",
            |_| true,
        )
        .await?;
    status_of(&answer)?;
    tracing::info!(request = %request.id(), "etcd bootstrap accepted by k8sd");
    Ok(())
}

/// Destroys the requests a previous apid left (it was killed mid-call).
pub async fn forget_stale(client: &cosi::Client) {
    crate::request::forget_stale(client, EtcdBootstrapRequestSpec::TYPE).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k8sd_codes_become_grpc_codes() {
        let a = |code: &str| EtcdBootstrapAnswerSpec {
            code: code.into(),
            message: "m".into(),
        };
        assert!(status_of(&a("")).is_ok());
        assert_eq!(
            status_of(&a("AlreadyExists")).unwrap_err().code(),
            tonic::Code::AlreadyExists
        );
        assert_eq!(
            status_of(&a("FailedPrecondition")).unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            status_of(&a("bogus")).unwrap_err().code(),
            tonic::Code::Internal
        );
    }
}
