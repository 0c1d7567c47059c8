//! `MachineService.Bootstrap`: apid cannot see etcd's data directory nor start etcd, so it
//! asks k8sd: a request in its own namespace (`apid/EtcdBootstrapRequests`, a random ID), which
//! k8sd answers under that ID in `etcd/EtcdBootstrapAnswers` (accepted, or the gRPC code and
//! message upstream returns: `AlreadyExists` for a node with etcd data, `FailedPrecondition`
//! for a node that runs no etcd). The request is removed however the call ends.

use std::time::Duration;

use cosi::{Resource, ResourceSpec as _};
use machinery::resources::apid::{EtcdBootstrapRequestSpec, NAMESPACE};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::etcd::{EtcdBootstrapAnswerSpec, NAMESPACE as ETCD};
use proto::machine::BootstrapRequest;
use tonic::Status;

/// The owner of the requests apid writes.
const OWNER: &str = "apid";
/// How long k8sd has to answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn unavailable(e: &cosi::StateError) -> Status {
    Status::unavailable(format!("stated is not answering apid: {e}"))
}

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
/// k8sd's refusal; `Unimplemented` in maintenance (no configuration); `Unavailable` without
/// stated; `DeadlineExceeded` when k8sd does not answer within [`ANSWER_TIMEOUT`].
pub async fn bootstrap(client: &cosi::Client, req: BootstrapRequest) -> Result<(), Status> {
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
    let id = machinery::secrets::x509::random(16)
        .map_err(|e| Status::internal(e.to_string()))?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let request = Resource::<EtcdBootstrapRequestSpec>::new(
        NAMESPACE,
        id.clone(),
        EtcdBootstrapRequestSpec {
            recover_etcd: req.recover_etcd,
            recover_skip_hash_check: req.recover_skip_hash_check,
        },
    );
    let raw = request
        .to_raw()
        .map_err(|e| Status::internal(e.to_string()))?;
    client
        .create(&raw, OWNER)
        .await
        .map_err(|e| unavailable(&e))?;
    let _cleanup = Cleanup {
        client: client.clone(),
        id: id.clone(),
    };
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, answer(client, &id))
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "k8sd did not answer the bootstrap request within {} s (is k8sd running? `talosctl service k8sd`)",
                ANSWER_TIMEOUT.as_secs()
            ))
        })??;
    status_of(&answer)?;
    tracing::info!(request = %id, "etcd bootstrap accepted by k8sd");
    Ok(())
}

async fn answer(client: &cosi::Client, id: &str) -> Result<EtcdBootstrapAnswerSpec, Status> {
    let mut wait = Duration::from_millis(10);
    loop {
        match client.get_typed::<EtcdBootstrapAnswerSpec>(ETCD, id).await {
            Ok(a) => return Ok(a.spec),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(unavailable(&e)),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(200));
    }
}

/// Destroys a request when dropped.
struct Cleanup {
    client: cosi::Client,
    id: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let client = self.client.clone();
        let id = std::mem::take(&mut self.id);
        tokio::spawn(async move {
            if let Err(e) = client
                .destroy(NAMESPACE, EtcdBootstrapRequestSpec::TYPE, &id, OWNER)
                .await
            {
                if !e.is_not_found() {
                    tracing::warn!(request = %id, error = %e, "cannot remove a bootstrap request");
                }
            }
        });
    }
}

/// Destroys the requests a previous apid left (it was killed mid-call).
pub async fn forget_stale(client: &cosi::Client) {
    let Ok(stale) = client
        .list(
            NAMESPACE,
            EtcdBootstrapRequestSpec::TYPE,
            &cosi::Query::default(),
        )
        .await
    else {
        return;
    };
    for r in stale {
        let m = &r.metadata;
        let _ = client
            .destroy(&m.namespace, &m.r#type, &m.id, &m.owner)
            .await;
    }
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
