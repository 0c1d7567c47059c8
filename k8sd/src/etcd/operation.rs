//! `etcd.OperationController` (ours: upstream's machined calls etcd in the API handler): the
//! etcd operations a user asks through apid, which holds no etcd credential and cannot reach
//! etcd. apid writes `apid/EtcdOperationRequests` (a random ID); k8sd runs the operation with
//! the admin certificate and answers under that ID in `EtcdOperationAnswers`, with upstream's
//! semantics:
//! - `remove-member`: `MemberRemove` of that ID; an unknown ID is `NotFound`; local data is
//!   never touched (upstream#3340).
//! - `leave`: this node's member removed (an already removed member counts as removed), then
//!   `EtcdLeaves/etcd` written: the service controller stops etcd and has its data removed by a
//!   one-shot service under etcd's own uid (k8sd cannot delete etcd's 0700 files). The answer
//!   comes once the data directory is empty.
//! - `forfeit-leadership`: when this member leads, `MoveLeader` to another voting member; the
//!   answer names it (empty when this member did not lead).
//! - `defragment`, `alarm-list`, `alarm-disarm` (every raised alarm, the answer lists them).
//! - `snapshot`: etcd's snapshot stream, passed to apid in chunks (`EtcdSnapshotChunks`, the
//!   request's ID): chunk `n` is written once apid acknowledged `n - 1` in its request, so
//!   stated holds one chunk at a time; the answer comes after the last. The controller is busy
//!   while a snapshot streams (apid runs one etcd operation at a time anyway).

use std::path::PathBuf;
use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client};
use machinery::resources::apid::{EtcdOperationRequestSpec, NAMESPACE as APID};
use machinery::resources::etcd::{
    EtcdAlarmInfo, EtcdLeaveSpec, EtcdOperationAnswerSpec, EtcdSnapshotChunkSpec, EtcdSpecSpec,
    ETCD_ID, NAMESPACE, SNAPSHOT_CHUNK, WIPE_SERVICE_ID,
};
use machinery::resources::runtime::{ServiceState, ServiceStatusSpec, NAMESPACE as RUNTIME};
use machinery::resources::secrets::{
    EtcdCertsSpec, ETCD_ID as SECRETS_ETCD_ID, NAMESPACE as SECRETS,
};

use super::service::has_data;

/// How long a defragmentation may take (it rewrites the database).
pub const DEFRAG_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a leave in progress is looked at (etcd stopping, its data being removed).
const LEAVE_POLL: Duration = Duration::from_millis(500);

/// An answer: the gRPC code name (empty: done) and the message.
type Answer = EtcdOperationAnswerSpec;

fn refuse(code: &str, message: impl Into<String>) -> Answer {
    Answer {
        code: code.to_string(),
        message: message.into(),
        ..Answer::default()
    }
}

fn done(message: impl Into<String>) -> Answer {
    Answer {
        message: message.into(),
        ..Answer::default()
    }
}

/// The code of an etcd client error: `Unavailable` when no member answered, else `Internal`.
fn etcd_error(what: &str, e: &etcd_client::Error) -> Answer {
    let code = match e {
        etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound => "NotFound",
        etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unavailable => "Unavailable",
        etcd_client::Error::TransportError(_) => "Unavailable",
        _ => "Internal",
    };
    refuse(code, format!("{what}: {e}"))
}

fn is_member_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound
        || s.message().contains("member not found"))
}

/// How long a removal is retried while etcd says the cluster is unhealthy (it refuses a
/// reconfiguration until its leader has been in touch with every member for 5 s, e.g. just
/// after a leadership change; upstream's leave retries the same error) or does not answer.
const REMOVE_DEADLINE: Duration = Duration::from_secs(40);
/// How long one removal attempt may take (a reconfiguration commits through the quorum).
const REMOVE_CALL: Duration = Duration::from_secs(10);

