//! For other crates' tests (feature `testing`): the inputs secretsd reads on a control plane,
//! written as init and networkd would, and secretsd's controllers running on them, so that a
//! daemon downstream (trustd, apid) is tested against certificates secretsd really mints.

use cosi::{Resource, ResourceSpec};
use machinery::config::generate::{generate, Input};
use machinery::config::MachineType;
use machinery::resources::config::{
    MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG_NS, REDACTED_NAMESPACE,
};
use machinery::resources::network::{
    filtered_node_address_id, HostnameStatusSpec, NodeAddressSpec, StatusSpec, FILTER_NO_K8S,
    HOSTNAME_ID, NAMESPACE as NETWORK_NS, NODE_ADDRESS_ACCUMULATIVE_ID, STATUS_ID,
};
use machinery::secrets::Bundle;
use tokio::sync::oneshot;

/// Creates or updates `id` of `S` in `ns` as the client (an admin).
///
/// # Panics
///
/// When stated refuses (a test failure).
pub async fn put<S: ResourceSpec>(c: &cosi::Client, ns: &str, id: &str, spec: S) {
    let raw = Resource::new(ns, id, spec)
        .to_raw()
        .unwrap_or_else(|e| panic!("encode {id}: {e}"));
    match c.get(ns, S::TYPE, id).await {
        Ok(cur) => {
            let mut raw = raw;
            raw.metadata.version = cur.metadata.version;
            if let Err(e) = c.update(&raw, "", None).await {
                panic!("update {id}: {e}");
            }
        }
        Err(_) => {
            if let Err(e) = c.create(&raw, "").await {
                panic!("create {id}: {e}");
            }
        }
    }
}

/// Sets the node's addresses (the no-k8s filtered NodeAddress secretsd names in certificates).
pub async fn addresses(c: &cosi::Client, addrs: &[&str]) {
    put(
        c,
        NETWORK_NS,
        &filtered_node_address_id(NODE_ADDRESS_ACCUMULATIVE_ID, FILTER_NO_K8S),
        NodeAddressSpec {
            addresses: addrs
                .iter()
                .map(|a| a.parse().unwrap_or_else(|e| panic!("{a}: {e}")))
                .collect(),
            ..NodeAddressSpec::default()
        },
    )
    .await;
}

/// A control plane named `cp-1` at 10.5.0.2 (with 127.0.0.1 in its certSANs) of cluster
/// `demo`, made from `bundle`, with every type defined (as the daemons would) and secretsd's
/// controllers running until the returned sender is dropped.
///
/// # Panics
///
/// When the configuration cannot be made or stated refuses it (a test failure).
pub async fn control_plane(client: &cosi::Client, bundle: &Bundle) -> oneshot::Sender<()> {
    control_plane_named(client, bundle, "cp-1", &["127.0.0.1"]).await
}

/// [`control_plane`] named `hostname`, with `cert_sans` in its certSANs (each apid of a test
/// of several nodes on one host listens on its own loopback address).
///
/// # Panics
///
/// As [`control_plane`].
pub async fn control_plane_named(
    client: &cosi::Client,
    bundle: &Bundle,
    hostname: &str,
    cert_sans: &[&str],
) -> oneshot::Sender<()> {
    node(
        client,
        bundle,
        &Node {
            machine_type: MachineType::ControlPlane,
            endpoint: "https://10.5.0.2:6443",
            hostname,
            address: "10.5.0.2/24",
            cert_sans,
        },
    )
    .await
}

/// What a node of [`node`] is.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Control plane or worker.
    pub machine_type: MachineType,
    /// `cluster.controlPlane.endpoint` (a worker's trustd is its host).
    pub endpoint: &'a str,
    /// Its hostname.
    pub hostname: &'a str,
    /// Its address (the NodeAddress secretsd names in certificates), with prefix.
    pub address: &'a str,
    /// `machine.certSANs`.
    pub cert_sans: &'a [&'a str],
}

/// A node of cluster `demo` made from `bundle` as `gen config` makes it (a worker's holds no
/// CA key), with every type defined and secretsd's controllers running until the returned
/// sender is dropped.
///
/// # Panics
///
/// As [`control_plane`].
pub async fn node(client: &cosi::Client, bundle: &Bundle, n: &Node<'_>) -> oneshot::Sender<()> {
    let (hostname, cert_sans) = (n.hostname, n.cert_sans);
    let mut config = generate(&Input::new("demo", n.endpoint, bundle), n.machine_type)
        .unwrap_or_else(|e| panic!("generate: {e}"));
    if let Err(e) = client
        .define_types(&machinery::resources::definitions(), "")
        .await
    {
        panic!("define types: {e}");
    }
    if let Some(m) = config.v1alpha1.as_mut().and_then(|d| d.machine.as_mut()) {
        m.cert_sans = cert_sans.iter().map(|s| (*s).to_string()).collect();
    }
    let yaml = config.to_yaml().unwrap_or_else(|e| panic!("yaml: {e}"));
    put(client, CONFIG_NS, ACTIVE_ID, MachineConfigSpec(yaml)).await;
    // What init's RedactController keeps for the daemons that hold no key (apid).
    let redacted = config
        .redacted()
        .to_yaml()
        .unwrap_or_else(|e| panic!("yaml: {e}"));
    put(
        client,
        REDACTED_NAMESPACE,
        ACTIVE_ID,
        MachineConfigSpec(redacted),
    )
    .await;
    put(
        client,
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
    put(
        client,
        NETWORK_NS,
        HOSTNAME_ID,
        HostnameStatusSpec {
            hostname: hostname.into(),
            domainname: String::new(),
        },
    )
    .await;
    addresses(client, &[n.address]).await;
    let registry = crate::controllers::registry(&crate::controllers::Options::default())
        .unwrap_or_else(|e| panic!("registry: {e}"));
    let runtime = cosi::Runtime::with_registry(client.clone(), registry);
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        if let Err(e) = runtime.run(rx).await {
            panic!("secretsd's runtime: {e}");
        }
    });
    stop
}
