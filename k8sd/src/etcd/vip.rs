//! `etcd.VIPController` (ours; upstream's VIP operator runs this election inside machined's
//! network operator): the shared IPs of the configuration (`network/OperatorSpecs` with operator
//! `vip`) are campaigned for in etcd, one campaign per IP, as upstream: a lease, the election
//! key `talos:v1:vip:election:<IP>` (etcd's election API, the same keys as upstream's
//! `concurrency.Election`), the node's etcd member name as the value. Where this node stands is
//! published as `vip/VIPElections/<IP>`; networkd assigns the IP while `leader` is true. The
//! daemons meet only in resources: k8sd has no network capability and networkd no etcd
//! credential.
//!
//! Differences from upstream, on purpose:
//! - The lease's TTL is [`LEASE_TTL`] (10 s; upstream takes etcd's session default, 60 s): a
//!   holder that dies without releasing (a crash, a node that vanishes) keeps the IP until its
//!   lease expires, and an API endpoint unreachable for a minute is worse than a keep-alive
//!   every 2 s.
//! - A restarted k8sd re-adopts its campaign: a leader key whose value is this node's name is
//!   kept alive again rather than resigned (upstream resigns, which moves the IP to another
//!   node on every restart of machined). Its other keys (a campaign of a previous life) are
//!   revoked, so that no dead key holds up the election queue.
//! - A stopping k8sd (SIGTERM, or init stopping etcd first on shutdown) revokes its leases
//!   through any member that answers, the local one first ([`Holdings::release_all`]): the next
//!   node's campaign returns at once.
//! - Upstream also waits for the kubelet's lifecycle and gives the IP up when the local
//!   kube-apiserver's static pod goes away; no kubelet runs here, so etcd running and healthy is
//!   the only precondition.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError, Waker};
use cosi::{Phase, Resource};
use etcd_client::{Client, GetOptions, LeaderKey, ResignOptions, SortOrder, SortTarget};
use machinery::resources::etcd::{
    vip_election_key, EtcdSpecSpec, EtcdStatusSpec, VipElectionSpec, CLIENT_PORT, ETCD_ID,
    NAMESPACE, SERVICE_ID, VIP_NAMESPACE,
};
use machinery::resources::network::{Operator, OperatorSpecSpec, NAMESPACE as NETWORK};
use machinery::resources::runtime::{ServiceState, ServiceStatusSpec, NAMESPACE as RUNTIME};
use machinery::resources::secrets::{
    EtcdCertsSpec, ETCD_ID as SECRETS_ETCD_ID, NAMESPACE as SECRETS,
};
use tokio::sync::watch;

use super::join::{self, CALL_TIMEOUT};

/// The controller's name.
pub const NAME: &str = "etcd.VIPController";
/// The TTL of a campaign's lease, seconds.
pub const LEASE_TTL: i64 = 10;
/// How often the lease is kept alive (a fifth of its TTL: two missed keep-alives still keep
/// it).
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(2);
/// How long after a failed or lost campaign the next starts (upstream: 1 s).
const RETRY: Duration = Duration::from_secs(1);
/// How long giving a lease back may take through one member.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a campaign stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Standing {
    leader: bool,
    holder: String,
    lease: i64,
    message: String,
}

/// A lease this node holds in an election, and where to give it back.
#[derive(Clone)]
struct Held {
    lease: i64,
    certs: EtcdCertsSpec,
}

/// The leases this node holds in VIP elections, shared with k8sd's shutdown so that a
/// stopping k8sd gives them back ([`Holdings::release_all`]).
#[derive(Clone, Default)]
pub struct Holdings {
    held: Arc<Mutex<BTreeMap<IpAddr, Held>>>,
    /// The other members' client URLs, as the last EtcdStatus listed them.
    peers: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for Holdings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ips: Vec<IpAddr> = self
            .held
            .lock()
            .map(|h| h.keys().copied().collect())
            .unwrap_or_default();
        f.debug_struct("Holdings").field("ips", &ips).finish()
    }
}

impl Holdings {
    fn set(&self, ip: IpAddr, lease: i64, certs: &EtcdCertsSpec) {
        if let Ok(mut h) = self.held.lock() {
            h.insert(
                ip,
                Held {
                    lease,
                    certs: certs.clone(),
                },
            );
        }
    }

