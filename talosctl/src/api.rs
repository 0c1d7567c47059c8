//! The Talos API of a node (apid on TCP 50000, mutual TLS 1.3) with the talosconfig's
//! credentials: the context's `ca` (the OS CA the node's certificate must chain to), `crt` and
//! `key` (the client certificate whose Organization holds the roles), and where to connect.
//!
//! Which node answers, as upstream's talosctl:
//! - the call goes to the first of `-e/--endpoints` (else of the context's `endpoints`): `host`
//!   or `host:port` (port 50000 by default), whose certificate must name `host`;
//! - `-n/--nodes` (else the context's `nodes`, unless `-e` was given) are sent as the `nodes`
//!   metadata: the endpoint's apid forwards the call to each node and answers with every
//!   node's reply, each naming its node (`metadata.hostname`), a node that failed included.
//!   In a context of a local cluster (`cluster create`) a node may be given by name; it is
//!   sent as its address. Without nodes, the endpoint answers for itself.
//!
//! apid forwards to IP addresses only (it resolves no names): a name that is not a local
//! cluster's node comes back as apid's INVALID_ARGUMENT.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use machinery::secrets::x509;
use machinery::tls;
use tonic::transport::Channel;

use crate::cluster::record::Cluster;
use crate::talosconfig::TalosConfig;

/// apid's port.
pub const PORT: u16 = 50000;
/// How long a connection (TCP and the TLS handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What [`resolve`] needs from the command line.
#[derive(Clone, Debug)]
pub struct Selection<'a> {
    /// `-e/--endpoints`.
    pub endpoints: &'a [String],
    /// `-n/--nodes`.
    pub nodes: &'a [String],
    /// The talosconfig file.
    pub talosconfig: &'a Path,
    /// `--context`, if given.
    pub context: Option<&'a str>,
}

/// Where calls go.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The endpoint as the user gave it.
    pub label: String,
    /// Where to connect.
    pub addr: SocketAddr,
    /// The name its certificate must hold (the host part of the endpoint).
    pub server_name: String,
}

