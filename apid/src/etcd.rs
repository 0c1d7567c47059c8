//! `EtcdMemberList` and `EtcdStatus`, and the operations k8sd runs for apid ([`operation`]):
//! apid holds no etcd credentials and cannot reach etcd
//! (landlock: TCP 50000 only). It answers from `etcd/EtcdStatuses`, which k8sd refreshes from
//! the local member every 5 s (upstream's machined asks etcd at the call: these answers may be
//! up to that old, and `query_local` makes no difference).

use cosi::ResourceSpec as _;
use machinery::resources::apid::EtcdOperationRequestSpec;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::etcd::{EtcdOperationAnswerSpec, EtcdStatusSpec, ETCD_ID, NAMESPACE};
use proto::machine::{
    etcd_member_alarm, EtcdMember, EtcdMemberAlarm, EtcdMemberStatus, EtcdMembers, EtcdStatus,
};
use tonic::Status;

use crate::request::unavailable;
use crate::share::Share;

/// k8sd's view of etcd on this node, or why there is none.
async fn status(client: &cosi::Client) -> Result<EtcdStatusSpec, Status> {
    let s = match client.get_typed::<EtcdStatusSpec>(NAMESPACE, ETCD_ID).await {
        Ok(s) => s.spec,
        Err(e) if e.is_not_found() => {
            return Err(Status::failed_precondition(
                "etcd does not run on this node (a worker, or no cluster.etcd.ca)",
            ))
        }
        Err(e) => return Err(unavailable(&e)),
    };
    if !s.healthy {
        return Err(Status::unavailable(format!(
            "etcd is {} on this node: {}",
            s.phase, s.message
        )));
    }
    Ok(s)
}

