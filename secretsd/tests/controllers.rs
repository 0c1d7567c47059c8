//! secretsd's controllers on the real runtime against a real stated (in process): the root
//! secrets of a control plane and a worker made from upstream's own secrets bundle, the leaf
//! certificates and their chains, what a restart and an input change reissue, the half-life
//! renewal, and an invalid configuration that changes nothing.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use cosi::runtime::Runtime;
use cosi::{Client, Resource, ResourceSpec};
use machinery::config::generate::{generate, Input};
use machinery::config::MachineType;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG_NS};
use machinery::resources::network::{
    filtered_node_address_id, HostnameStatusSpec, NodeAddressSpec, StatusSpec, FILTER_NO_K8S,
    HOSTNAME_ID, NAMESPACE as NETWORK_NS, NODE_ADDRESS_ACCUMULATIVE_ID, STATUS_ID,
};
use machinery::resources::secrets::{
    ApiCertsSpec, CertificateAndKey, EtcdCertsSpec, EtcdRootSpec, KubeletSpec, KubernetesRootSpec,
    OsRootSpec, TrustdCertsSpec, API_ID, ETCD_ID, ETCD_ROOT_ID, KUBELET_ID, KUBERNETES_ROOT_ID,
    NAMESPACE, OS_ROOT_ID, TRUSTD_ID,
};
use machinery::secrets::x509::{self, Certificate, CertificateInfo, KeyAlgorithm, PrivateKey};
use machinery::secrets::Bundle;
use secretsd::controllers::{registry, Options};
use stated::testing::Harness;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const UPSTREAM: &str = include_str!("../../machinery/tests/data/upstream-secrets.yaml");
const DEADLINE: Duration = Duration::from_secs(30);