/// `MemberRemove(id)`, retried every second while etcd answers "unhealthy cluster" or times
/// out. A member that is gone after an attempt that timed out was removed by it: `Ok`.
async fn remove_member(client: &mut Client, id: u64) -> Result<(), etcd_client::Error> {
    let start = std::time::Instant::now();
    let mut attempted = false;
    loop {
        let r = match tokio::time::timeout(REMOVE_CALL, client.member_remove(id)).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                format!("no answer within {} s", REMOVE_CALL.as_secs()),
            ))),
        };
        let retry = match &r {
            Err(e) if attempted && is_member_not_found(e) => return Ok(()),
            Err(etcd_client::Error::GRpcStatus(s)) => {
                s.message().contains("unhealthy cluster")
                    || matches!(
                        s.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::Cancelled
                            | tonic::Code::DeadlineExceeded
                    )
            }
            Err(etcd_client::Error::TransportError(_)) => true,
            Err(_) => false,
            Ok(()) => false,
        };
        if !retry || start.elapsed() >= REMOVE_DEADLINE {
            return r;
        }
        attempted = true;
        tracing::info!(member = %format!("{id:016x}"), error = %r.as_ref().err().map(ToString::to_string).unwrap_or_default(), "etcd has not removed the member yet: retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The name of an alarm as upstream's `EtcdMemberAlarm.AlarmType`.
pub fn alarm_name(t: AlarmType) -> &'static str {
    match t {
        AlarmType::Nospace => "NOSPACE",
        AlarmType::Corrupt => "CORRUPT",
        AlarmType::None => "NONE",
    }
}

/// Runs `f` within `timeout`.
async fn within<T>(
    timeout: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Answer> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(etcd_error(what, &e)),
        Err(_) => Err(refuse(
            "Unavailable",
            format!("{what}: no answer within {} s", timeout.as_secs()),
        )),
    }
}

/// How long apid may take to acknowledge a snapshot chunk.
const ACK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long etcd may take to send the next part of its snapshot.
const SNAPSHOT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `etcd.OperationController`.
pub struct OperationController {
    data_dir: PathBuf,
    /// The last chunk of each finished snapshot, kept while its request exists.
    last_chunks: std::collections::BTreeMap<String, EtcdSnapshotChunkSpec>,
}

impl OperationController {
    /// Operations on the etcd whose data is in `data_dir`.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            last_chunks: std::collections::BTreeMap::new(),
        }
    }
}

impl Controller for OperationController {
    fn name(&self) -> &'static str {
        "etcd.OperationController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<EtcdOperationRequestSpec>(APID),
            Input::weak::<EtcdSpecSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<EtcdCertsSpec>(SECRETS).with_id(SECRETS_ETCD_ID),
            Input::weak::<ServiceStatusSpec>(RUNTIME).with_id(WIPE_SERVICE_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<EtcdOperationAnswerSpec>(),
            Output::exclusive::<EtcdLeaveSpec>(),
            Output::exclusive::<EtcdSnapshotChunkSpec>(),
        ]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let requests = ctx.list::<EtcdOperationRequestSpec>(APID).await?;
        let answered = ctx.list::<EtcdOperationAnswerSpec>(NAMESPACE).await?;
        let mut leave = ctx.get::<EtcdLeaveSpec>(NAMESPACE, ETCD_ID).await?;
        let etcd = ctx.get::<EtcdSpecSpec>(NAMESPACE, ETCD_ID).await?;
        let certs = ctx.get::<EtcdCertsSpec>(SECRETS, SECRETS_ETCD_ID).await?;
        let wipe = ctx
            .get::<ServiceStatusSpec>(RUNTIME, WIPE_SERVICE_ID)
            .await?
            .map(|s| s.spec);
        let data = has_data(&self.data_dir).map_err(|e| {
            ReconcileError::failed(format!("cannot read {}", self.data_dir.display()), e)
        })?;
        let mut answers = Vec::new();
        let mut again = false;
        for req in &requests {
            let id = req.id().to_string();
            if let Some(a) = answered.iter().find(|a| a.id() == id) {
                answers.push(a.clone());
                continue;
            }
            let op = req.spec.operation.as_str();
            let answer = if etcd.is_none() {
                Some(refuse(
                    "FailedPrecondition",
                    "etcd does not run on this node (a worker, or no cluster.etcd.ca)",
                ))
            } else if let Some(left) = leave.as_ref().filter(|_| op != "leave") {
                Some(refuse(
                    "FailedPrecondition",
                    format!(
                        "this node left the etcd cluster (member {}): etcd stays stopped until the node restarts",
                        left.spec.member_id
                    ),
                ))
            } else if op == "leave" {
                match self
                    .leave(&id, leave.as_ref(), certs.as_ref(), data, wipe.as_ref())
                    .await
                {
                    Leave::Left(l) => {
                        leave = Some(l);
                        again = true;
                        None
                    }
                    Leave::Waiting => {
                        again = true;
                        None
                    }
                    Leave::Answer(a) => Some(a),
                }
            } else if let Some(certs) = certs.as_ref().filter(|_| op == "snapshot") {
                let (answer, last) = snapshot(ctx, &id, &certs.spec).await?;
                if let Some(last) = last {
                    self.last_chunks.insert(id.clone(), last);
                }
                answer
            } else if let Some(certs) = certs.as_ref() {
                Some(run(op, req.spec.member_id, &certs.spec).await)
            } else {
                Some(refuse(
                    "Unavailable",
                    "etcd's certificates are not there yet",
                ))
            };
            if let Some(a) = answer {
                if a.code.is_empty() {
                    tracing::info!(request = %id, operation = op, message = %a.message, "etcd operation done");
                } else {
                    tracing::warn!(request = %id, operation = op, code = %a.code, message = %a.message, "etcd operation refused or failed");
                }
                answers.push(Resource::new(NAMESPACE, id, a));
            }
        }
        if let Some(l) = leave {
            ctx.apply(l).await?;
        }
        self.last_chunks
            .retain(|id, _| requests.iter().any(|r| r.id() == id));
        for (id, chunk) in &self.last_chunks {
            ctx.apply(Resource::new(NAMESPACE, id.clone(), chunk.clone()))
                .await?;
        }
        ctx.apply_all(answers).await?;
        Ok(if again {
            Action::RequeueAfter(LEAVE_POLL)
        } else {
            Action::AwaitChange
        })
    }
}