    fn get(&self, ip: &IpAddr) -> Option<Held> {
        self.held.lock().ok()?.get(ip).cloned()
    }

    fn set_peers(&self, peers: Vec<String>) {
        if let Ok(mut p) = self.peers.lock() {
            *p = peers;
        }
    }

    /// Gives the lease held for `ip` back (revoked: its election key goes with it), through
    /// the local member or, when it does not answer, any other; forgets it once done.
    async fn release(&self, ip: IpAddr) {
        let Some(held) = self.get(&ip) else {
            return;
        };
        let peers = self.peers.lock().map(|p| p.clone()).unwrap_or_default();
        match revoke(&held.certs, held.lease, &peers).await {
            Ok(()) => {
                tracing::info!(%ip, lease = %format!("{:016x}", held.lease), "VIP election lease given back");
                if let Ok(mut h) = self.held.lock() {
                    if h.get(&ip).is_some_and(|x| x.lease == held.lease) {
                        h.remove(&ip);
                    }
                }
            }
            Err(e) => tracing::warn!(%ip, error = %e,
                "cannot give the VIP election lease back: the IP moves when the lease expires"),
        }
    }

    /// Gives every lease back (k8sd is stopping).
    pub async fn release_all(&self) {
        let ips: Vec<IpAddr> = self
            .held
            .lock()
            .map(|h| h.keys().copied().collect())
            .unwrap_or_default();
        for ip in ips {
            self.release(ip).await;
        }
    }
}

/// Says in stated that this node holds no shared IP any more (k8sd is stopping and gave its
/// leases back; its controllers no longer run): networkd, which stops after k8sd, removes the
/// addresses rather than leaving them on a link whose node no longer leads.
///
/// # Errors
///
/// stated's.
pub async fn give_up(client: &cosi::Client) -> Result<usize, cosi::StateError> {
    let mut n = 0;
    for r in client.list_typed::<VipElectionSpec>(VIP_NAMESPACE).await? {
        if !r.spec.leader {
            continue;
        }
        let mut spec = r.spec.clone();
        spec.leader = false;
        spec.lease_id.clear();
        spec.message = "k8sd stopped: the IP was given back".into();
        let mut raw = Resource::new(VIP_NAMESPACE, r.id().to_string(), spec)
            .to_raw()
            .map_err(|e| cosi::StateError::new(cosi::ErrorKind::InvalidArgument, e.to_string()))?;
        raw.metadata.version = r.metadata.version;
        client.update(&raw, NAME, None).await?;
        n += 1;
    }
    Ok(n)
}

/// The local member's client URL.
fn local_endpoint() -> String {
    format!("https://127.0.0.1:{CLIENT_PORT}")
}

