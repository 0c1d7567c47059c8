//! apid's namespace (ours): what apid asks of other daemons. Today one thing: a client
//! certificate for `GenerateClientConfiguration` (`ClientCertificateRequests`), which secretsd,
//! the only daemon holding the OS CA key, answers in `secrets/ClientCertificates` under the same
//! ID. apid makes the key and keeps it; only the CSR and the roles cross stated. And apid's
//! maintenance certificate (`MaintenanceServerCertificates`), kept so that a restarted apid serves
//! the fingerprint it logged.

use cosi::{ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// apid's namespace.
pub const NAMESPACE: &str = "apid";

/// The Talos API roles upstream knows (`role.All`): what a client certificate may carry.
pub const KNOWN_ROLES: &[&str] = &[
    "os:admin",
    "os:operator",
    "os:reader",
    "os:etcd:backup",
    "os:image:verifier",
    "os:meta:writer",
    "os:impersonator",
];

/// Requests apid may have open at once (secretsd answers no more than these).
pub const MAX_CLIENT_CERTIFICATE_REQUESTS: usize = 8;

/// A request for a Talos API client certificate (`ClientCertificateRequests`, a random ID per
/// call), written by apid for an admin's `GenerateClientConfiguration` and destroyed once
/// answered. A CSR and roles are not secret: the type is not sensitive.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificateRequestSpec {
    /// The CSR for apid's new key, PEM (only its public key is used).
    pub csr: String,
    /// The roles the certificate carries (its Organization).
    #[serde(default)]
    pub roles: Vec<String>,
    /// Its validity, in seconds.
    pub ttl_seconds: u64,
    /// The CA that signs it: [`AUTHORITY_OS`] (empty: the Talos API's, with the roles) or
    /// [`AUTHORITY_KUBERNETES`] (`talosctl kubeconfig`: the Kubernetes CA, subject `admin` /
    /// `system:masters`, no roles).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub authority: String,
}

/// [`ClientCertificateRequestSpec::authority`]: the OS CA (the Talos API).
pub const AUTHORITY_OS: &str = "";
/// [`ClientCertificateRequestSpec::authority`]: the Kubernetes CA (an admin kubeconfig).
pub const AUTHORITY_KUBERNETES: &str = "kubernetes";

impl ResourceSpec for ClientCertificateRequestSpec {
    const TYPE: &'static str = "ClientCertificateRequests.apid.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("Roles", "{.roles}")])
    }
}

/// A `talosctl bootstrap` (`EtcdBootstrapRequests`, a random ID per call), written by apid and
/// destroyed once k8sd answered it in `etcd/EtcdBootstrapAnswers` under the same ID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBootstrapRequestSpec {
    /// Restore the snapshot uploaded with `EtcdRecover` first (`--recover-from`).
    #[serde(default)]
    pub recover_etcd: bool,
    /// Skip the snapshot's hash check (a copied `member/snap/db`).
    #[serde(default)]
    pub recover_skip_hash_check: bool,
}

impl ResourceSpec for EtcdBootstrapRequestSpec {
    const TYPE: &'static str = "EtcdBootstrapRequests.apid.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

/// An etcd operation asked through apid (`EtcdOperationRequests`, a random ID per call):
/// `remove-member`, `leave`, `forfeit-leadership`, `defragment`, `alarm-list`, `alarm-disarm`,
/// `snapshot`.
/// Written by apid, destroyed once k8sd answered in `etcd/EtcdOperationAnswers` (or the call
/// ended). apid takes one at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdOperationRequestSpec {
    /// What to do.
    pub operation: String,
    /// The member (`remove-member`).
    #[serde(default)]
    pub member_id: u64,
    /// `snapshot`: the last chunk (`etcd/EtcdSnapshotChunks`, same ID) apid has passed on;
    /// k8sd writes the next one only then.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub acked: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ResourceSpec for EtcdOperationRequestSpec {
    const TYPE: &'static str = "EtcdOperationRequests.apid.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Operation", "{.operation}")])
    }
}

/// One chunk of a snapshot uploaded with `EtcdRecover` (`EtcdRecoverChunks`, a random ID per
/// upload): apid writes chunk `seq` once k8sd acknowledged `seq - 1` in
/// `etcd/EtcdRecoverAcks` (one chunk live at a time); the last one has `eof`. Destroyed when
/// the upload ends. Sensitive: a reader never sees the backup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRecoverChunkSpec {
    /// 1, 2, …
    pub seq: u64,
    /// The bytes, base64 (at most 256 KiB of them).
    #[serde(default)]
    pub data: String,
    /// The upload ends here.
    #[serde(default)]
    pub eof: bool,
}

impl ResourceSpec for EtcdRecoverChunkSpec {
    const TYPE: &'static str = "EtcdRecoverChunks.apid.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        // A piece of an etcd backup being restored: as sensitive as the snapshot it is.
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
            .with_columns(&[("Seq", "{.seq}"), ("EOF", "{.eof}")])
            .sensitive()
    }
}

/// ID of [`MaintenanceCertificateSpec`].
pub const MAINTENANCE_ID: &str = "maintenance";

/// apid's self-signed certificate of the maintenance API (`MaintenanceServerCertificates`, ID
/// `maintenance`), made when a node without configuration first serves it and removed once
/// the node is configured: a restarted apid serves the same certificate, so the fingerprint a
/// user pinned from the console still holds. Not durable (a reboot makes a new one, as
/// upstream's does). Holds a private key: sensitive (admin only through apid; no other daemon
/// reads `apid` but secretsd, which may read only the requests).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceCertificateSpec {
    /// The certificate and its key.
    pub server: crate::resources::secrets::CertificateAndKey,
}

impl ResourceSpec for MaintenanceCertificateSpec {
    const TYPE: &'static str = "MaintenanceServerCertificates.apid.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).sensitive()
    }
}

/// Definitions of every type of the namespace.
pub fn definitions() -> Vec<ResourceDefinition> {
    vec![
        ClientCertificateRequestSpec::definition(),
        MaintenanceCertificateSpec::definition(),
        EtcdBootstrapRequestSpec::definition(),
        EtcdOperationRequestSpec::definition(),
        EtcdRecoverChunkSpec::definition(),
    ]
}