/// Streams etcd's snapshot to apid for request `id`: the answer (`None` when apid went away:
/// nothing to answer) and the last chunk written.
async fn snapshot(
    ctx: &mut Context,
    id: &str,
    certs: &EtcdCertsSpec,
) -> Result<(Option<Answer>, Option<EtcdSnapshotChunkSpec>), ReconcileError> {
    use base64::Engine as _;
    let mut client = match local(certs).await {
        Ok(c) => c,
        Err(a) => return Ok((Some(a), None)),
    };
    let mut stream = match within(
        super::join::CALL_TIMEOUT,
        "etcd snapshot",
        client.snapshot(),
    )
    .await
    {
        Ok(s) => s,
        Err(a) => return Ok((Some(a), None)),
    };
    let (mut seq, mut total, mut buf, mut eof) = (0u64, 0u64, Vec::new(), false);
    let mut last = None;
    while !eof {
        match tokio::time::timeout(SNAPSHOT_READ_TIMEOUT, stream.message()).await {
            Ok(Ok(Some(m))) => buf.extend_from_slice(m.blob()),
            Ok(Ok(None)) => eof = true,
            Ok(Err(e)) => return Ok((Some(etcd_error("etcd snapshot", &e)), last)),
            Err(_) => {
                return Ok((
                    Some(refuse("Unavailable", "etcd snapshot: etcd stopped sending")),
                    last,
                ))
            }
        }
        while buf.len() >= SNAPSHOT_CHUNK || (eof && !buf.is_empty()) {
            let rest = buf.split_off(buf.len().min(SNAPSHOT_CHUNK));
            let data = std::mem::replace(&mut buf, rest);
            total += data.len() as u64;
            seq += 1;
            let chunk = EtcdSnapshotChunkSpec {
                seq,
                data: base64::engine::general_purpose::STANDARD.encode(&data),
                eof: false,
            };
            ctx.apply(Resource::new(NAMESPACE, id, chunk.clone()))
                .await?;
            last = Some(chunk);
            match acked(ctx, id, seq).await? {
                Ok(()) => {}
                Err(None) => return Ok((None, last)),
                Err(Some(a)) => return Ok((Some(a), last)),
            }
        }
    }
    let chunk = EtcdSnapshotChunkSpec {
        seq: seq + 1,
        data: String::new(),
        eof: true,
    };
    ctx.apply(Resource::new(NAMESPACE, id, chunk.clone()))
        .await?;
    tracing::info!(request = %id, bytes = total, "etcd snapshot streamed to apid");
    Ok((
        Some(done(format!("snapshot of {total} bytes"))),
        Some(chunk),
    ))
}