struct Node {
    _harness: Harness,
    client: Client,
    options: Options,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Node {
    async fn start(options: Options) -> Self {
        let harness = Harness::start().await;
        let client = harness.client.clone();
        client
            .define_types(&machinery::resources::secrets::definitions(), "secretsd")
            .await
            .unwrap();
        let mut node = Self {
            _harness: harness,
            client,
            options,
            stop: None,
            task: None,
        };
        node.start_controllers();
        node
    }

    fn start_controllers(&mut self) {
        let runtime = Runtime::with_registry(self.client.clone(), registry(&self.options).unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        self.stop = Some(tx);
        self.task = Some(tokio::spawn(async move {
            runtime.run(rx).await.expect("runtime");
        }));
    }

    async fn stop_controllers(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
        }
    }

    async fn put<S: ResourceSpec>(&self, ns: &str, id: &str, spec: S) {
        let raw = Resource::new(ns, id, spec).to_raw().unwrap();
        match self.client.get(ns, S::TYPE, id).await {
            Ok(cur) => {
                let mut raw = raw;
                raw.metadata.version = cur.metadata.version;
                self.client.update(&raw, "", None).await.unwrap();
            }
            Err(e) if e.is_not_found() => {
                self.client.create(&raw, "").await.unwrap();
            }
            Err(e) => panic!("get {ns}/{id}: {e}"),
        }
    }

    async fn get<S: ResourceSpec>(&self, id: &str) -> Option<Resource<S>> {
        match self.client.get_typed::<S>(NAMESPACE, id).await {
            Ok(r) => Some(r),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("get {id}: {e}"),
        }
    }

    async fn expect<S: ResourceSpec>(&self, id: &str, pred: impl Fn(&S) -> bool) -> Resource<S> {
        eventually(&format!("{}/{id}", S::TYPE), || async {
            self.get::<S>(id).await.filter(|r| pred(&r.spec))
        })
        .await
    }

    async fn config(&self, yaml: &str) {
        self.put(CONFIG_NS, ACTIVE_ID, MachineConfigSpec(yaml.to_string()))
            .await;
    }

    /// What networkd would publish: the network ready, a hostname and the addresses.
    async fn network(&self, hostname: &str, domain: &str, addresses: &[&str]) {
        self.put(
            NETWORK_NS,
            STATUS_ID,
            StatusSpec {
                address_ready: true,
                connectivity_ready: true,
                hostname_ready: true,
                etc_files_ready: true,
                unapplied: vec![],
            },
        )
        .await;
        self.put(
            NETWORK_NS,
            HOSTNAME_ID,
            HostnameStatusSpec {
                hostname: hostname.into(),
                domainname: domain.into(),
            },
        )
        .await;
        self.addresses(addresses).await;
    }

    async fn addresses(&self, addresses: &[&str]) {
        self.put(
            NETWORK_NS,
            &filtered_node_address_id(NODE_ADDRESS_ACCUMULATIVE_ID, FILTER_NO_K8S),
            NodeAddressSpec {
                addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
                ..NodeAddressSpec::default()
            },
        )
        .await;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn bundle() -> Bundle {
    Bundle::from_yaml(UPSTREAM).unwrap()
}

fn config(bundle: &Bundle, role: MachineType, cert_sans: &[&str]) -> String {
    let input = Input::new("demo", "https://10.5.0.2:6443", bundle);
    let mut config = generate(&input, role).unwrap();
    let machine = config
        .v1alpha1
        .as_mut()
        .and_then(|d| d.machine.as_mut())
        .unwrap();
    machine.cert_sans = cert_sans.iter().map(|s| s.to_string()).collect();
    config.to_yaml().unwrap()
}

fn os_ca(bundle: &Bundle) -> Certificate {
    bundle.os_ca().unwrap().0
}

fn etcd_ca(bundle: &Bundle) -> Certificate {
    let pem = &bundle
        .certs
        .as_ref()
        .unwrap()
        .etcd
        .as_ref()
        .unwrap()
        .parse()
        .unwrap()
        .0;
    pem.clone()
}

/// The certificate of a pair, checked against its key.
fn leaf(pair: &CertificateAndKey) -> (Certificate, CertificateInfo) {
    let cert = Certificate::from_pem(pair.crt.as_bytes()).unwrap();
    let key = PrivateKey::from_pem(pair.key.as_bytes()).unwrap();
    assert!(
        cert.matches_key(&key),
        "the key beside a certificate is its own"
    );
    let info = cert.info().unwrap();
    (cert, info)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_gets_every_root_and_leaves_that_chain_to_its_cas() {
    let bundle = bundle();
    let node = Node::start(Options::default()).await;
    node.config(&config(
        &bundle,
        MachineType::ControlPlane,
        &["127.0.0.1", "api.example"],
    ))
    .await;
    node.network("cp-1", "lab", &["10.5.0.2/24"]).await;

    let root = node.expect::<OsRootSpec>(OS_ROOT_ID, |_| true).await.spec;
    assert!(root
        .issuing_ca
        .as_ref()
        .is_some_and(|ca| !ca.key.is_empty()));
    assert_eq!(
        root.accepted_cas.last().unwrap().crt,
        os_ca(&bundle).to_pem()
    );
    assert_eq!(root.cert_san_ips, [ip("127.0.0.1")]);
    assert_eq!(root.cert_san_dns_names, ["api.example"]);
    assert_eq!(root.token, bundle.trustdinfo.as_ref().unwrap().token);

    let api = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server.is_some())
        .await
        .spec;
    let (server, info) = leaf(api.server.as_ref().unwrap());
    assert!(server.is_signed_by(&os_ca(&bundle)));
    assert_eq!(info.common_name.as_deref(), Some("cp-1.lab"));
    assert!(info.organizations.is_empty());
    assert_eq!(info.dns_names, ["api.example", "cp-1", "cp-1.lab"]);
    assert_eq!(info.ips, [ip("10.5.0.2"), ip("127.0.0.1")]);
    assert_eq!(info.lifetime(), Duration::from_secs(24 * 3600));
    // The Talos API's serving keys are ECDSA P-256 (gRPC's C-core clients refuse Ed25519),
    // under the Ed25519 OS CA; the client certificate's key follows the CA's.
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));
    let (client, info) = leaf(api.client.as_ref().unwrap());
    assert!(client.is_signed_by(&os_ca(&bundle)));
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::Ed25519));
    assert_eq!(info.organizations, ["os:impersonator"]);
    assert!(info.dns_names.is_empty() && info.ips.is_empty());
    assert_eq!(api.accepted_cas, root.accepted_cas);

    let trustd = node
        .expect::<TrustdCertsSpec>(TRUSTD_ID, |s| s.server.is_some())
        .await
        .spec;
    let (cert, info) = leaf(trustd.server.as_ref().unwrap());
    assert!(cert.is_signed_by(&os_ca(&bundle)));
    assert_eq!(info.ips, [ip("10.5.0.2"), ip("127.0.0.1")]);
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));

    let etcd_root = node
        .expect::<EtcdRootSpec>(ETCD_ROOT_ID, |_| true)
        .await
        .spec;
    assert_eq!(etcd_root.etcd_ca.crt, etcd_ca(&bundle).to_pem());
    let etcd = node.expect::<EtcdCertsSpec>(ETCD_ID, |_| true).await.spec;
    for pair in [
        &etcd.etcd,
        &etcd.etcd_peer,
        &etcd.etcd_admin,
        &etcd.etcd_api_server,
    ] {
        let (cert, info) = leaf(pair);
        assert!(cert.is_signed_by(&etcd_ca(&bundle)));
        assert!(!cert.is_signed_by(&os_ca(&bundle)));
        assert_eq!(info.lifetime(), Duration::from_secs(87_600 * 3600));
    }
    let (_, server) = leaf(&etcd.etcd);
    assert_eq!(server.common_name.as_deref(), Some("cp-1"));
    assert!(server.dns_names.contains(&"localhost".to_string()));
    assert!(server.ips.contains(&ip("::1")) && server.ips.contains(&ip("10.5.0.2")));
    let (_, peer) = leaf(&etcd.etcd_peer);
    assert!(!peer.dns_names.contains(&"localhost".to_string()));
    assert_eq!(peer.ips, [ip("10.5.0.2")]);
    assert_eq!(
        leaf(&etcd.etcd_admin).1.common_name.as_deref(),
        Some("talos")
    );
    assert_eq!(
        leaf(&etcd.etcd_api_server).1.common_name.as_deref(),
        Some("kube-apiserver")
    );

    let k8s = node
        .expect::<KubernetesRootSpec>(KUBERNETES_ROOT_ID, |_| true)
        .await
        .spec;
    assert_eq!(k8s.name, "demo");
    assert_eq!(k8s.endpoint, "https://10.5.0.2:6443");
    assert_eq!(k8s.api_server_ips, [ip("10.96.0.1")]);
    assert!(k8s.issuing_ca.is_some() && k8s.aggregator_ca.is_some());
    assert!(k8s
        .service_account
        .as_ref()
        .is_some_and(|k| k.key.contains("PRIVATE KEY")));
    let token = bundle.secrets.as_ref().unwrap().bootstraptoken.clone();
    assert_eq!(
        format!("{}.{}", k8s.bootstrap_token_id, k8s.bootstrap_token_secret),
        token
    );
    let kubelet = node.expect::<KubeletSpec>(KUBELET_ID, |_| true).await.spec;
    assert_eq!(kubelet.bootstrap_token_id, k8s.bootstrap_token_id);
    assert!(
        kubelet.endpoint.starts_with("https://"),
        "{}",
        kubelet.endpoint
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_no_issuing_ca_and_mints_nothing() {
    let bundle = bundle();
    let node = Node::start(Options::default()).await;
    node.config(&config(&bundle, MachineType::Worker, &[]))
        .await;
    node.network("w-1", "", &["10.5.0.3/24"]).await;
    let root = node.expect::<OsRootSpec>(OS_ROOT_ID, |_| true).await.spec;
    assert!(root.issuing_ca.is_none(), "a worker's config has no CA key");
    assert_eq!(root.accepted_cas.len(), 1);
    let kubelet = node.expect::<KubeletSpec>(KUBELET_ID, |_| true).await.spec;
    assert_eq!(kubelet.endpoint, "https://10.5.0.2:6443");
    // The CertSANs exist (apid will ask trustd with them); nothing is signed here.
    node.expect::<machinery::resources::secrets::CertSanSpec>("api", |s| s.fqdn == "w-1")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(node.get::<ApiCertsSpec>(API_ID).await.is_none());
    assert!(node.get::<TrustdCertsSpec>(TRUSTD_ID).await.is_none());
    assert!(node.get::<EtcdRootSpec>(ETCD_ROOT_ID).await.is_none());
    assert!(node.get::<EtcdCertsSpec>(ETCD_ID).await.is_none());
    assert!(node
        .get::<KubernetesRootSpec>(KUBERNETES_ROOT_ID)
        .await
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reissues_nothing_and_a_new_address_reissues_only_what_names_it() {
    let bundle = bundle();
    let mut node = Node::start(Options::default()).await;
    node.config(&config(&bundle, MachineType::ControlPlane, &[]))
        .await;
    node.network("cp-1", "", &["10.5.0.2/24"]).await;
    let api = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server.is_some())
        .await;
    let etcd = node.expect::<EtcdCertsSpec>(ETCD_ID, |_| true).await;
    let trustd = node.expect::<TrustdCertsSpec>(TRUSTD_ID, |_| true).await;

    node.stop_controllers().await;
    node.start_controllers();
    // The restarted controllers have run once they published their graph edges; give them
    // time to (wrongly) reissue.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = node.get::<ApiCertsSpec>(API_ID).await.unwrap();
    assert_eq!(after.spec, api.spec, "a restart reissues nothing");
    assert_eq!(
        after.metadata.version, api.metadata.version,
        "not even rewritten"
    );
    assert_eq!(
        node.get::<EtcdCertsSpec>(ETCD_ID).await.unwrap().spec,
        etcd.spec
    );
    assert_eq!(
        node.get::<TrustdCertsSpec>(TRUSTD_ID).await.unwrap().spec,
        trustd.spec
    );

    node.addresses(&["10.5.0.2/24", "10.6.0.2/24"]).await;
    let new = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server != api.spec.server)
        .await
        .spec;
    assert!(leaf(new.server.as_ref().unwrap())
        .1
        .ips
        .contains(&ip("10.6.0.2")));
    assert_eq!(
        new.client, api.spec.client,
        "the client certificate names no address"
    );
    let new_etcd = node
        .expect::<EtcdCertsSpec>(ETCD_ID, |s| s.etcd != etcd.spec.etcd)
        .await
        .spec;
    assert_ne!(new_etcd.etcd_peer, etcd.spec.etcd_peer);
    assert_eq!(new_etcd.etcd_admin, etcd.spec.etcd_admin);
    assert_eq!(new_etcd.etcd_api_server, etcd.spec.etcd_api_server);
}

/// apid's and trustd's serving certificates of a secretsd of before, Ed25519 keys (the OS
/// CA's), otherwise good, are reissued with ECDSA keys by a restarted secretsd, not kept for
/// their lifetime; the client certificate, whose key follows the CA's, is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reissues_serving_certificates_of_an_ed25519_key_with_ecdsa_keys() {
    let bundle = bundle();
    let mut node = Node::start(Options::default()).await;
    node.config(&config(&bundle, MachineType::ControlPlane, &[]))
        .await;
    node.network("cp-1", "", &["10.5.0.2/24"]).await;
    let api = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server.is_some())
        .await;
    let trustd = node.expect::<TrustdCertsSpec>(TRUSTD_ID, |_| true).await;
    node.stop_controllers().await;

    // The same certificates for Ed25519 keys, as an older secretsd issued them.
    let ca = bundle.os_ca().unwrap();
    let as_before = |pair: &CertificateAndKey| {
        let (cert, info) = leaf(pair);
        let request = x509::LeafRequest {
            subject: x509::Subject {
                organizations: info.organizations.clone(),
                common_name: info.common_name.clone(),
            },
            dns_names: info.dns_names.clone(),
            ips: info.ips.clone(),
            extended: vec![x509::ExtendedUsage::ServerAuth],
            key_algorithm: None,
            ..x509::LeafRequest::default()
        };
        let (crt, key) = request
            .issue((&ca.0, &ca.1), SystemTime::now(), info.lifetime())
            .unwrap();
        assert!(cert.is_signed_by(&ca.0));
        assert_eq!(key.algorithm(), KeyAlgorithm::Ed25519);
        CertificateAndKey {
            crt: crt.to_pem(),
            key: key.to_pem().unwrap(),
        }
    };
    let old_api = ApiCertsSpec {
        server: Some(as_before(api.spec.server.as_ref().unwrap())),
        ..api.spec.clone()
    };
    let old_trustd = TrustdCertsSpec {
        server: Some(as_before(trustd.spec.server.as_ref().unwrap())),
        ..trustd.spec.clone()
    };
    for (raw, current) in [
        (
            Resource::new(NAMESPACE, API_ID, old_api.clone()).to_raw(),
            api.to_raw(),
        ),
        (
            Resource::new(NAMESPACE, TRUSTD_ID, old_trustd.clone()).to_raw(),
            trustd.to_raw(),
        ),
    ] {
        let (mut raw, current) = (raw.unwrap(), current.unwrap());
        raw.metadata.version = current.metadata.version;
        node.client
            .update(&raw, &current.metadata.owner, None)
            .await
            .unwrap();
    }

    node.start_controllers();
    let new = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server != old_api.server)
        .await
        .spec;
    let (server, info) = leaf(new.server.as_ref().unwrap());
    assert!(server.is_signed_by(&os_ca(&bundle)));
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));
    assert_eq!(
        new.client, api.spec.client,
        "the client certificate is kept"
    );
    let new = node
        .expect::<TrustdCertsSpec>(TRUSTD_ID, |s| s.server != old_trustd.server)
        .await
        .spec;
    let (_, info) = leaf(new.server.as_ref().unwrap());
    assert_eq!(info.key_algorithm, Some(KeyAlgorithm::EcdsaP256));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_are_renewed_at_half_their_lifetime() {
    let bundle = bundle();
    let node = Node::start(Options {
        leaf_validity: Duration::from_secs(20),
    })
    .await;
    node.config(&config(&bundle, MachineType::ControlPlane, &[]))
        .await;
    node.network("cp-1", "", &["10.5.0.2/24"]).await;
    let first = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server.is_some())
        .await
        .spec;
    let seen = Instant::now();
    let (_, first_info) = leaf(first.server.as_ref().unwrap());
    assert_eq!(first_info.lifetime(), Duration::from_secs(20));
    let second = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server != first.server)
        .await
        .spec;
    let after = seen.elapsed();
    let (cert, info) = leaf(second.server.as_ref().unwrap());
    assert!(cert.is_signed_by(&os_ca(&bundle)));
    assert!(info.not_before >= first_info.half_life() - Duration::from_secs(1));
    assert!(
        after <= Duration::from_secs(12),
        "renewed {after:?} after the first was seen; its half-life is 10 s"
    );
    assert!(SystemTime::now() < info.not_after);
    // The client certificate is renewed with it.
    assert_ne!(second.client, first.client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_changes_nothing_even_across_a_restart_and_no_config_removes_all() {
    let bundle = bundle();
    let mut node = Node::start(Options::default()).await;
    node.config(&config(&bundle, MachineType::ControlPlane, &[]))
        .await;
    node.network("cp-1", "", &["10.5.0.2/24"]).await;
    let root = node.expect::<OsRootSpec>(OS_ROOT_ID, |_| true).await;
    let api = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server.is_some())
        .await;

    node.config("machine: {type: controlplane, nonsense: 1}\n")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.stop_controllers().await;
    node.start_controllers();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        node.get::<OsRootSpec>(OS_ROOT_ID).await.unwrap().spec,
        root.spec
    );
    assert_eq!(
        node.get::<ApiCertsSpec>(API_ID).await.unwrap().spec,
        api.spec
    );

    node.client
        .destroy(CONFIG_NS, MachineConfigSpec::TYPE, ACTIVE_ID, "")
        .await
        .unwrap();
    eventually("every secret gone with the config", || async {
        (node.get::<OsRootSpec>(OS_ROOT_ID).await.is_none()
            && node.get::<ApiCertsSpec>(API_ID).await.is_none()
            && node.get::<EtcdCertsSpec>(ETCD_ID).await.is_none())
        .then_some(())
    })
    .await;
}