/// The members the local member lists.
///
/// # Errors
///
/// `FailedPrecondition` on a node without etcd, `Unavailable` while it is not healthy.
pub async fn members(client: &cosi::Client) -> Result<EtcdMembers, Status> {
    let s = status(client).await?;
    Ok(EtcdMembers {
        metadata: None,
        legacy_members: s.members.iter().map(|m| m.hostname.clone()).collect(),
        members: s
            .members
            .into_iter()
            .map(|m| EtcdMember {
                id: m.id,
                hostname: m.hostname,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect(),
    })
}

/// The local member's status.
///
/// # Errors
///
/// As [`members`].
pub async fn member_status(client: &cosi::Client) -> Result<EtcdStatus, Status> {
    let s = status(client).await?;
    let Some(m) = s.member_status else {
        return Err(Status::unavailable("etcd's status is not known yet"));
    };
    Ok(EtcdStatus {
        metadata: None,
        member_status: Some(EtcdMemberStatus {
            member_id: m.member_id,
            protocol_version: m.protocol_version,
            db_size: m.db_size,
            db_size_in_use: m.db_size_in_use,
            leader: m.leader,
            raft_index: m.raft_index,
            raft_term: m.raft_term,
            raft_applied_index: m.raft_applied_index,
            errors: m.errors,
            is_learner: m.is_learner,
        }),
    })
}

/// The owner of the operation requests apid writes.
const OPERATION_OWNER: &str = "apid.EtcdOperation";

/// How long k8sd has to answer `operation` (a defragmentation rewrites the database; a leave
/// waits for etcd to stop and its data to be removed).
pub fn answer_timeout(operation: &str) -> std::time::Duration {
    std::time::Duration::from_secs(match operation {
        "defragment" => 90,
        // A removal is retried for 40 s while the cluster settles; a leave then waits for
        // etcd to stop and its data to go.
        "leave" => 90,
        "remove-member" => 60,
        _ => 30,
    })
}

/// The status of k8sd's answer (`Ok` when done).
pub fn status_of(answer: &EtcdOperationAnswerSpec) -> Result<(), Status> {
    let m = answer.message.clone();
    match answer.code.as_str() {
        "" => Ok(()),
        "NotFound" => Err(Status::not_found(m)),
        "FailedPrecondition" => Err(Status::failed_precondition(m)),
        "InvalidArgument" => Err(Status::invalid_argument(m)),
        "Unavailable" => Err(Status::unavailable(m)),
        "Internal" => Err(Status::internal(m)),
        other => Err(Status::internal(format!("{other}: {m}"))),
    }
}

/// Checks that the node is configured before an etcd operation runs under `share` (one of the
/// caller's [`crate::share::Pool::etcd`]: operations in progress are bounded per client, and a
/// part is kept for admins, so callers cannot pile requests up in stated and a reader looping
/// on one never keeps an admin's out).
///
/// # Errors
///
/// `FailedPrecondition` in maintenance; `Unavailable` without stated.
async fn begin(client: &cosi::Client, share: Share) -> Result<Share, Status> {
    let permit = share;
    match client
        .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
        .await
    {
        Ok(_) => Ok(permit),
        Err(e) if e.is_not_found() => Err(Status::failed_precondition(
            "etcd does not run in maintenance mode: apply a configuration first",
        )),
        Err(e) => Err(unavailable(&e)),
    }
}

/// Asks k8sd to run an etcd operation (`remove-member`, `leave`, `forfeit-leadership`,
/// `defragment`, `alarm-list`, `alarm-disarm`) and returns its answer. apid cannot reach etcd
/// and holds no etcd credential: k8sd runs it with the admin certificate.
///
/// # Errors
///
/// k8sd's refusal; `ResourceExhausted` while another operation is being answered;
/// `FailedPrecondition` in maintenance; `Unavailable` without stated; `DeadlineExceeded` when
/// k8sd does not answer in time.
pub async fn operation(
    client: &cosi::Client,
    share: Share,
    operation: &str,
    member_id: u64,
) -> Result<EtcdOperationAnswerSpec, Status> {
    let _permit = begin(client, share).await?;
    let request = crate::request::Pending::create(
        client,
        OPERATION_OWNER,
        EtcdOperationRequestSpec {
            operation: operation.to_string(),
            member_id,
            acked: 0,
        },
    )
    .await?;
    let answer = request
        .answer::<EtcdOperationAnswerSpec>(
            NAMESPACE,
            answer_timeout(operation),
            "k8sd did not answer the etcd request (is k8sd running? `talosctl service k8sd`)",
            |_| true,
        )
        .await?;
    status_of(&answer)?;
    Ok(answer)
}

/// The alarms of an answer, as upstream's messages.
pub fn alarms(answer: &EtcdOperationAnswerSpec) -> Vec<EtcdMemberAlarm> {
    answer
        .alarms
        .iter()
        .map(|a| EtcdMemberAlarm {
            member_id: a.member_id,
            alarm: match a.alarm.as_str() {
                "NOSPACE" => etcd_member_alarm::AlarmType::Nospace,
                "CORRUPT" => etcd_member_alarm::AlarmType::Corrupt,
                _ => etcd_member_alarm::AlarmType::None,
            } as i32,
        })
        .collect()
}

/// Destroys the operation requests a previous apid left (it was killed mid-call).
pub async fn forget_stale(client: &cosi::Client) {
    crate::request::forget_stale(client, EtcdOperationRequestSpec::TYPE).await;
}

/// How long apid waits for k8sd's next snapshot chunk.
const CHUNK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where a snapshot stream stands.
struct SnapshotStream {
    request: crate::request::Pending,
    /// The next chunk expected.
    next: u64,
    _permit: Share,
}

impl SnapshotStream {
    /// The next piece of the snapshot (`None`: it ended).
    async fn next(&mut self) -> Result<Option<Vec<u8>>, Status> {
        use base64::Engine as _;
        let client = self.request.client().clone();
        let id = self.request.id().to_string();
        let start = std::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(1);
        loop {
            // A refusal or a failure mid-stream: k8sd's answer.
            if let Ok(a) = client
                .get_typed::<EtcdOperationAnswerSpec>(NAMESPACE, &id)
                .await
            {
                status_of(&a.spec)?;
            }
            match client
                .get_typed::<machinery::resources::etcd::EtcdSnapshotChunkSpec>(NAMESPACE, &id)
                .await
            {
                Ok(c) if c.spec.seq == self.next && c.spec.eof => return Ok(None),
                Ok(c) if c.spec.seq == self.next => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(c.spec.data.as_bytes())
                        .map_err(|e| Status::internal(format!("k8sd sent a bad chunk: {e}")))?;
                    self.request
                        .update(EtcdOperationRequestSpec {
                            operation: "snapshot".into(),
                            member_id: 0,
                            acked: self.next,
                        })
                        .await?;
                    self.next += 1;
                    return Ok(Some(bytes));
                }
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(unavailable(&e)),
            }
            if start.elapsed() > CHUNK_TIMEOUT {
                return Err(Status::deadline_exceeded(format!(
                    "k8sd sent no snapshot chunk within {} s (is k8sd running? `talosctl service k8sd`)",
                    CHUNK_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_millis(20));
        }
    }
}

/// `EtcdSnapshot`: k8sd streams the local member's snapshot in chunks through stated, one at
/// a time (apid acknowledges each in its request); each becomes a `common.Data`.
///
/// # Errors
///
/// As [`operation`], before the first byte; mid-stream errors end the stream with k8sd's
/// status.
pub async fn snapshot(
    client: &cosi::Client,
    share: Share,
) -> Result<
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::common::Data, Status>> + Send>>,
    Status,
> {
    let permit = begin(client, share).await?;
    let request = crate::request::Pending::create(
        client,
        OPERATION_OWNER,
        EtcdOperationRequestSpec {
            operation: "snapshot".into(),
            member_id: 0,
            acked: 0,
        },
    )
    .await?;
    let mut state = SnapshotStream {
        request,
        next: 1,
        _permit: permit,
    };
    // The first chunk (or k8sd's refusal) before the call is answered: a refused snapshot is a
    // status, not an empty stream.
    let first = state.next().await?;
    let stream = futures::stream::unfold(
        (Some(state), first.map(Ok)),
        |(state, pending)| async move {
            let mut state = state?;
            if let Some(item) = pending {
                return Some((item, (Some(state), None)));
            }
            match state.next().await {
                Ok(Some(bytes)) => Some((Ok(bytes), (Some(state), None))),
                Ok(None) => None,
                Err(s) => Some((Err(s), (None, None))),
            }
        },
    );
    use futures::StreamExt as _;
    Ok(Box::pin(stream.map(|r| {
        r.map(|bytes| proto::common::Data {
            metadata: None,
            bytes,
        })
    })))
}

/// The owner of the upload chunks apid writes.
const RECOVER_OWNER: &str = "apid.EtcdRecover";

/// `EtcdRecover`: the uploaded snapshot goes to k8sd through stated one chunk at a time (256
/// KiB, `apid/EtcdRecoverChunks`; k8sd acknowledges each in `etcd/EtcdRecoverAcks` once it is
/// on disk), so neither apid nor stated holds more than a chunk whatever the upload's size;
/// k8sd keeps the file for `Bootstrap{recover_etcd}`.
///
/// # Errors
///
/// `FailedPrecondition` in maintenance, on a node without etcd, or when k8sd refuses the
/// upload (too large, out of order, a write error); `ResourceExhausted` while another etcd
/// operation runs; `DeadlineExceeded` when the client or k8sd stalls.
pub async fn recover(
    client: &cosi::Client,
    share: Share,
    mut upload: tonic::Streaming<proto::common::Data>,
) -> Result<u64, Status> {
    use base64::Engine as _;
    use machinery::resources::apid::EtcdRecoverChunkSpec;
    use machinery::resources::etcd::{EtcdRecoverAckSpec, EtcdSpecSpec, MAX_RECOVER_BYTES};
    let _permit = begin(client, share).await?;
    match client.get_typed::<EtcdSpecSpec>(NAMESPACE, ETCD_ID).await {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {
            return Err(Status::failed_precondition(
                "etcd does not run on this node (a worker, or no cluster.etcd.ca)",
            ))
        }
        Err(e) => return Err(unavailable(&e)),
    }
    let chunk_size = machinery::resources::etcd::SNAPSHOT_CHUNK;
    let (mut buf, mut seq, mut total, mut eof) = (Vec::new(), 0u64, 0u64, false);
    let mut request: Option<crate::request::Pending> = None;
    while !eof {
        match tokio::time::timeout(CHUNK_TIMEOUT, upload.message()).await {
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "the upload stalled for {} s",
                    CHUNK_TIMEOUT.as_secs()
                )))
            }
            Ok(Err(s)) => return Err(s),
            Ok(Ok(Some(d))) => {
                total += d.bytes.len() as u64;
                if total > MAX_RECOVER_BYTES {
                    return Err(Status::failed_precondition(format!(
                        "the snapshot is larger than {} GiB",
                        MAX_RECOVER_BYTES >> 30
                    )));
                }
                buf.extend_from_slice(&d.bytes);
            }
            Ok(Ok(None)) => eof = true,
        }
        while buf.len() >= chunk_size || eof {
            let rest = buf.split_off(buf.len().min(chunk_size));
            let data = std::mem::replace(&mut buf, rest);
            let last = eof && buf.is_empty();
            seq += 1;
            let spec = EtcdRecoverChunkSpec {
                seq,
                data: base64::engine::general_purpose::STANDARD.encode(&data),
                eof: last,
            };
            match request.as_mut() {
                None => {
                    request =
                        Some(crate::request::Pending::create(client, RECOVER_OWNER, spec).await?)
                }
                Some(r) => r.update(spec).await?,
            }
            let Some(r) = request.as_ref() else {
                return Err(Status::internal("no upload"));
            };
            let ack = r
                .answer_polled::<EtcdRecoverAckSpec>(
                    NAMESPACE,
                    CHUNK_TIMEOUT,
                    "k8sd did not take the snapshot chunk (is k8sd running? `talosctl service k8sd`)",
                    |a| !a.error.is_empty() || (a.acked >= seq && (!last || a.done)),
                    std::time::Duration::from_millis(20),
                )
                .await?;
            if !ack.error.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "k8sd refused the upload: {}",
                    ack.error
                )));
            }
            if last {
                tracing::info!(bytes = ack.size, "etcd snapshot uploaded for a recovery");
                return Ok(ack.size);
            }
        }
    }
    Err(Status::internal("the upload ended without its last chunk"))
}

