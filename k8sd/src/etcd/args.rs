//! etcd's command line, as upstream's `argsForControlPlane` renders it (`--key=value`, sorted,
//! one per value), in etcd 3.4's flags where upstream's (etcd 3.6+) do not exist in 3.4:
//!
//! | upstream | here (etcd 3.4) |
//! |---|---|
//! | `--feature-gates=InitialCorruptCheck=true` | `--experimental-initial-corrupt-check=true` |
//! | `--feature-gates=CompactHashCheck=true` | none: 3.4 has no compaction hash check |
//! | `--watch-progress-notify-interval=5s` | `--experimental-watch-progress-notify-interval=5s` |
//! | `--tls-min-version=TLS1.3` | none: 3.4 cannot require TLS 1.3 (Go 1.19's cipher suite list applies to TLS 1.2 only) |
//! | `--listen-client-http-urls=…:2383` | none: 3.4 serves health and metrics on the client port |
//!
//! and two of ours: `--logger=zap --log-outputs=stderr` (3.4's default logger is the deprecated
//! capnslog; upstream's etcd logs zap to stderr by default).
//!
//! A user's `cluster.etcd.extraArgs` may not override any of these flags ([`ArgsError`]), as
//! upstream's deny list, except the four upstream leaves to the user:
//! `initial-cluster-state`, `initial-cluster`, `initial-advertise-peer-urls` and
//! `advertise-client-urls`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use machinery::resources::etcd::{EtcdSpecSpec, CLIENT_PORT, PEER_PORT, PINNED_ARGS};

/// How etcd starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// A new cluster of this member alone (`talosctl bootstrap`).
    Bootstrap,
    /// A learner of an existing cluster: `initial_cluster` as `name=url,...`.
    Join {
        /// Every member's name and peer URL, this one's included.
        initial_cluster: String,
    },
    /// From its data directory (not empty): no initial cluster at all.
    Resume,
}

impl Start {
    /// `bootstrap`, `join`, `resume`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Start::Bootstrap => "bootstrap",
            Start::Join { .. } => "join",
            Start::Resume => "resume",
        }
    }
}

/// Where etcd's files are.
#[derive(Clone, Debug)]
pub struct Paths<'a> {
    /// `--data-dir`.
    pub data_dir: &'a Path,
    /// The directory of `ca.crt`, `server.{crt,key}`, `peer.{crt,key}`.
    pub pki_dir: &'a Path,
}

/// A user's extra argument that may not be given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("extra arg {0:?} is not allowed")]
pub struct ArgsError(pub String);

/// `https://<ip>:<port>` (IPv6 in brackets).
pub fn url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("https://{v4}:{port}"),
        IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
    }
}

fn urls(ips: &[IpAddr], port: u16) -> String {
    ips.iter()
        .map(|ip| url(*ip, port))
        .collect::<Vec<_>>()
        .join(",")
}

/// This member's `name=peer-url` entries.
pub fn own_initial_cluster(spec: &EtcdSpecSpec) -> String {
    spec.advertised_addresses
        .iter()
        .map(|ip| format!("{}={}", spec.name, url(*ip, PEER_PORT)))
        .collect::<Vec<_>>()
        .join(",")
}