#[test]
fn a_certificate_is_not_signed_by_a_foreign_ca() {
    let bundle = bundle();
    let foreign = x509::self_signed_ca(
        &x509::Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        },
        x509::KeyAlgorithm::Ed25519,
        SystemTime::now(),
    )
    .unwrap();
    let (ca, key) = bundle.os_ca().unwrap();
    let (cert, _) = x509::LeafRequest::default()
        .issue((&ca, &key), SystemTime::now(), Duration::from_secs(60))
        .unwrap();
    assert!(cert.is_signed_by(&ca));
    assert!(!cert.is_signed_by(&foreign.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_that_is_not_ready_for_a_while_takes_no_certificate_away() {
    let bundle = bundle();
    let node = Node::start(Options::default()).await;
    node.config(&config(&bundle, MachineType::ControlPlane, &[]))
        .await;
    node.network("cp-1", "", &["10.5.0.2/24"]).await;
    let api = node
        .expect::<ApiCertsSpec>(API_ID, |s| s.server.is_some())
        .await;
    let etcd = node.expect::<EtcdCertsSpec>(ETCD_ID, |_| true).await;
    // A link flaps: the network is not ready, and networkd's hostname is gone for a while.
    node.put(NETWORK_NS, STATUS_ID, StatusSpec::default()).await;
    node.client
        .destroy(NETWORK_NS, HostnameStatusSpec::TYPE, HOSTNAME_ID, "")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = node.get::<ApiCertsSpec>(API_ID).await.unwrap();
    assert_eq!(now.metadata.version, api.metadata.version);
    assert_eq!(
        node.get::<EtcdCertsSpec>(ETCD_ID)
            .await
            .unwrap()
            .metadata
            .version,
        etcd.metadata.version
    );
    assert!(node
        .get::<machinery::resources::secrets::CertSanSpec>("api")
        .await
        .is_some());
    // Back as it was: nothing is reissued either.
    node.network("cp-1", "", &["10.5.0.2/24"]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        node.get::<ApiCertsSpec>(API_ID)
            .await
            .unwrap()
            .metadata
            .version,
        api.metadata.version
    );
}