/// The endpoint, the nodes it forwards to and the TLS configuration to reach it with.
pub struct Api {
    /// Where to connect.
    pub endpoint: Endpoint,
    /// The nodes (addresses) to send as `nodes` metadata; empty: the endpoint itself.
    pub nodes: Vec<String>,
    config: Arc<tls::rustls::ClientConfig>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("endpoint", &self.endpoint)
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl Api {
    /// The maintenance API of the node at `target` (`host[:port]`), reached without a client
    /// certificate; its certificate pinned to one of `pins` (`--cert-fingerprint`), or taken
    /// as it is without any (`--insecure` alone: trust on first use, as upstream).
    pub fn insecure(target: &str, pins: &[String]) -> anyhow::Result<Api> {
        let (addr, server_name) = endpoint(target)?;
        let config = tls::pinned_client_config(pins).context("TLS client configuration")?;
        Ok(Api {
            endpoint: Endpoint {
                label: target.to_string(),
                addr,
                server_name,
            },
            nodes: Vec::new(),
            config: Arc::new(config),
        })
    }

    /// A lazily connected channel to the endpoint.
    pub fn channel(&self) -> anyhow::Result<Channel> {
        tls::channel(
            self.endpoint.addr,
            &self.endpoint.server_name,
            self.config.clone(),
            CONNECT_TIMEOUT,
        )
        .with_context(|| format!("{}: cannot make a channel", self.endpoint.label))
    }

    /// A channel to `addr` with this endpoint's TLS configuration and server name, its TCP
    /// connections made by `dial` (from inside a node's network namespace: the benchmarks).
    pub fn channel_via(
        &self,
        addr: SocketAddr,
        dial: impl Fn(SocketAddr) -> tls::Dial + Clone + Send + 'static,
    ) -> anyhow::Result<Channel> {
        tls::channel_via(
            addr,
            &self.endpoint.server_name,
            self.config.clone(),
            CONNECT_TIMEOUT,
            dial,
        )
        .with_context(|| format!("{addr}: cannot make a channel"))
    }

    /// `msg` as a request for every node (`nodes` metadata), or for the endpoint itself.
    pub fn for_nodes<T>(&self, msg: T) -> anyhow::Result<tonic::Request<T>> {
        let mut req = tonic::Request::new(msg);
        for n in &self.nodes {
            req.metadata_mut().append("nodes", metadata(n)?);
        }
        Ok(req)
    }

    /// The nodes a per-node command calls, each as (its label, the `node` metadata to send):
    /// every node, or the endpoint itself (no metadata) when there are none.
    pub fn targets(&self) -> Vec<(String, Option<String>)> {
        if self.nodes.is_empty() {
            return vec![(self.endpoint.label.clone(), None)];
        }
        self.nodes
            .iter()
            .map(|n| (n.clone(), Some(n.clone())))
            .collect()
    }

    /// `msg` as a request for `node` only (`node` metadata: apid passes it through to that
    /// node's apid), or for the endpoint itself.
    pub fn for_node<T>(&self, msg: T, node: Option<&str>) -> anyhow::Result<tonic::Request<T>> {
        let mut req = tonic::Request::new(msg);
        if let Some(n) = node {
            req.metadata_mut().insert("node", metadata(n)?);
        }
        Ok(req)
    }

    /// A State API client of every target ([`Api::targets`]), over one connection.
    pub fn state_sources(&self) -> anyhow::Result<Vec<crate::get::Source>> {
        let channel = self.channel()?;
        let peer = format!("the Talos API at {}", self.endpoint.label);
        self.targets()
            .into_iter()
            .map(|(label, node)| {
                let mut client = cosi::Client::over(channel.clone(), peer.clone());
                if let Some(n) = node {
                    client = client.with_metadata(
                        tonic::metadata::MetadataKey::from_static("node"),
                        metadata(&n)?,
                    );
                }
                Ok(crate::get::Source {
                    node: Some(label),
                    client,
                    remote: true,
                })
            })
            .collect()
    }

    /// What names the answering node when its reply does not: the one node asked for, else
    /// the endpoint.
    pub fn default_label(&self) -> &str {
        match self.nodes.as_slice() {
            [one] => one,
            _ => &self.endpoint.label,
        }
    }
}

/// A node as a gRPC metadata value (`node`, `nodes`).
fn metadata(node: &str) -> anyhow::Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
    node.parse()
        .with_context(|| format!("node {node:?} cannot be sent as gRPC metadata"))
}