/// etcd's arguments.
///
/// # Errors
///
/// [`ArgsError`] naming the first extra argument that would override a pinned flag.
pub fn render(spec: &EtcdSpecSpec, start: &Start, paths: &Paths) -> Result<Vec<String>, ArgsError> {
    let pki = |f: &str| paths.pki_dir.join(f).display().to_string();
    let mut base: BTreeMap<String, String> = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        base.insert(k.to_string(), v);
    };
    set("name", spec.name.clone());
    set("auto-tls", "false".into());
    set("peer-auto-tls", "false".into());
    set("data-dir", paths.data_dir.display().to_string());
    set(
        "listen-peer-urls",
        urls(&spec.listen_peer_addresses, PEER_PORT),
    );
    set(
        "listen-client-urls",
        urls(&spec.listen_client_addresses, CLIENT_PORT),
    );
    set("client-cert-auth", "true".into());
    set("cert-file", pki("server.crt"));
    set("key-file", pki("server.key"));
    set("trusted-ca-file", pki("ca.crt"));
    set("peer-client-cert-auth", "true".into());
    set("peer-cert-file", pki("peer.crt"));
    set("peer-key-file", pki("peer.key"));
    set("peer-trusted-ca-file", pki("ca.crt"));
    set("experimental-initial-corrupt-check", "true".into());
    set("experimental-watch-progress-notify-interval", "5s".into());
    set("logger", "zap".into());
    set("log-outputs", "stderr".into());
    // Denied: every key above (machinery's PINNED_ARGS, which validation refuses too). The
    // four below only when the user did not give them.
    for k in spec.extra_args.keys() {
        if base.contains_key(k) || PINNED_ARGS.contains(&k.as_str()) {
            return Err(ArgsError(k.clone()));
        }
    }
    let user = |k: &str| spec.extra_args.contains_key(k);
    match start {
        Start::Bootstrap => {
            if !user("initial-cluster-state") {
                base.insert("initial-cluster-state".into(), "new".into());
            }
            if !user("initial-cluster") {
                base.insert("initial-cluster".into(), own_initial_cluster(spec));
            }
        }
        Start::Join { initial_cluster } => {
            if !user("initial-cluster-state") {
                base.insert("initial-cluster-state".into(), "existing".into());
            }
            if !user("initial-cluster") {
                base.insert("initial-cluster".into(), initial_cluster.clone());
            }
        }
        Start::Resume => {}
    }
    if !user("initial-advertise-peer-urls") {
        base.insert(
            "initial-advertise-peer-urls".into(),
            urls(&spec.advertised_addresses, PEER_PORT),
        );
    }
    if !user("advertise-client-urls") {
        base.insert(
            "advertise-client-urls".into(),
            urls(&spec.advertised_addresses, CLIENT_PORT),
        );
    }
    for (k, v) in &spec.extra_args {
        base.insert(k.clone(), v.clone());
    }
    Ok(base
        .into_iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> EtcdSpecSpec {
        EtcdSpecSpec {
            name: "cp-1".into(),
            advertised_addresses: vec!["10.5.0.2".parse().unwrap()],
            listen_peer_addresses: vec!["0.0.0.0".parse().unwrap()],
            listen_client_addresses: vec!["0.0.0.0".parse().unwrap()],
            ..Default::default()
        }
    }

    fn paths() -> Paths<'static> {
        Paths {
            data_dir: Path::new("/var/lib/etcd"),
            pki_dir: Path::new("/system/secrets/etcd"),
        }
    }

    #[test]
    fn a_bootstrap_starts_a_cluster_of_itself() {
        let a = render(&spec(), &Start::Bootstrap, &paths()).unwrap();
        for want in [
            "--name=cp-1",
            "--data-dir=/var/lib/etcd",
            "--initial-cluster-state=new",
            "--initial-cluster=cp-1=https://10.5.0.2:2380",
            "--initial-advertise-peer-urls=https://10.5.0.2:2380",
            "--advertise-client-urls=https://10.5.0.2:2379",
            "--listen-peer-urls=https://0.0.0.0:2380",
            "--listen-client-urls=https://0.0.0.0:2379",
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
            "--trusted-ca-file=/system/secrets/etcd/ca.crt",
            "--experimental-initial-corrupt-check=true",
        ] {
            assert!(a.contains(&want.to_string()), "{want} missing from {a:#?}");
        }
        let keys: Vec<&str> = a.iter().map(|x| x.split('=').next().unwrap()).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted, "sorted by key, as upstream renders them");
    }

    #[test]
    fn a_resume_names_no_initial_cluster() {
        let a = render(&spec(), &Start::Resume, &paths()).unwrap();
        assert!(
            !a.iter().any(|x| x.starts_with("--initial-cluster")),
            "{a:#?}"
        );
        let j = render(
            &spec(),
            &Start::Join {
                initial_cluster: "a=https://10.5.0.3:2380,cp-1=https://10.5.0.2:2380".into(),
            },
            &paths(),
        )
        .unwrap();
        assert!(j.contains(&"--initial-cluster-state=existing".to_string()));
    }

    #[test]
    fn a_pinned_flag_cannot_be_overridden_but_the_four_can() {
        let mut s = spec();
        s.extra_args
            .insert("client-cert-auth".into(), "false".into());
        assert_eq!(
            render(&s, &Start::Bootstrap, &paths()),
            Err(ArgsError("client-cert-auth".into()))
        );
        let mut s = spec();
        s.extra_args.insert(
            "advertise-client-urls".into(),
            "https://1.2.3.4:2379".into(),
        );
        s.extra_args
            .insert("election-timeout".into(), "5000".into());
        let a = render(&s, &Start::Bootstrap, &paths()).unwrap();
        assert!(a.contains(&"--advertise-client-urls=https://1.2.3.4:2379".to_string()));
        assert!(a.contains(&"--election-timeout=5000".to_string()));
    }

    #[test]
    fn the_pinned_list_is_what_is_rendered() {
        let a = render(&spec(), &Start::Resume, &paths()).unwrap();
        let mut rendered: Vec<&str> = a
            .iter()
            .map(|x| x.trim_start_matches("--").split('=').next().unwrap())
            .filter(|k| !matches!(*k, "initial-advertise-peer-urls" | "advertise-client-urls"))
            .collect();
        rendered.sort_unstable();
        let mut pinned = PINNED_ARGS.to_vec();
        pinned.sort_unstable();
        assert_eq!(rendered, pinned);
    }

    #[test]
    fn ipv6_urls_are_bracketed() {
        assert_eq!(
            url("fd00::1".parse().unwrap(), 2380),
            "https://[fd00::1]:2380"
        );
    }
}
