//! The `etcd` namespace (written by k8sd, on control planes): etcd's configuration, its spec,
//! its certificates on disk and its membership. Types, IDs and fields follow upstream's
//! `pkg/machinery/resources/etcd`; [`EtcdStatusSpec`] and the bootstrap types are ours (upstream
//! keeps the service's health in machined's service runner and the bootstrap flag in the
//! service instance, which a separate daemon cannot share).

use std::collections::BTreeMap;
use std::net::IpAddr;

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// etcd's namespace.
pub const NAMESPACE: &str = "etcd";
/// The ID of [`EtcdConfigSpec`], [`EtcdSpecSpec`], [`PkiStatusSpec`], [`EtcdStatusSpec`] and
/// [`EtcdBootstrapSpec`].
pub const ETCD_ID: &str = "etcd";
/// The ID of [`EtcdMemberSpec`]: this node's member.
pub const LOCAL_MEMBER_ID: &str = "local";
/// The ID of etcd's requested service (`ServiceSpecs.runtime.talos.dev` in this namespace).
pub const SERVICE_ID: &str = "etcd";
/// etcd's client port.
pub const CLIENT_PORT: u16 = 2379;
/// etcd's peer port.
pub const PEER_PORT: u16 = 2380;

/// etcd's flags k8sd pins (upstream's deny list: `cluster.etcd.extraArgs` may not give them;
/// a configuration that does is refused). `initial-cluster-state`, `initial-cluster`,
/// `initial-advertise-peer-urls` and `advertise-client-urls` are not here: a user may set those.
pub const PINNED_ARGS: &[&str] = &[
    "name",
    "auto-tls",
    "peer-auto-tls",
    "data-dir",
    "listen-peer-urls",
    "listen-client-urls",
    "client-cert-auth",
    "cert-file",
    "key-file",
    "trusted-ca-file",
    "peer-client-cert-auth",
    "peer-cert-file",
    "peer-key-file",
    "peer-trusted-ca-file",
    "experimental-initial-corrupt-check",
    "experimental-watch-progress-notify-interval",
    "logger",
    "log-outputs",
];

/// etcd's configuration from the machine configuration (`EtcdConfigs`, ID `etcd`), on control
/// planes with an etcd CA (upstream `etcd.ConfigController`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdConfigSpec {
    /// Subnets the advertised address is picked from (`cluster.etcd.advertisedSubnets`).
    #[serde(default)]
    pub advertise_valid_subnets: Vec<String>,
    /// Addresses never advertised: every shared VIP of the configuration.
    #[serde(default)]
    pub advertise_exclude_subnets: Vec<String>,
    /// Subnets etcd listens on (`cluster.etcd.listenSubnets`); all addresses when empty.
    #[serde(default)]
    pub listen_valid_subnets: Vec<String>,
    /// Addresses never listened on (the VIPs).
    #[serde(default)]
    pub listen_exclude_subnets: Vec<String>,
    /// `cluster.etcd.image`: reported, not run (the node runs Debian's etcd binary).
    #[serde(default)]
    pub image: String,
    /// `cluster.etcd.extraArgs`.
    #[serde(default)]
    pub extra_args: BTreeMap<String, String>,
}

impl ResourceSpec for EtcdConfigSpec {
    const TYPE: &'static str = "EtcdConfigs.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

/// An `EtcdConfig` resource.
pub type EtcdConfig = Resource<EtcdConfigSpec>;

/// What etcd runs with (`EtcdSpecs`, ID `etcd`; upstream `etcd.SpecController`): its name and
/// the addresses it advertises and listens on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpecSpec {
    /// The member name: the node's hostname.
    pub name: String,
    /// Advertised peer and client addresses.
    #[serde(default)]
    pub advertised_addresses: Vec<IpAddr>,
    /// Addresses of the peer listener (`0.0.0.0` for all).
    #[serde(default)]
    pub listen_peer_addresses: Vec<IpAddr>,
    /// Addresses of the client listener (`0.0.0.0` for all).
    #[serde(default)]
    pub listen_client_addresses: Vec<IpAddr>,
    /// As [`EtcdConfigSpec::image`].
    #[serde(default)]
    pub image: String,
    /// As [`EtcdConfigSpec::extra_args`].
    #[serde(default)]
    pub extra_args: BTreeMap<String, String>,
}

impl ResourceSpec for EtcdSpecSpec {
    const TYPE: &'static str = "EtcdSpecs.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // `es` is EtcdSecrets' (secretsd's): stated refuses a name of another owner's type.
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .without_aliases(&["es", "ess"])
            .with_columns(&[
                ("Name", "{.name}"),
                ("Advertised", "{.advertisedAddresses}"),
            ])
    }
}

