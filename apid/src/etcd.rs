//! `EtcdMemberList` and `EtcdStatus`: apid holds no etcd credentials and cannot reach etcd
//! (landlock: TCP 50000 only). It answers from `etcd/EtcdStatuses`, which k8sd refreshes from
//! the local member every 5 s (upstream's machined asks etcd at the call: these answers may be
//! up to that old, and `query_local` makes no difference).

use machinery::resources::etcd::{EtcdStatusSpec, ETCD_ID, NAMESPACE};
use proto::machine::{EtcdMember, EtcdMemberStatus, EtcdMembers, EtcdStatus};
use tonic::Status;

use crate::request::unavailable;

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