fn pem(field: &str, context: &str, b64: &str) -> anyhow::Result<String> {
    if b64.trim().is_empty() {
        anyhow::bail!(
            "context {context:?} has no {field}: the Talos API needs the talosconfig's ca, crt \
             and key (`talosctl gen config` and `talosctl cluster create` write them)"
        );
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .with_context(|| format!("context {context:?}: {field} is not base64"))?;
    String::from_utf8(bytes).with_context(|| format!("context {context:?}: {field} is not PEM"))
}

/// The TLS client configuration of a talosconfig context `name`: its `ca` (base64 PEM, one or
/// more certificates) to verify the node, its `crt` and `key` (base64 PEM) to be verified.
pub fn client_config(
    name: &str,
    ca: &str,
    crt: &str,
    key: &str,
) -> anyhow::Result<tls::rustls::ClientConfig> {
    let ca = pem("ca", name, ca)?;
    let crt = pem("crt", name, crt)?;
    let key = pem("key", name, key)?;
    let cas = x509::certificates(ca.as_bytes())
        .with_context(|| format!("context {name:?}: ca is not a PEM certificate"))?;
    tls::client_config(&cas, Some((&crt, &key)))
        .with_context(|| format!("context {name:?}: the client certificate and key"))
}

/// `host`, `host:port` or `[v6]:port` → the address to connect to and the host part.
fn endpoint(text: &str) -> anyhow::Result<(SocketAddr, String)> {
    let text = text.trim();
    let text = text.strip_prefix("https://").unwrap_or(text);
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .with_context(|| format!("endpoint {text:?}: no closing ]"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p
                .parse()
                .with_context(|| format!("endpoint {text:?}: bad port"))?,
            None if after.is_empty() => PORT,
            None => anyhow::bail!("endpoint {text:?}: junk after ]"),
        };
        (h.to_string(), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (
                h.to_string(),
                p.parse()
                    .with_context(|| format!("endpoint {text:?}: bad port"))?,
            ),
            _ => (text.to_string(), PORT),
        }
    };
    if host.is_empty() {
        anyhow::bail!("endpoint {text:?} has no host");
    }
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .with_context(|| format!("endpoint {text:?}: cannot resolve {host}"))?
        .next()
        .with_context(|| format!("endpoint {text:?}: {host} has no address"))?;
    Ok((addr, host))
}

/// The endpoint, the nodes and the credentials, from the talosconfig and the command line.
pub fn resolve(sel: &Selection<'_>) -> anyhow::Result<Api> {
    let config = TalosConfig::load(sel.talosconfig)?;
    let (name, ctx) = config.context(sel.context).with_context(|| {
        format!(
            "no talosconfig context for the Talos API in {}",
            sel.talosconfig.display()
        )
    })?;
    let tls = client_config(name, &ctx.ca, &ctx.crt, &ctx.key)?;
    let endpoints: &[String] = if sel.endpoints.is_empty() {
        &ctx.endpoints
    } else {
        sel.endpoints
    };
    // With -e and no -n, the endpoint itself: the context's nodes belong to its endpoints.
    let nodes: &[String] = if !sel.nodes.is_empty() {
        sel.nodes
    } else if sel.endpoints.is_empty() {
        &ctx.nodes
    } else {
        &[]
    };
    let cluster = match &ctx.local_cluster {
        Some(dir) => Some(Cluster::load(dir).with_context(|| {
            format!(
                "context {name:?}: its cluster ({}) is gone (talosctl cluster create)",
                dir.display()
            )
        })?),
        None => None,
    };
    let first = endpoints
        .first()
        .with_context(|| format!("context {name:?} has no endpoints: give -e/--endpoints"))?;
    let (addr, host) = endpoint(first)?;
    let mut targets = Vec::new();
    for wanted in nodes {
        let wanted = wanted.trim();
        let ip = match &cluster {
            Some(cluster) => {
                let node = cluster.find(wanted).with_context(|| {
                    format!(
                        "node {wanted:?} is not in cluster {} (context {name:?})",
                        cluster.name
                    )
                })?;
                node.ip.clone()
            }
            None => wanted.to_string(),
        };
        if !targets.contains(&ip) {
            targets.push(ip);
        }
    }
    Ok(Api {
        endpoint: Endpoint {
            label: first.clone(),
            addr,
            server_name: host,
        },
        nodes: targets,
        config: Arc::new(tls),
    })
}

/// Says what a failed call means, for the error line.
pub fn explain(api: &Api, status: &tonic::Status) -> anyhow::Error {
    let ep = &api.endpoint;
    match status.code() {
        tonic::Code::PermissionDenied => anyhow::anyhow!(
            "{}: permission denied: {} (the talosconfig's certificate lacks the role)",
            ep.label,
            status.message()
        ),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            anyhow::anyhow!(
                "{}: the Talos API at {} does not answer: {} (is the node up, and does it \
                 accept this talosconfig's certificate?)",
                ep.label,
                ep.addr,
                cosi::error::Chain(status)
            )
        }
        _ => anyhow::anyhow!("{}: {}", ep.label, status.message()),
    }
}

