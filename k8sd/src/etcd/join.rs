//! Joining an existing etcd cluster and being promoted, as upstream's `buildInitialCluster`
//! and learner promotion loop: a control plane with an empty data directory that was not
//! bootstrapped adds itself as a learner through the members it can reach (stale members of its
//! own name removed first), starts with `--initial-cluster-state=existing`, and asks the voting
//! members to promote it until one does (etcd refuses while the learner lags behind).
//!
//! Upstream finds the members through cluster discovery and the Kubernetes API's endpoints;
//! neither exists on a talos-rs node yet, so the endpoints are the host of
//! `cluster.controlPlane.endpoint` (on its client port) and the members already known.

use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, MemberAddOptions, TlsOptions};
use machinery::resources::etcd::CLIENT_PORT;
use machinery::resources::secrets::EtcdCertsSpec;

/// How long one call to a remote member may take: a dead endpoint fails fast (upstream's fix
/// for learners promoted after ~135 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of `endpoints` (`https://host:2379`) with the admin certificate; `domain` overrides
/// the name the servers' certificates are checked against (`localhost` for the local member).
///
/// # Errors
///
/// etcd's client error.
pub async fn client(
    certs: &EtcdCertsSpec,
    endpoints: &[String],
    domain: Option<&str>,
) -> Result<Client, String> {
    client_with(certs, endpoints, domain, Some(CALL_TIMEOUT)).await
}

/// As [`client`], with `call_timeout` on every call (`None`: no limit, for the calls that
/// wait: an election campaign, a watch, a lease's keep-alive stream).
///
/// # Errors
///
/// Why the endpoints cannot be reached.
pub async fn client_with(
    certs: &EtcdCertsSpec,
    endpoints: &[String],
    domain: Option<&str>,
    call_timeout: Option<Duration>,
) -> Result<Client, String> {
    let mut tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(certs.ca.crt.as_bytes()))
        .identity(Identity::from_pem(
            certs.etcd_admin.crt.as_bytes(),
            certs.etcd_admin.key.as_bytes(),
        ));
    if let Some(d) = domain {
        tls = tls.domain_name(d);
    }
    let mut options = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(CALL_TIMEOUT)
        .with_require_leader(true);
    match call_timeout {
        Some(t) => options = options.with_timeout(t),
        // A stream that waits must still notice a peer that is gone (etcd's own minimum
        // ping interval is 5 s: faster pings are refused).
        None => {
            options = options
                .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
                .with_keep_alive_while_idle(true);
        }
    }
    match tokio::time::timeout(CALL_TIMEOUT, Client::connect(endpoints, Some(options))).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("cannot reach {}: {e}", endpoints.join(","))),
        Err(_) => Err(format!("cannot reach {}: timed out", endpoints.join(","))),
    }
}

/// `https://host:2379` of a `https://host:port` URL (the control plane endpoint).
pub fn client_endpoint(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host = if let Some(v6) = authority.strip_prefix('[') {
        format!("[{}]", v6.split(']').next()?)
    } else {
        authority.split(':').next()?.to_string()
    };
    (!host.is_empty()).then(|| format!("https://{host}:{CLIENT_PORT}"))
}

/// `endpoints` (`https://host:2379`) with every host that is a name resolved (the node's
/// resolver: networkd's /etc/hosts and name servers), as `https://IP:2379` each, this node's
/// own addresses (`own`) left out. A name becomes addresses so that the members' certificates
/// are checked against the addresses they carry (a control plane endpoint's name, such as
/// `k8s.example.com`, is in no etcd certificate).
///
/// # Errors
///
/// A name that does not resolve, saying so.
pub async fn resolve(
    endpoints: &[String],
    own: &[std::net::IpAddr],
) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for ep in endpoints {
        let host = ep
            .strip_prefix("https://")
            .and_then(|r| r.rsplit_once(':'))
            .map_or(ep.as_str(), |(h, _)| h);
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let ips: Vec<std::net::IpAddr> = match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::net::lookup_host((bare, CLIENT_PORT))
                .await
                .map_err(|e| format!("cannot resolve {bare}: {e}"))?
                .map(|a| a.ip())
                .collect(),
        };
        for ip in ips {
            let url = super::args::url(ip, CLIENT_PORT);
            if !own.contains(&ip) && !out.contains(&url) {
                out.push(url);
            }
        }
    }
    Ok(out)
}

/// The `--initial-cluster` of a member list after our addition (`new_id`: ours).
fn initial_cluster(members: &[etcd_client::Member], new_id: u64, name: &str) -> String {
    let mut out = Vec::new();
    for m in members {
        let n = if m.id() == new_id { name } else { m.name() };
        for url in m.peer_urls() {
            out.push(format!("{n}={url}"));
        }
    }
    out.join(",")
}