/// An `EtcdSpec` resource.
pub type EtcdSpec = Resource<EtcdSpecSpec>;

/// etcd's certificates are on disk (`PKIStatuses`, ID `etcd`; upstream `etcd.PKIController`):
/// `version` is the version of `secrets/EtcdSecrets` they were written from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PkiStatusSpec {
    /// The files are written.
    pub ready: bool,
    /// `EtcdSecrets` version and `EtcdRootSecrets` version (`12-3`).
    pub version: String,
}

impl ResourceSpec for PkiStatusSpec {
    const TYPE: &'static str = "PKIStatuses.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Ready", "{.ready}"), ("Version", "{.version}")])
    }
}

/// This node's etcd member (`EtcdMembers`, ID `local`; upstream `etcd.MemberController`): exists
/// while etcd runs and answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberSpec {
    /// The member ID, 16 hex digits (`%016x`).
    pub member_id: String,
}

impl ResourceSpec for EtcdMemberSpec {
    const TYPE: &'static str = "EtcdMembers.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("Member ID", "{.memberId}")])
    }
}

/// Where etcd stands on this node (`EtcdStatuses`, ID `etcd`; ours: upstream's service runner
/// holds this as the etcd service's health). The quorum check (a linearizable read of key
/// `health`, as upstream's `ValidateQuorum`) runs every few seconds while etcd runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdStatusSpec {
    /// `waiting` (for its inputs, or for a bootstrap), `starting`, `joining`, `healthy`, `unhealthy`,
    /// `left` (`talosctl etcd leave`: stopped until the node restarts).
    pub phase: String,
    /// The last quorum check passed.
    pub healthy: bool,
    /// The local member's ID (16 hex digits) once known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub member_id: String,
    /// How etcd was (or will be) started: `bootstrap` (a new cluster of this member), `join`
    /// (a learner of an existing cluster), `resume` (from its data directory).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub start: String,
    /// Why it is in its phase, for a human.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The cluster's members as the local member listed them at the last check (what
    /// `talosctl etcd members` shows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<EtcdMemberInfo>,
    /// The local member's status at the last check (`talosctl etcd status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_status: Option<EtcdMemberStatusInfo>,
}

/// One member of the cluster (upstream's `machine.EtcdMember`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberInfo {
    /// Its ID.
    pub id: u64,
    /// Its name (the node's hostname); empty for a learner that has not started.
    pub hostname: String,
    /// Its peer URLs.
    #[serde(default)]
    pub peer_urls: Vec<String>,
    /// Its client URLs.
    #[serde(default)]
    pub client_urls: Vec<String>,
    /// A learner (not voting yet).
    #[serde(default)]
    pub is_learner: bool,
}

/// The local member's status (upstream's `machine.EtcdMemberStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberStatusInfo {
    /// Its ID.
    pub member_id: u64,
    /// etcd's version.
    pub protocol_version: String,
    /// The database's size, bytes.
    pub db_size: i64,
    /// Of which in use, bytes.
    pub db_size_in_use: i64,
    /// The leader's member ID.
    pub leader: u64,
    /// Raft index.
    pub raft_index: u64,
    /// Raft term.
    pub raft_term: u64,
    /// Raft applied index.
    pub raft_applied_index: u64,
    /// Errors the member reports.
    #[serde(default)]
    pub errors: Vec<String>,
    /// A learner.
    #[serde(default)]
    pub is_learner: bool,
}

impl ResourceSpec for EtcdStatusSpec {
    const TYPE: &'static str = "EtcdStatuses.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // `es` would be EtcdSecrets' (and EtcdSpec's): none.
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .without_aliases(&["es", "ess"])
            .with_columns(&[
                ("Phase", "{.phase}"),
                ("Healthy", "{.healthy}"),
                ("Member ID", "{.memberId}"),
                ("Message", "{.message}"),
            ])
    }
}

/// This node was asked to bootstrap etcd (`EtcdBootstraps`, ID `etcd`; ours): k8sd keeps it
/// while the data directory is still empty, so that a restarted k8sd still starts a new
/// cluster rather than waiting to join one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBootstrapSpec {
    /// The request (`apid/EtcdBootstrapRequests`) that was accepted.
    pub request: String,
    /// Restore the uploaded snapshot ([`RECOVER_SNAPSHOT`]) before etcd starts
    /// (`--recover-from`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recover: bool,
    /// Skip the snapshot's hash check (a copied `member/snap/db`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_hash_check: bool,
}