/// Waits until apid acknowledged chunk `seq` of request `id`: `Err(None)` when the request
/// is gone (the caller went away), `Err(Some(answer))` when apid is too slow.
async fn acked(
    ctx: &Context,
    id: &str,
    seq: u64,
) -> Result<Result<(), Option<Answer>>, ReconcileError> {
    let start = std::time::Instant::now();
    let mut wait = Duration::from_millis(1);
    loop {
        match ctx.get::<EtcdOperationRequestSpec>(APID, id).await? {
            None => return Ok(Err(None)),
            Some(r) if r.spec.acked >= seq => return Ok(Ok(())),
            Some(_) => {}
        }
        if start.elapsed() > ACK_TIMEOUT {
            return Ok(Err(Some(refuse(
                "Unavailable",
                format!(
                    "apid did not take snapshot chunk {seq} within {} s",
                    ACK_TIMEOUT.as_secs()
                ),
            ))));
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(20));
    }
}

/// Where a leave stands.
enum Leave {
    /// The member was removed just now: this is the leave to keep.
    Left(Resource<EtcdLeaveSpec>),
    /// etcd is stopping, or its data being removed.
    Waiting,
    /// The answer.
    Answer(Answer),
}

impl OperationController {
    async fn leave(
        &self,
        request: &str,
        left: Option<&Resource<EtcdLeaveSpec>>,
        certs: Option<&Resource<EtcdCertsSpec>>,
        data: bool,
        wipe: Option<&ServiceStatusSpec>,
    ) -> Leave {
        if let Some(left) = left {
            if !data {
                return Leave::Answer(done(format!(
                    "member {} left the etcd cluster; etcd is stopped and its data removed",
                    left.spec.member_id
                )));
            }
            return match wipe {
                Some(w) if w.state == ServiceState::Failed => Leave::Answer(refuse(
                    "Internal",
                    format!(
                        "member {} left the etcd cluster, but its data could not be removed: {}",
                        left.spec.member_id, w.message
                    ),
                )),
                _ => Leave::Waiting,
            };
        }
        let Some(certs) = certs else {
            return Leave::Answer(refuse(
                "Unavailable",
                "etcd's certificates are not there yet",
            ));
        };
        match remove_self(&certs.spec).await {
            Ok(member) => {
                tracing::info!(member = %format!("{member:016x}"), "left the etcd cluster: stopping etcd and removing its data");
                Leave::Left(Resource::new(
                    NAMESPACE,
                    ETCD_ID,
                    EtcdLeaveSpec {
                        member_id: format!("{member:016x}"),
                        request: request.to_string(),
                    },
                ))
            }
            Err(a) => Leave::Answer(a),
        }
    }
}

async fn local(certs: &EtcdCertsSpec) -> Result<Client, Answer> {
    super::health::local_client(certs).await.map_err(|e| {
        refuse(
            "Unavailable",
            format!("etcd is not answering on this node: {e}"),
        )
    })
}

/// Removes the local member through the other voting members (the local one when there is
/// none), as upstream's `LeaveCluster`: its own ID from the local member's status; a member
/// that is gone already counts as removed.
async fn remove_self(certs: &EtcdCertsSpec) -> Result<u64, Answer> {
    let mut client = local(certs).await?;
    let t = super::join::CALL_TIMEOUT;
    let status = within(t, "etcd status", client.status()).await?;
    let own = status.header().map(|h| h.member_id()).unwrap_or_default();
    if own == 0 {
        return Err(refuse("Internal", "etcd's status names no member"));
    }
    let members = within(t, "etcd member list", client.member_list()).await?;
    let others: Vec<String> = members
        .members()
        .iter()
        .filter(|m| m.id() != own && !m.is_learner())
        .flat_map(|m| m.client_urls().to_vec())
        .collect();
    if others.is_empty() {
        return Err(refuse(
            "FailedPrecondition",
            "this member is the only voting member of the etcd cluster: it cannot leave it",
        ));
    }
    let mut remote = match super::join::client(certs, &others, None).await {
        Ok(c) => c,
        Err(_) => client,
    };
    match remove_member(&mut remote, own).await {
        Ok(()) => Ok(own),
        Err(e) if is_member_not_found(&e) => Ok(own),
        Err(e) => Err(etcd_error("removing this member", &e)),
    }
}

