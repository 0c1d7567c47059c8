//! secretsd on a real node: a control plane's config (upstream's own secrets bundle) and a
//! link with an address in the node's network namespace give apid's certificates, signed by
//! the OS CA and naming the node's address (outside the default pod and service subnets,
//! which the API SANs leave out); a kill -9 of secretsd restarts it and reissues nothing (the
//! resources keep their versions); trustd serves TLS 1.3 with its certificate there and comes
//! back after a kill -9. Needs root.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use cosi::Resource;
use init::testing::Node;
use machinery::resources::secrets::{ApiCertsSpec, EtcdCertsSpec, API_ID, ETCD_ID, NAMESPACE};
use machinery::secrets::x509::Certificate;
use machinery::secrets::Bundle;

const T: Duration = Duration::from_secs(60);

async fn wait_for<S: cosi::ResourceSpec>(
    node: &Node,
    id: &str,
    pred: impl Fn(&S) -> bool,
) -> Resource<S> {
    let client = node.state();
    let end = Instant::now() + T;
    loop {
        if let Ok(r) = client.get_typed::<S>(NAMESPACE, id).await {
            if pred(&r.spec) {
                return r;
            }
        }
        assert!(
            Instant::now() < end,
            "no {}/{id}\n{}",
            S::TYPE,
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn secretsd_mints_a_control_planes_certificates_trustd_serves_and_a_kill_9_reissues_nothing()
{
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let bundle = Bundle::from_yaml(support::UPSTREAM).unwrap();
    let node = Node::builder()
        .config(&support::control_plane(&bundle, "tsd1", "172.20.98.2"))
        .start();
    node.wait_healthy(&["stated", "networkd", "secretsd", "trustd"], T)
        .await;
    // A link of the node's own (both ends in its network namespace).
    node.in_netns(&[
        "ip", "link", "add", "tsd0", "type", "veth", "peer", "name", "tsd1",
    ]);
    node.in_netns(&["ip", "link", "set", "tsd0", "up"]);

    // Issued once the network is ready, and again when the new link's address appears.
    let names = |s: &ApiCertsSpec, ip: &str| {
        s.server.as_ref().is_some_and(|c| {
            Certificate::from_pem(c.crt.as_bytes())
                .and_then(|c| c.info())
                .is_ok_and(|i| i.ips.contains(&ip.parse::<IpAddr>().unwrap()))
        })
    };
    let api = wait_for::<ApiCertsSpec>(&node, API_ID, |s| names(s, "172.20.98.2")).await;
    let server = Certificate::from_pem(api.spec.server.as_ref().unwrap().crt.as_bytes()).unwrap();
    let (os_ca, _) = bundle.os_ca().unwrap();
    assert!(server.is_signed_by(&os_ca));
    let info = server.info().unwrap();
    for ip in ["172.20.98.2", "127.0.0.1"] {
        assert!(
            info.ips.contains(&ip.parse::<IpAddr>().unwrap()),
            "{ip} in {:?}",
            info.ips
        );
    }
    let etcd = wait_for::<EtcdCertsSpec>(&node, ETCD_ID, |s| {
        Certificate::from_pem(s.etcd_peer.crt.as_bytes())
            .and_then(|c| c.info())
            .is_ok_and(|i| i.ips.contains(&"172.20.98.2".parse::<IpAddr>().unwrap()))
    })
    .await;

    // trustd serves with its certificate on the node's address: TLS 1.3, a chain to the OS CA
    // naming that address.
    let ca_file = node.dir().join("os-ca.pem");
    std::fs::write(&ca_file, os_ca.to_pem()).unwrap();
    let s_client = || {
        node.in_netns(&[
            "sh",
            "-c",
            &format!(
                "openssl s_client -connect 172.20.98.2:50001 -tls1_3 -alpn h2 -CAfile {} \
                 -verify_ip 172.20.98.2 -verify_return_error </dev/null 2>&1",
                ca_file.display()
            ),
        ])
    };
    let end = Instant::now() + T;
    loop {
        let out = s_client();
        if out.contains("Verify return code: 0 (ok)") && out.contains("TLSv1.3") {
            break;
        }
        assert!(
            Instant::now() < end,
            "trustd does not serve:\n{out}\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let old = node.service("secretsd").await.unwrap();
    let host = node.host_pid(old.pid).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    node.wait_until("secretsd restarted", T, |l| {
        l.iter().any(|s| {
            s.id == "secretsd" && s.healthy && s.pid != old.pid && s.restarts == old.restarts + 1
        })
    })
    .await;
    // Time for the restarted controllers to run (and, wrongly, reissue).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let client = node.state();
    let after = client
        .get_typed::<ApiCertsSpec>(NAMESPACE, API_ID)
        .await
        .unwrap();
    assert_eq!(
        after.metadata.version, api.metadata.version,
        "apid's certificates reissued"
    );
    assert_eq!(after.spec, api.spec);
    let after = client
        .get_typed::<EtcdCertsSpec>(NAMESPACE, ETCD_ID)
        .await
        .unwrap();
    assert_eq!(
        after.metadata.version, etcd.metadata.version,
        "etcd's certificates reissued"
    );
}