/// Revokes `lease` through the local member, else through each of `peers` in turn. A lease
/// etcd no longer knows is revoked already.
async fn revoke(certs: &EtcdCertsSpec, lease: i64, peers: &[String]) -> Result<(), String> {
    let mut why = Vec::new();
    let targets = std::iter::once((local_endpoint(), Some("localhost")))
        .chain(peers.iter().map(|p| (p.clone(), None)));
    for (endpoint, domain) in targets {
        let attempt = async {
            let mut c = join::client(certs, std::slice::from_ref(&endpoint), domain).await?;
            match c.lease_revoke(lease).await {
                Ok(_) => Ok(()),
                Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("not found") => {
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        };
        match tokio::time::timeout(RELEASE_TIMEOUT, attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => why.push(format!("{endpoint}: {e}")),
            Err(_) => why.push(format!("{endpoint}: timed out")),
        }
    }
    Err(why.join("; "))
}

/// A running campaign for one IP.
struct Campaign {
    /// Aborted when the campaign is dropped.
    _task: AbortOnDrop,
    standing: watch::Receiver<Standing>,
    /// The name it campaigns with: a change restarts it.
    name: String,
    /// The admin certificate it connects with next. A new one does not restart the campaign:
    /// secretsd re-issues etcd's certificates when the node's addresses change, which the IP
    /// itself does when it arrives, and the connection made with the old one stays valid.
    certs: watch::Sender<EtcdCertsSpec>,
}

/// `etcd.VIPController`.
#[derive(Default)]
pub struct VipController {
    campaigns: BTreeMap<IpAddr, Campaign>,
    holdings: Holdings,
}

impl VipController {
    /// A controller whose leases `holdings` records.
    pub fn new(holdings: Holdings) -> Self {
        Self {
            campaigns: BTreeMap::new(),
            holdings,
        }
    }
}

impl Controller for VipController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<OperatorSpecSpec>(NETWORK),
            Input::weak::<EtcdSpecSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<EtcdStatusSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<ServiceStatusSpec>(RUNTIME).with_id(SERVICE_ID),
            Input::weak::<EtcdCertsSpec>(SECRETS).with_id(SECRETS_ETCD_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<VipElectionSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let vips: BTreeSet<IpAddr> = ctx
            .list::<OperatorSpecSpec>(NETWORK)
            .await?
            .into_iter()
            .filter(|s| s.metadata.phase == Phase::Running && s.spec.operator == Operator::Vip)
            .filter_map(|s| s.spec.vip.ip)
            .collect();
        let spec = ctx.get::<EtcdSpecSpec>(NAMESPACE, ETCD_ID).await?;
        let status = ctx.get::<EtcdStatusSpec>(NAMESPACE, ETCD_ID).await?;
        let running = ctx
            .get::<ServiceStatusSpec>(RUNTIME, SERVICE_ID)
            .await?
            .is_some_and(|s| s.spec.state == ServiceState::Running);
        let certs = ctx.get::<EtcdCertsSpec>(SECRETS, SECRETS_ETCD_ID).await?;

        if let Some(st) = &status {
            let ours = &st.spec.member_id;
            let peers = st
                .spec
                .members
                .iter()
                .filter(|m| format!("{:016x}", m.id) != *ours && !m.is_learner)
                .flat_map(|m| m.client_urls.iter().cloned())
                .collect();
            self.holdings.set_peers(peers);
        }
        let phase = status.as_ref().map_or("", |s| s.spec.phase.as_str());
        let etcd_up = running && matches!(phase, "healthy" | "unhealthy");
        let healthy = etcd_up && status.as_ref().is_some_and(|s| s.spec.healthy);

        // Campaigns no longer wanted: the IP left the configuration, etcd stopped, or what
        // it runs with changed.
        let stale: Vec<IpAddr> = self
            .campaigns
            .iter()
            .filter(|(ip, c)| {
                !vips.contains(ip)
                    || !etcd_up
                    || spec.as_ref().is_none_or(|s| s.spec.name != c.name)
                    || certs.is_none()
            })
            .map(|(ip, _)| *ip)
            .collect();
        for ip in stale {
            self.campaigns.remove(&ip);
            tracing::info!(%ip, "VIP campaign stopped");
            let holdings = self.holdings.clone();
            tokio::spawn(async move { holdings.release(ip).await });
        }

        if let Some(certs) = &certs {
            for c in self.campaigns.values() {
                c.certs.send_if_modified(|x| {
                    let changed = *x != certs.spec;
                    if changed {
                        x.clone_from(&certs.spec);
                    }
                    changed
                });
            }
        }
        if let (true, Some(spec), Some(certs)) = (healthy, &spec, &certs) {
            for ip in &vips {
                if self.campaigns.contains_key(ip) || spec.spec.name.is_empty() {
                    continue;
                }
                tracing::info!(%ip, name = %spec.spec.name, "VIP campaign started");
                // A previous life's leadership stays published until the campaign knows
                // whether it can re-adopt it: the IP does not flap on a restart of k8sd.
                let prior = ctx
                    .get::<VipElectionSpec>(VIP_NAMESPACE, &ip.to_string())
                    .await?
                    .filter(|r| r.spec.leader)
                    .map(|r| Standing {
                        leader: true,
                        holder: r.spec.holder.clone(),
                        lease: i64::from_str_radix(&r.spec.lease_id, 16).unwrap_or_default(),
                        message: "re-adopting the leadership of a previous life".into(),
                    });
                let (tx, rx) = watch::channel(prior.unwrap_or_else(|| Standing {
                    message: "campaigning".into(),
                    ..Default::default()
                }));
                let (certs_tx, certs_rx) = watch::channel(certs.spec.clone());
                let task = tokio::spawn(run(
                    *ip,
                    spec.spec.name.clone(),
                    certs_rx,
                    tx,
                    self.holdings.clone(),
                    ctx.waker(),
                ));
                self.campaigns.insert(
                    *ip,
                    Campaign {
                        _task: AbortOnDrop(task),
                        standing: rx,
                        name: spec.spec.name.clone(),
                        certs: certs_tx,
                    },
                );
            }
        }

        for ip in &vips {
            let out = match self.campaigns.get(ip) {
                Some(c) => {
                    let s = c.standing.borrow().clone();
                    VipElectionSpec {
                        ip: ip.to_string(),
                        leader: s.leader,
                        holder: s.holder,
                        lease_id: if s.lease == 0 {
                            String::new()
                        } else {
                            format!("{:016x}", s.lease)
                        },
                        message: s.message,
                    }
                }
                None => VipElectionSpec {
                    ip: ip.to_string(),
                    message: if spec.is_none() {
                        "etcd does not run on this node: only control planes campaign for a shared IP".into()
                    } else {
                        "waiting for a running, healthy etcd".into()
                    },
                    ..Default::default()
                },
            };
            ctx.apply(Resource::new(VIP_NAMESPACE, ip.to_string(), out))
                .await?;
        }
        Ok(Action::AwaitChange)
    }
}

/// Changes the standing and wakes the controller.
fn update(tx: &watch::Sender<Standing>, waker: &Waker, f: impl FnOnce(&mut Standing)) {
    let mut changed = false;
    tx.send_modify(|s| {
        let before = s.clone();
        f(s);
        changed = *s != before;
    });
    if changed {
        waker.wake();
    }
}

/// One IP's campaigns, one after another until the controller drops it.
async fn run(
    ip: IpAddr,
    name: String,
    certs: watch::Receiver<EtcdCertsSpec>,
    tx: watch::Sender<Standing>,
    holdings: Holdings,
    waker: Waker,
) {
    loop {
        let current = certs.borrow().clone();
        let why = match campaign(ip, &name, &current, &tx, &holdings, &waker).await {
            Ok(why) => why,
            Err(e) => {
                tracing::warn!(%ip, error = %e, "VIP campaign failed");
                format!("campaign failed: {e}")
            }
        };
        let was_leader = tx.borrow().leader;
        update(&tx, &waker, |s| {
            s.leader = false;
            s.lease = 0;
            s.message.clone_from(&why);
        });
        if was_leader {
            tracing::info!(%ip, reason = %why, "shared IP given up");
        }
        holdings.release(ip).await;
        tokio::time::sleep(RETRY).await;
    }
}

/// Runs `f` with [`CALL_TIMEOUT`].
async fn bounded<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer in {} s", CALL_TIMEOUT.as_secs())),
    }
}