/// Adds this node as a learner through `endpoints` and returns its `--initial-cluster`.
///
/// # Errors
///
/// Why it could not: no endpoint answered, or etcd refused (another learner is joining, the
/// cluster has no leader), with etcd's words.
pub async fn add_learner(
    certs: &EtcdCertsSpec,
    endpoints: &[String],
    name: &str,
    peer_urls: &[String],
) -> Result<(u64, String), String> {
    let mut c = client(certs, endpoints, None).await?;
    let list = c
        .member_list()
        .await
        .map_err(|e| format!("member list: {e}"))?;
    for m in list.members() {
        if m.name() == name {
            // A stale member of our name (this node's previous life: its data is gone).
            tracing::info!(member = %format!("{:016x}", m.id()), name, "removing a stale etcd member of this node's name");
            c.member_remove(m.id())
                .await
                .map_err(|e| format!("removing stale member {:016x}: {e}", m.id()))?;
        }
    }
    match c
        .member_add(
            peer_urls.to_vec(),
            Some(MemberAddOptions::new().with_is_learner()),
        )
        .await
    {
        Ok(r) => {
            let id = r
                .member()
                .map(etcd_client::Member::id)
                .ok_or("member add: no member in the answer")?;
            Ok((id, initial_cluster(r.member_list(), id, name)))
        }
        Err(e) if e.to_string().contains("Peer URLs already exists") => {
            // Our own earlier addition whose answer was lost: a learner with our peer URLs
            // that never started (no name). Adopt it.
            let list = c
                .member_list()
                .await
                .map_err(|e| format!("member list: {e}"))?;
            let same = |m: &etcd_client::Member| {
                let mut a = m.peer_urls().to_vec();
                let mut b = peer_urls.to_vec();
                a.sort();
                b.sort();
                a == b
            };
            match list
                .members()
                .iter()
                .find(|m| same(m) && m.is_learner() && m.name().is_empty())
            {
                Some(m) => Ok((m.id(), initial_cluster(list.members(), m.id(), name))),
                None => Err(format!("member add: {e}")),
            }
        }
        Err(e) => Err(format!("member add: {e}")),
    }
}

/// Asks each of `endpoints` in turn, each with [`CALL_TIMEOUT`], to promote the learner named
/// `name`. `Ok(true)` once it is a voting member (promoted now or before).
///
/// # Errors
///
/// The last refusal (etcd's "learner is not ready" while it catches up).
pub async fn promote(
    certs: &EtcdCertsSpec,
    endpoints: &[String],
    name: &str,
) -> Result<bool, String> {
    let mut last = "no endpoint to promote through".to_string();
    for ep in endpoints {
        let mut c = match client(certs, std::slice::from_ref(ep), None).await {
            Ok(c) => c,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let list = match tokio::time::timeout(CALL_TIMEOUT, c.member_list()).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                last = format!("{ep}: member list: {e}");
                continue;
            }
            Err(_) => {
                last = format!("{ep}: member list: timed out");
                continue;
            }
        };
        let Some(me) = list.members().iter().find(|m| m.name() == name) else {
            last = format!("{ep}: no member named {name}");
            continue;
        };
        if !me.is_learner() {
            return Ok(true);
        }
        match tokio::time::timeout(CALL_TIMEOUT, c.member_promote(me.id())).await {
            Ok(Ok(_)) => {
                tracing::info!(member = %format!("{:016x}", me.id()), via = %ep, "etcd learner promoted to a voting member");
                return Ok(true);
            }
            Ok(Err(e)) => last = format!("{ep}: promote: {e}"),
            Err(_) => last = format!("{ep}: promote: timed out"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_resolve_to_addresses_without_the_nodes_own() {
        let own: Vec<std::net::IpAddr> = vec!["10.5.0.3".parse().unwrap()];
        let eps = [
            "https://localhost:2379".to_string(),
            "https://10.5.0.3:2379".to_string(),
            "https://[fd00::2]:2379".to_string(),
        ];
        let got = resolve(&eps, &own).await.unwrap();
        assert!(
            got.contains(&"https://127.0.0.1:2379".to_string()),
            "{got:?}"
        );
        assert!(!got.iter().any(|e| e.contains("10.5.0.3")), "{got:?}");
        assert!(
            got.contains(&"https://[fd00::2]:2379".to_string()),
            "{got:?}"
        );
        let e = resolve(&["https://no-such-name.invalid:2379".to_string()], &own)
            .await
            .unwrap_err();
        assert!(e.contains("cannot resolve no-such-name.invalid"), "{e}");
    }

    #[test]
    fn the_control_plane_endpoint_gives_a_client_endpoint() {
        assert_eq!(
            client_endpoint("https://10.5.0.2:6443").as_deref(),
            Some("https://10.5.0.2:2379")
        );
        assert_eq!(
            client_endpoint("https://kube.example.org:6443/").as_deref(),
            Some("https://kube.example.org:2379")
        );
        assert_eq!(
            client_endpoint("https://[fd00::1]:6443").as_deref(),
            Some("https://[fd00::1]:2379")
        );
        assert_eq!(client_endpoint("https://:6443"), None);
    }
}