/// Where k8sd keeps an uploaded snapshot (`EtcdRecover`), in its recovery directory
/// (`/var/lib/etcd-recover`, setgid etcd's group: the restore reads it). Removed once restored.
pub const RECOVER_SNAPSHOT: &str = "snapshot.db";
/// The largest snapshot an upload may bring (etcd's own database limit).
pub const MAX_RECOVER_BYTES: u64 = 8 * 1024 * 1024 * 1024;
/// The one-shot service that restores the snapshot (`etcdctl snapshot restore`, etcd's uid).
pub const RESTORE_SERVICE_ID: &str = "etcd-restore";
/// The one-shot service that moves the restored member into the data directory (k8sd's
/// program with `--adopt-restored`, etcd's uid).
pub const ADOPT_SERVICE_ID: &str = "etcd-restore-adopt";
/// Where the restore writes, inside etcd's data directory (etcd 3.4's restore refuses an
/// existing directory, and the data directory is k8sd's).
pub const RESTORE_DIR: &str = ".restore";

/// k8sd's acknowledgement of an upload (`EtcdRecoverAcks`, the ID of the
/// `apid/EtcdRecoverChunks` it answers; ours): the last chunk written to disk, the end, or why
/// the upload failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRecoverAckSpec {
    /// The last chunk on disk.
    #[serde(default)]
    pub acked: u64,
    /// The snapshot is complete (synced and renamed into place).
    #[serde(default)]
    pub done: bool,
    /// Its size, bytes.
    #[serde(default)]
    pub size: u64,
    /// Why the upload failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl ResourceSpec for EtcdRecoverAckSpec {
    const TYPE: &'static str = "EtcdRecoverAcks.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Acked", "{.acked}"), ("Done", "{.done}")])
    }
}

impl ResourceSpec for EtcdBootstrapSpec {
    const TYPE: &'static str = "EtcdBootstraps.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

/// k8sd's answer to one `apid/EtcdBootstrapRequests` of the same ID (`EtcdBootstrapAnswers`;
/// ours): accepted, or the gRPC code and message apid returns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBootstrapAnswerSpec {
    /// Empty when accepted; else `AlreadyExists`, `FailedPrecondition`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code: String,
    /// What the caller is told.
    pub message: String,
}

impl ResourceSpec for EtcdBootstrapAnswerSpec {
    const TYPE: &'static str = "EtcdBootstrapAnswers.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Code", "{.code}"), ("Message", "{.message}")])
    }
}

/// k8sd's answer to one `apid/EtcdOperationRequests` of the same ID (`EtcdOperationAnswers`;
/// ours): done, or the gRPC code and message apid returns, with what the operation found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdOperationAnswerSpec {
    /// Empty when done; else `NotFound`, `FailedPrecondition`, `Unavailable`, `Internal`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code: String,
    /// What the caller is told.
    #[serde(default)]
    pub message: String,
    /// `alarm-list`: the alarms; `alarm-disarm`: those disarmed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alarms: Vec<EtcdAlarmInfo>,
    /// `forfeit-leadership`: the member the leadership moved to (empty: this member was not
    /// the leader).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub member: String,
}

/// One raised alarm (upstream's `machine.EtcdMemberAlarm`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdAlarmInfo {
    /// The member that raised it.
    pub member_id: u64,
    /// `NOSPACE`, `CORRUPT` (`NONE` otherwise).
    pub alarm: String,
}

impl ResourceSpec for EtcdOperationAnswerSpec {
    const TYPE: &'static str = "EtcdOperationAnswers.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Code", "{.code}"), ("Message", "{.message}")])
    }
}

/// The largest chunk of a snapshot in [`EtcdSnapshotChunkSpec`] (base64 in the spec: well
/// under stated's 1 MiB per resource).
pub const SNAPSHOT_CHUNK: usize = 256 * 1024;

/// One chunk of an etcd snapshot on its way to apid (`EtcdSnapshotChunks`, the ID of the
/// `apid/EtcdOperationRequests` that asked; ours): k8sd reads etcd's snapshot stream and
/// writes chunk `seq` once apid acknowledged `seq - 1` in its request, so one chunk is live at
/// a time whatever the database's size (and, the type being sensitive, stated's history keeps
/// only a few past ones: `stated::store::SENSITIVE_HISTORY`). The last one
/// has `eof`. Sensitive: a reader never sees the database.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSnapshotChunkSpec {
    /// 1, 2, …
    pub seq: u64,
    /// The bytes, base64 (at most [`SNAPSHOT_CHUNK`] of them).
    #[serde(default)]
    pub data: String,
    /// The snapshot ends here.
    #[serde(default)]
    pub eof: bool,
}

