//! `etcd.HealthController` (ours; upstream's etcd service health check and
//! `etcd.MemberController` in one): while init runs etcd, a linearizable read of key `health`
//! through the local client URL with the admin certificate every [`PERIOD`] (upstream's
//! `ValidateQuorum`: it needs a quorum; permission denied counts as healthy), the member ID
//! from the answer's header. Writes `EtcdStatus` always and `EtcdMember/local` while healthy.

use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use etcd_client::Client;
use machinery::resources::etcd::{
    EtcdBootstrapSpec, EtcdLeaveSpec, EtcdMemberInfo, EtcdMemberSpec, EtcdMemberStatusInfo,
    EtcdSpecSpec, EtcdStatusSpec, PkiStatusSpec, CLIENT_PORT, ETCD_ID, LOCAL_MEMBER_ID, NAMESPACE,
    SERVICE_ID,
};
use machinery::resources::runtime::{
    ServiceSpecSpec, ServiceState, ServiceStatusSpec, NAMESPACE as RUNTIME,
};
use machinery::resources::secrets::{
    EtcdCertsSpec, ETCD_ID as SECRETS_ETCD_ID, NAMESPACE as SECRETS,
};

/// How often the quorum is checked.
pub const PERIOD: Duration = Duration::from_secs(5);
/// How long one check may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A client of the local member with the admin certificate (its server certificate names
/// `localhost` and 127.0.0.1).
///
/// # Errors
///
/// Why the member cannot be reached.
pub async fn local_client(certs: &EtcdCertsSpec) -> Result<Client, String> {
    super::join::client(
        certs,
        &[format!("https://127.0.0.1:{CLIENT_PORT}")],
        Some("localhost"),
    )
    .await
}

/// How often a learner asks to be promoted (upstream: every 2 s).
pub const PROMOTE_RETRY: Duration = Duration::from_secs(2);

/// `etcd.HealthController`.
#[derive(Default)]
pub struct HealthController {
    /// The client, with the `EtcdSecrets` version it was made from.
    client: Option<(u64, Client)>,
    /// The joined member was seen voting (no more promotion to ask for).
    voting: bool,
}

/// The outcome of one check: `Ok(member ID)`, or why not.
async fn check(client: &mut Client) -> Result<u64, String> {
    match tokio::time::timeout(TIMEOUT, client.get("health", None)).await {
        Err(_) => Err(format!("no answer within {} s", TIMEOUT.as_secs())),
        Ok(Ok(r)) => r
            .header()
            .map(|h| h.member_id())
            .ok_or_else(|| "the answer has no header".to_string()),
        Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.code() == tonic::Code::PermissionDenied => {
            // Upstream counts it healthy: the cluster answered. No member ID then.
            Ok(0)
        }
        Ok(Err(e)) => Err(e.to_string()),
    }
}