/// Destroys the upload chunks a previous apid left (it was killed mid-upload).
pub async fn forget_stale_uploads(client: &cosi::Client) {
    use machinery::resources::apid::EtcdRecoverChunkSpec;
    crate::request::forget_stale(client, EtcdRecoverChunkSpec::TYPE).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k8sd_codes_become_grpc_codes() {
        let a = |code: &str| EtcdOperationAnswerSpec {
            code: code.into(),
            message: "m".into(),
            ..Default::default()
        };
        assert!(status_of(&a("")).is_ok());
        for (code, grpc) in [
            ("NotFound", tonic::Code::NotFound),
            ("FailedPrecondition", tonic::Code::FailedPrecondition),
            ("InvalidArgument", tonic::Code::InvalidArgument),
            ("Unavailable", tonic::Code::Unavailable),
            ("bogus", tonic::Code::Internal),
        ] {
            assert_eq!(status_of(&a(code)).unwrap_err().code(), grpc, "{code}");
        }
    }

    #[test]
    fn alarms_keep_upstreams_numbers() {
        let answer = EtcdOperationAnswerSpec {
            alarms: vec![machinery::resources::etcd::EtcdAlarmInfo {
                member_id: 7,
                alarm: "NOSPACE".into(),
            }],
            ..Default::default()
        };
        let a = alarms(&answer);
        assert_eq!(a[0].member_id, 7);
        assert_eq!(a[0].alarm, 1);
    }
}