/// Runs one of the operations that need only the local member.
async fn run(op: &str, member_id: u64, certs: &EtcdCertsSpec) -> Answer {
    match try_run(op, member_id, certs).await {
        Ok(a) | Err(a) => a,
    }
}

async fn try_run(op: &str, member_id: u64, certs: &EtcdCertsSpec) -> Result<Answer, Answer> {
    let t = super::join::CALL_TIMEOUT;
    match op {
        "remove-member" => {
            if member_id == 0 {
                return Err(refuse("InvalidArgument", "member ID 0 names no member"));
            }
            let mut client = local(certs).await?;
            let members = within(t, "etcd member list", client.member_list()).await?;
            if !members.members().iter().any(|m| m.id() == member_id) {
                return Err(refuse(
                    "NotFound",
                    format!("etcd member {member_id:016x} not found"),
                ));
            }
            match remove_member(&mut client, member_id).await {
                Ok(()) => Ok(done(format!("etcd member {member_id:016x} removed"))),
                Err(e) if is_member_not_found(&e) => Err(refuse(
                    "NotFound",
                    format!("etcd member {member_id:016x} not found"),
                )),
                Err(e) => Err(etcd_error("removing the member", &e)),
            }
        }
        "forfeit-leadership" => {
            let mut client = local(certs).await?;
            let status = within(t, "etcd status", client.status()).await?;
            let own = status.header().map(|h| h.member_id()).unwrap_or_default();
            if status.leader() != own {
                return Ok(done("this member is not the leader"));
            }
            let members = within(t, "etcd member list", client.member_list()).await?;
            let Some(to) = members
                .members()
                .iter()
                .find(|m| m.id() != own && !m.is_learner())
            else {
                return Err(refuse(
                    "FailedPrecondition",
                    "no other voting member to hand the leadership to",
                ));
            };
            let (to_id, to_name) = (to.id(), to.name().to_string());
            within(t, "moving the leadership", client.move_leader(to_id)).await?;
            Ok(Answer {
                member: to_name.clone(),
                ..done(format!("leadership moved to {to_name} ({to_id:016x})"))
            })
        }
        "defragment" => {
            let mut client = local(certs).await?;
            within(DEFRAG_TIMEOUT, "defragmenting", client.defragment()).await?;
            Ok(done("defragmented"))
        }
        "alarm-list" | "alarm-disarm" => {
            let mut client = local(certs).await?;
            let list = within(
                t,
                "listing alarms",
                client.alarm(AlarmAction::Get, AlarmType::None, None),
            )
            .await?;
            let raised: Vec<(u64, AlarmType)> = list
                .alarms()
                .iter()
                .map(|a| (a.member_id(), a.alarm()))
                .collect();
            if op == "alarm-disarm" {
                for (member, alarm) in &raised {
                    let mut o = AlarmOptions::new();
                    o.with_member(*member);
                    within(
                        t,
                        "disarming an alarm",
                        client.alarm(AlarmAction::Deactivate, *alarm, Some(o)),
                    )
                    .await?;
                }
            }
            Ok(Answer {
                alarms: raised
                    .into_iter()
                    .map(|(member_id, a)| EtcdAlarmInfo {
                        member_id,
                        alarm: alarm_name(a).to_string(),
                    })
                    .collect(),
                ..done(op)
            })
        }
        other => Err(refuse(
            "InvalidArgument",
            format!("unknown etcd operation {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_have_upstreams_names() {
        assert_eq!(alarm_name(AlarmType::Nospace), "NOSPACE");
        assert_eq!(alarm_name(AlarmType::Corrupt), "CORRUPT");
        assert_eq!(alarm_name(AlarmType::None), "NONE");
    }

    #[tokio::test]
    async fn an_unknown_operation_is_an_invalid_argument() {
        let a = run("format-disk", 0, &EtcdCertsSpec::default()).await;
        assert_eq!(a.code, "InvalidArgument");
        let a = run("remove-member", 0, &EtcdCertsSpec::default()).await;
        assert_eq!(a.code, "InvalidArgument");
    }
}