/// A node's failure inside a reply (`metadata.error`), for the error line.
pub fn node_error(node: &str, status: Option<&proto::google::rpc::Status>, error: &str) -> String {
    match status {
        Some(s) if s.code == tonic::Code::PermissionDenied as i32 => format!(
            "{node}: permission denied: {} (the talosconfig's certificate lacks the role)",
            s.message
        ),
        Some(s) if s.code == tonic::Code::Unavailable as i32 => format!(
            "{node}: the node's Talos API does not answer the endpoint: {}",
            s.message
        ),
        Some(s) if !s.message.is_empty() => format!("{node}: {}", s.message),
        _ => format!("{node}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_the_default_port() {
        let (a, h) = endpoint("127.0.0.1").unwrap();
        assert_eq!(
            (a.to_string(), h.as_str()),
            ("127.0.0.1:50000".into(), "127.0.0.1")
        );
        let (a, _) = endpoint("127.0.0.1:40001").unwrap();
        assert_eq!(a.port(), 40001);
        let (a, h) = endpoint("[::1]:5").unwrap();
        assert_eq!((a.port(), h.as_str()), (5, "::1"));
        let (a, _) = endpoint("::1").unwrap();
        assert_eq!(a.port(), PORT);
        assert!(endpoint("127.0.0.1:x").is_err());
        assert!(endpoint(":5").is_err());
    }

    fn talosconfig(dir: &Path, crt: bool) -> std::path::PathBuf {
        let bundle = machinery::secrets::Bundle::generate(std::time::SystemTime::now()).unwrap();
        let client = bundle
            .client_certificate(
                &["os:reader".to_string()],
                std::time::SystemTime::now(),
                Duration::from_secs(3600),
            )
            .unwrap();
        let mut config = TalosConfig {
            context: Some("x".into()),
            ..TalosConfig::default()
        };
        config.contexts.insert(
            "x".into(),
            crate::talosconfig::Context {
                endpoints: vec!["127.0.0.1:40000".into(), "10.9.0.2".into()],
                nodes: vec!["10.9.0.2".into()],
                ca: bundle.os_ca_crt(),
                crt: if crt { client.crt } else { String::new() },
                key: client.key,
                ..Default::default()
            },
        );
        let path = dir.join("talosconfig");
        config.save(&path).unwrap();
        path
    }

    #[test]
    fn calls_go_to_the_first_endpoint_with_the_nodes_as_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = talosconfig(dir.path(), true);
        let sel = |endpoints: &[&str], nodes: &[&str]| {
            let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            let (e, n) = (own(endpoints), own(nodes));
            resolve(&Selection {
                endpoints: &e,
                nodes: &n,
                talosconfig: &path,
                context: None,
            })
            .unwrap()
        };
        // The context's first endpoint, its nodes as metadata.
        let api = sel(&[], &[]);
        assert_eq!(api.endpoint.addr.to_string(), "127.0.0.1:40000");
        assert_eq!(api.endpoint.server_name, "127.0.0.1");
        assert_eq!(api.nodes, ["10.9.0.2"]);
        let req = api.for_nodes(()).unwrap();
        let sent: Vec<_> = req.metadata().get_all("nodes").iter().collect();
        assert_eq!(sent, ["10.9.0.2"]);
        assert_eq!(api.default_label(), "10.9.0.2");
        // -e alone: the endpoint answers for itself, no metadata.
        let api = sel(&["10.9.0.7"], &[]);
        assert_eq!(api.endpoint.addr.to_string(), "10.9.0.7:50000");
        assert!(api.nodes.is_empty());
        assert!(api.for_nodes(()).unwrap().metadata().get("nodes").is_none());
        assert_eq!(api.default_label(), "10.9.0.7");
        // -n: any nodes, each once, in order; the endpoint forwards.
        let api = sel(&[], &["10.9.0.3", "10.9.0.4", "10.9.0.3"]);
        assert_eq!(api.nodes, ["10.9.0.3", "10.9.0.4"]);
        assert_eq!(api.default_label(), "127.0.0.1:40000");
    }

    #[test]
    fn a_context_without_a_client_certificate_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = talosconfig(dir.path(), false);
        let err = format!(
            "{:#}",
            resolve(&Selection {
                endpoints: &[],
                nodes: &[],
                talosconfig: &path,
                context: None,
            })
            .unwrap_err()
        );
        assert!(err.contains("context \"x\" has no crt"), "{err}");
    }
}