/// One campaign: joins the election (or re-adopts this node's leadership of a previous life),
/// holds the IP while this node leads, and returns why it stopped leading. Its lease is given
/// back by the caller.
async fn campaign(
    ip: IpAddr,
    name: &str,
    certs: &EtcdCertsSpec,
    tx: &watch::Sender<Standing>,
    holdings: &Holdings,
    waker: &Waker,
) -> Result<String, String> {
    let key = vip_election_key(&ip);
    let client: Client =
        join::client_with(certs, &[local_endpoint()], Some("localhost"), None).await?;

    // What a previous life left: the leader key (the lowest create revision) is re-adopted if
    // it is ours; any other key of ours is revoked.
    let mut kv = client.kv_client();
    let existing = bounded(
        "listing the election's keys",
        kv.get(
            format!("{key}/"),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        ),
    )
    .await?;
    let mut adopted: Option<LeaderKey> = None;
    for (i, k) in existing.kvs().iter().enumerate() {
        if k.value() != name.as_bytes() {
            continue;
        }
        if i == 0 {
            adopted = Some(
                LeaderKey::new()
                    .with_name(key.clone())
                    .with_key(k.key())
                    .with_rev(k.create_revision())
                    .with_lease(k.lease()),
            );
        } else {
            let mut lc = client.lease_client();
            let _ = bounded("revoking a previous campaign", lc.revoke(k.lease())).await;
        }
    }

    let lease = match &adopted {
        Some(l) => l.lease(),
        None => {
            let mut lc = client.lease_client();
            bounded("granting a lease", lc.grant(LEASE_TTL, None))
                .await?
                .id()
        }
    };
    holdings.set(ip, lease, certs);
    if adopted.is_none() {
        update(tx, waker, |s| {
            s.leader = false;
            s.lease = lease;
            s.message = "campaigning".into();
        });
    }

    let mut lc = client.lease_client();
    let (mut keeper, mut acks) = bounded("keeping the lease alive", lc.keep_alive(lease)).await?;
    let mut ec = client.election_client();
    // The observation runs beside: etcd answers an Observe only once there is a leader, and
    // sends each new one (its key and value).
    let (seen_tx, mut seen) =
        tokio::sync::mpsc::channel::<Result<Option<(Vec<u8>, String)>, String>>(4);
    let observer = {
        let mut ec = client.election_client();
        let key = key.clone();
        tokio::spawn(async move {
            let mut stream = match ec.observe(key).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = seen_tx.send(Err(e.to_string())).await;
                    return;
                }
            };
            loop {
                let msg = match stream.message().await {
                    Ok(Some(r)) => Ok(r.kv().map(|k| {
                        (
                            k.key().to_vec(),
                            String::from_utf8_lossy(k.value()).into_owned(),
                        )
                    })),
                    Ok(None) => Ok(None),
                    Err(e) => Err(e.to_string()),
                };
                let end = !matches!(msg, Ok(Some(_)));
                if seen_tx.send(msg).await.is_err() || end {
                    return;
                }
            }
        })
    };
    let _observer = AbortOnDrop(observer);

    let mut campaigning = adopted.is_none();
    let mut leader: Option<LeaderKey> = adopted;
    let campaign = {
        let mut ec = client.election_client();
        let key = key.clone();
        let name = name.to_string();
        async move { ec.campaign(key, name, lease).await }
    };
    let mut campaign = std::pin::pin!(campaign);
    if leader.is_some() {
        tracing::info!(%ip, "re-adopted the leadership of a previous life: keeping the shared IP");
        lead(tx, waker, name, "leader (re-adopted after a restart)");
    }
    let mut tick = tokio::time::interval(KEEP_ALIVE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                keeper.keep_alive().await.map_err(|e| format!("keeping the lease alive: {e}"))?;
            }
            ack = acks.message() => match ack {
                Ok(Some(r)) if r.ttl() > 0 => {}
                Ok(Some(_)) => return Err("the lease expired".into()),
                Ok(None) => return Err("the keep-alive stream ended".into()),
                Err(e) => return Err(format!("keeping the lease alive: {e}")),
            },
            won = &mut campaign, if campaigning => {
                campaigning = false;
                let won = won.map_err(|e| format!("campaign: {e}"))?;
                let Some(mine) = won.leader().cloned() else {
                    return Err("the campaign's answer names no leader key".into());
                };
                // etcd's campaign returns once the keys before ours are gone, even if ours
                // went with an expired lease meanwhile: check that ours leads.
                let now = bounded("asking for the leader", ec.leader(key.clone())).await?;
                if now.kv().map(etcd_client::KeyValue::key) != Some(mine.key()) {
                    return Err("the lease was lost while campaigning".into());
                }
                tracing::info!(%ip, "won the VIP election: assigning the shared IP");
                lead(tx, waker, name, "leader");
                leader = Some(mine);
            }
            news = seen.recv() => match news {
                Some(Ok(Some((leader_key, holder)))) => {
                    let ours = leader.as_ref().is_some_and(|l| l.key() == leader_key.as_slice());
                    if leader.is_some() && !ours {
                        if let Some(l) = leader.take() {
                            let mut ec = client.election_client();
                            let _ = bounded("resigning", ec.resign(Some(ResignOptions::new().with_leader(l)))).await;
                        }
                        return Ok(format!("another node leads: {holder}"));
                    }
                    update(tx, waker, |s| s.holder = holder);
                }
                Some(Ok(None)) | None => return Err("the election's observation ended".into()),
                Some(Err(e)) => return Err(format!("observing the election: {e}")),
            },
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Marks this node the leader.
fn lead(tx: &watch::Sender<Standing>, waker: &Waker, name: &str, message: &str) {
    update(tx, waker, |s| {
        s.leader = true;
        s.holder = name.to_string();
        s.message = message.to_string();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_election_key_is_upstreams() {
        let ip: IpAddr = "10.5.0.200".parse().unwrap();
        assert_eq!(vip_election_key(&ip), "talos:v1:vip:election:10.5.0.200");
        let ip: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(vip_election_key(&ip), "talos:v1:vip:election:fd00::1");
    }
}