/// The members and the local member's status, as the local member tells them (best effort:
/// what fails is left out).
async fn details(client: &mut Client) -> (Vec<EtcdMemberInfo>, Option<EtcdMemberStatusInfo>) {
    let members = match tokio::time::timeout(TIMEOUT, client.member_list()).await {
        Ok(Ok(list)) => list
            .members()
            .iter()
            .map(|m| EtcdMemberInfo {
                id: m.id(),
                hostname: m.name().to_string(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                is_learner: m.is_learner(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let status = match tokio::time::timeout(TIMEOUT, client.status()).await {
        Ok(Ok(st)) => Some(EtcdMemberStatusInfo {
            member_id: st.header().map(|h| h.member_id()).unwrap_or_default(),
            protocol_version: st.version().to_string(),
            db_size: st.db_size(),
            db_size_in_use: st.raft_used_db_size(),
            leader: st.leader(),
            raft_index: st.raft_index(),
            raft_term: st.raft_term(),
            raft_applied_index: st.raft_applied_index(),
            errors: st.errors().to_vec(),
            is_learner: st.is_learner(),
        }),
        _ => None,
    };
    (members, status)
}

impl Controller for HealthController {
    fn name(&self) -> &'static str {
        "etcd.HealthController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<ServiceStatusSpec>(RUNTIME).with_id(SERVICE_ID),
            Input::weak::<ServiceSpecSpec>(NAMESPACE).with_id(SERVICE_ID),
            Input::weak::<EtcdSpecSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<PkiStatusSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<EtcdBootstrapSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<EtcdCertsSpec>(SECRETS).with_id(SECRETS_ETCD_ID),
            Input::weak::<EtcdLeaveSpec>(NAMESPACE).with_id(ETCD_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<EtcdStatusSpec>(),
            Output::exclusive::<EtcdMemberSpec>(),
        ]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let etcd = ctx.get::<EtcdSpecSpec>(NAMESPACE, ETCD_ID).await?;
        let Some(etcd) = etcd else {
            // No etcd on this node (a worker), or no address yet: nothing to say unless a
            // service is still asked for.
            self.client = None;
            return Ok(Action::AwaitChange);
        };
        if let Some(left) = ctx.get::<EtcdLeaveSpec>(NAMESPACE, ETCD_ID).await? {
            self.client = None;
            let out = EtcdStatusSpec {
                phase: "left".into(),
                member_id: left.spec.member_id.clone(),
                message: "this node left the etcd cluster (`talosctl etcd leave`): etcd stays stopped, its data removed, until the node restarts".into(),
                ..Default::default()
            };
            ctx.apply(Resource::new(NAMESPACE, ETCD_ID, out)).await?;
            return Ok(Action::AwaitChange);
        }
        let service = ctx.get::<ServiceSpecSpec>(NAMESPACE, SERVICE_ID).await?;
        let status = ctx.get::<ServiceStatusSpec>(RUNTIME, SERVICE_ID).await?;
        let start = service.as_ref().map_or("", |s| {
            match super::service::arg_value(&s.spec.args, "initial-cluster-state") {
                Some("new") => "bootstrap",
                Some("existing") => "join",
                _ => "resume",
            }
        });
        let mut out = EtcdStatusSpec {
            phase: "waiting".into(),
            start: start.into(),
            ..Default::default()
        };
        let mut again = Action::AwaitChange;
        if service.is_none() {
            let pki = ctx.get::<PkiStatusSpec>(NAMESPACE, ETCD_ID).await?;
            let bootstrap = ctx.get::<EtcdBootstrapSpec>(NAMESPACE, ETCD_ID).await?;
            out.message = if !pki.is_some_and(|p| p.spec.ready) {
                "waiting for etcd's certificates".into()
            } else if bootstrap.as_ref().is_some_and(|b| b.spec.recover) {
                "recovery accepted: restoring the uploaded snapshot (services etcd-restore, then etcd-restore-adopt; `talosctl logs etcd-restore`)".into()
            } else if bootstrap.is_some() {
                "bootstrap accepted; waiting for etcd's arguments (see k8sd's log)".into()
            } else {
                let ips: Vec<String> = etcd
                    .spec
                    .advertised_addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!(
                    "etcd is waiting to join the cluster, if this node is the first node in the cluster, please run `talosctl bootstrap` against one of the following IPs: [{}]",
                    ips.join(" ")
                )
            };
            self.client = None;
        } else {
            let running = status
                .as_ref()
                .is_some_and(|s| s.spec.state == ServiceState::Running);
            if !running {
                self.voting = false;
            } else if start == "join" && !self.voting {
                let args = service
                    .as_ref()
                    .map(|s| s.spec.args.as_slice())
                    .unwrap_or_default();
                if let Some(why) = self.promote(ctx, args, &etcd.spec.name).await? {
                    out.phase = "joining".into();
                    out.message = format!("a learner, waiting to be promoted: {why}");
                }
            }
            match status.as_ref().map(|s| &s.spec) {
                _ if out.phase == "joining" => again = Action::RequeueAfter(PROMOTE_RETRY),
                Some(s) if s.state == ServiceState::Running => {
                    again = Action::RequeueAfter(PERIOD);
                    match self.probe(ctx).await? {
                        Ok(id) => {
                            out.phase = "healthy".into();
                            out.healthy = true;
                            if id != 0 {
                                out.member_id = format!("{id:016x}");
                            }
                            if let Some((_, client)) = self.client.as_mut() {
                                (out.members, out.member_status) = details(client).await;
                            }
                        }
                        Err(why) => {
                            out.phase = "unhealthy".into();
                            out.message = why;
                        }
                    }
                }
                Some(s) => {
                    out.phase = "starting".into();
                    out.message = format!("etcd's service is {}", s.state.as_str());
                    if !s.message.is_empty() {
                        out.message = format!("{}: {}", out.message, s.message);
                    }
                    self.client = None;
                }
                None => {
                    out.phase = "starting".into();
                    out.message = "init has not started etcd yet".into();
                }
            }
        }
        if !out.member_id.is_empty() {
            ctx.apply(Resource::new(
                NAMESPACE,
                LOCAL_MEMBER_ID,
                EtcdMemberSpec {
                    member_id: out.member_id.clone(),
                },
            ))
            .await?;
        } else if out.healthy {
            // Healthy without an ID (permission denied): keep what was known.
            if let Some(m) = ctx
                .get::<EtcdMemberSpec>(NAMESPACE, LOCAL_MEMBER_ID)
                .await?
            {
                ctx.apply(m).await?;
            }
        }
        ctx.apply(Resource::new(NAMESPACE, ETCD_ID, out)).await?;
        Ok(again)
    }
}

impl HealthController {
    /// A joined member that is not known to vote yet asks the other members (those of its
    /// `--initial-cluster`) to promote it. `Some(why)` while it is still a learner.
    async fn promote(
        &mut self,
        ctx: &Context,
        args: &[String],
        name: &str,
    ) -> Result<Option<String>, ReconcileError> {
        let endpoints = super::service::arg_value(args, "initial-cluster")
            .map(|ic| super::service::member_endpoints(ic, name))
            .unwrap_or_default();
        let Some(certs) = ctx.get::<EtcdCertsSpec>(SECRETS, SECRETS_ETCD_ID).await? else {
            return Ok(Some("no admin certificate for etcd yet".into()));
        };
        match super::join::promote(&certs.spec, &endpoints, name).await {
            Ok(_) => {
                self.voting = true;
                Ok(None)
            }
            Err(why) => Ok(Some(why)),
        }
    }

    /// One quorum check with the current admin certificate.
    async fn probe(&mut self, ctx: &Context) -> Result<Result<u64, String>, ReconcileError> {
        let Some(certs) = ctx.get::<EtcdCertsSpec>(SECRETS, SECRETS_ETCD_ID).await? else {
            return Ok(Err("no admin certificate for etcd yet".into()));
        };
        let version = certs.metadata.version;
        if self.client.as_ref().is_none_or(|(v, _)| *v != version) {
            match local_client(&certs.spec).await {
                Ok(c) => self.client = Some((version, c)),
                Err(e) => return Ok(Err(e)),
            }
        }
        let Some((_, client)) = self.client.as_mut() else {
            return Ok(Err("no client".into()));
        };
        let r = check(client).await;
        if r.is_err() {
            // A fresh connection next time.
            self.client = None;
        }
        Ok(r)
    }
}