impl ResourceSpec for EtcdSnapshotChunkSpec {
    const TYPE: &'static str = "EtcdSnapshotChunks.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // A piece of the cluster's whole database: only for the roles that may take a
        // snapshot (upstream: admin, operator, etcd:backup), never for a reader.
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Seq", "{.seq}"), ("EOF", "{.eof}")])
            .sensitive()
    }
}

/// This node left the etcd cluster (`EtcdLeaves`, ID `etcd`; ours: upstream stops the etcd
/// service in place): k8sd removed its member, and etcd stays stopped, with its data removed,
/// while this resource lives (until the node restarts, as upstream's stopped service).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdLeaveSpec {
    /// The removed member, 16 hex digits.
    pub member_id: String,
    /// The request (`apid/EtcdOperationRequests`) that asked for it.
    pub request: String,
}

impl ResourceSpec for EtcdLeaveSpec {
    const TYPE: &'static str = "EtcdLeaves.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("Member ID", "{.memberId}")])
    }
}

/// The ID of the one-shot service that removes etcd's data after a leave
/// (`ServiceSpecs.runtime.talos.dev` in this namespace).
pub const WIPE_SERVICE_ID: &str = "etcd-wipe";

/// The namespace of [`VipElectionSpec`] (written by k8sd, read by networkd): apart from
/// `etcd` so that reading who holds a shared IP does not let networkd read etcd's snapshots.
pub const VIP_NAMESPACE: &str = "vip";

/// etcd's election key of a shared IP (upstream's `talos:v1:vip:election:<IP>`: the same key,
/// so that a node of either kind sees the other's campaign).
pub fn vip_election_key(ip: &IpAddr) -> String {
    format!("talos:v1:vip:election:{ip}")
}

/// Where this node stands in the election of a shared IP (`VIPElections`, namespace
/// [`VIP_NAMESPACE`], ID = the IP; ours: upstream's VIP operator keeps it in machined's
/// memory). k8sd campaigns in etcd, as upstream (a lease, the election key, the node's name as
/// the value); networkd assigns the IP while `leader` is true, on the link its own
/// OperatorSpec names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VipElectionSpec {
    /// The shared IP.
    pub ip: String,
    /// This node won the election and holds the IP.
    pub leader: bool,
    /// The current leader's name as etcd says (empty when nobody holds it or etcd cannot be
    /// asked).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub holder: String,
    /// This node's etcd lease in the election (16 hex digits), while campaigning or leading.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lease_id: String,
    /// Why it stands there, for a human.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ResourceSpec for VipElectionSpec {
    const TYPE: &'static str = "VIPElections.etcd.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = VIP_NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, VIP_NAMESPACE).with_columns(&[
            ("Leader", "{.leader}"),
            ("Holder", "{.holder}"),
            ("Message", "{.message}"),
        ])
    }
}

/// Definitions of every type of the namespace.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![
        VipElectionSpec::definition(),
        EtcdConfigSpec::definition(),
        EtcdSpecSpec::definition(),
        PkiStatusSpec::definition(),
        EtcdMemberSpec::definition(),
        EtcdStatusSpec::definition(),
        EtcdBootstrapSpec::definition(),
        EtcdBootstrapAnswerSpec::definition(),
        EtcdOperationAnswerSpec::definition(),
        EtcdLeaveSpec::definition(),
        EtcdSnapshotChunkSpec::definition(),
        EtcdRecoverAckSpec::definition(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_upstream() {
        assert_eq!(EtcdConfigSpec::TYPE, "EtcdConfigs.etcd.talos.dev");
        assert_eq!(EtcdSpecSpec::TYPE, "EtcdSpecs.etcd.talos.dev");
        assert_eq!(PkiStatusSpec::TYPE, "PKIStatuses.etcd.talos.dev");
        assert_eq!(EtcdMemberSpec::TYPE, "EtcdMembers.etcd.talos.dev");
        let m = serde_json::to_value(EtcdMemberSpec {
            member_id: "0123456789abcdef".into(),
        })
        .unwrap();
        assert_eq!(m["memberId"], "0123456789abcdef");
        for d in definitions() {
            assert!(
                d.resource_type.ends_with(".etcd.talos.dev"),
                "{}",
                d.resource_type
            );
        }
    }
}
