//! `etcd.ServiceController` (ours: upstream loads machined's etcd service): etcd's
//! `ServiceSpec`, which init runs sandboxed, and `talosctl bootstrap`.
//!
//! etcd is asked for once its spec and its certificates are there, and then:
//! - its data directory holds something: it resumes from it (no initial cluster);
//! - it is empty and this node accepted a bootstrap: a new cluster of this member alone;
//! - it is empty otherwise: it joins the existing members as a learner ([`super::join`]),
//!   through the control plane endpoint's host, and waits while none answers.
//!
//! Once asked, its arguments stay as they are while they still fit (a bootstrapped etcd whose
//! data directory filled up keeps `--initial-cluster-state=new`, which etcd ignores then): a
//! change of arguments restarts it.
//!
//! A bootstrap request (`apid/EtcdBootstrapRequests`) is answered under its ID in
//! `EtcdBootstrapAnswers`: refused with `AlreadyExists` when the data directory is not empty
//! or a bootstrap was accepted already, `FailedPrecondition` when this node runs no etcd;
//! else accepted, recorded in `EtcdBootstraps` (kept while the data directory is empty, so a
//! restarted k8sd still bootstraps).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::config::Config;
use machinery::resources::apid::{EtcdBootstrapRequestSpec, NAMESPACE as APID};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE};
use machinery::resources::etcd::{
    EtcdBootstrapAnswerSpec, EtcdBootstrapSpec, EtcdConfigSpec, EtcdLeaveSpec, EtcdSpecSpec,
    PkiStatusSpec, ADOPT_SERVICE_ID, CLIENT_PORT, ETCD_ID, NAMESPACE, PEER_PORT, RECOVER_SNAPSHOT,
    RESTORE_DIR, RESTORE_SERVICE_ID, SERVICE_ID, WIPE_SERVICE_ID,
};
use machinery::resources::runtime::{
    ServicePath, ServiceSpecSpec, ServiceState, ServiceStatusSpec, NAMESPACE as RUNTIME,
};
use machinery::resources::secrets::{
    EtcdCertsSpec, ETCD_ID as SECRETS_ETCD_ID, NAMESPACE as SECRETS,
};

use super::args::{self, Paths, Start};

/// How etcd runs.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// The etcd program.
    pub binary: PathBuf,
    /// Its data directory (`/var/lib/etcd`).
    pub data_dir: PathBuf,
    /// Its certificates (`/system/secrets/etcd`).
    pub pki_dir: PathBuf,
    /// The uid and gid it runs as (within k8sd's envelope).
    pub uid: u32,
    /// Directories of its shared libraries (exec).
    pub libs: Vec<PathBuf>,
    /// The seccomp profile.
    pub seccomp: String,
    /// k8sd's own program: the one-shot `etcd-wipe` service runs it with `--wipe-contents`,
    /// `etcd-restore-adopt` with `--adopt-restored`.
    pub wipe_binary: PathBuf,
    /// etcdctl: the one-shot `etcd-restore` runs its `snapshot restore`.
    pub etcdctl: PathBuf,
    /// Where an uploaded snapshot is kept (`/var/lib/etcd-recover`).
    pub recover_dir: PathBuf,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            binary: "/usr/bin/etcd".into(),
            data_dir: "/var/lib/etcd".into(),
            pki_dir: "/system/secrets/etcd".into(),
            uid: 1_990_001_600,
            libs: vec!["/usr/lib".into(), "/lib64".into()],
            seccomp: "etcd".into(),
            wipe_binary: "/usr/bin/k8sd".into(),
            etcdctl: "/usr/bin/etcdctl".into(),
            recover_dir: "/var/lib/etcd-recover".into(),
        }
    }
}

/// Whether etcd's data directory holds anything (it is unreadable: an error).
pub fn has_data(dir: &Path) -> std::io::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The service spec of etcd with these arguments.
pub fn service_spec(options: &EtcdOptions, args: Vec<String>) -> ServiceSpecSpec {
    ServiceSpecSpec {
        bind_tcp: vec![CLIENT_PORT, PEER_PORT],
        connect_tcp: vec![CLIENT_PORT, PEER_PORT],
        restart: true,
        ..one_shot(
            options,
            &options.binary,
            args,
            &[
                (&options.data_dir, "read-write"),
                (&options.pki_dir, "read-only"),
            ],
            &options.seccomp,
        )
    }
}

/// The one-shot service that removes etcd's data after a leave: k8sd's program with
/// `--wipe-contents`, under etcd's uid (its files are etcd's 0700), landlock on the data
/// directory only, no network, seccomp `wipe`.
pub fn wipe_spec(options: &EtcdOptions) -> ServiceSpecSpec {
    one_shot(
        options,
        &options.wipe_binary,
        vec![
            "--wipe-contents".to_string(),
            options.data_dir.display().to_string(),
        ],
        &[(&options.data_dir, "read-write")],
        "wipe",
    )
}

/// A one-shot service of `binary` under etcd's uid, no network, no capability, with these
/// landlock rules (plus the binary and the shared libraries). etcd itself is this with its
/// ports and restarts ([`service_spec`]).
fn one_shot(
    options: &EtcdOptions,
    binary: &Path,
    args: Vec<String>,
    paths: &[(&Path, &str)],
    seccomp: &str,
) -> ServiceSpecSpec {
    let path = |p: &Path, access: &str| ServicePath {
        path: p.display().to_string(),
        access: access.to_string(),
    };
    let mut all = vec![path(binary, "exec")];
    all.extend(paths.iter().map(|(p, a)| path(p, a)));
    all.extend(options.libs.iter().map(|l| path(l, "exec")));
    ServiceSpecSpec {
        binary: binary.display().to_string(),
        args,
        env: std::collections::BTreeMap::new(),
        uid: options.uid,
        gid: options.uid,
        capabilities: Vec::new(),
        paths: all,
        bind_tcp: Vec::new(),
        connect_tcp: Vec::new(),
        seccomp_profile: seccomp.to_string(),
        restart: false,
    }
}

/// `etcd-restore`: `etcdctl snapshot restore` of the uploaded snapshot into `.restore` as a
/// one-member cluster of this node (upstream's `Restore{Name, PeerURLs, InitialCluster}`),
/// etcd's uid, seccomp `etcdctl`; it reads the snapshot and writes only the data directory.
pub fn restore_spec(
    options: &EtcdOptions,
    name: &str,
    peer: &str,
    skip_hash_check: bool,
) -> ServiceSpecSpec {
    let mut args = vec![
        "snapshot".to_string(),
        "restore".to_string(),
        options
            .recover_dir
            .join(RECOVER_SNAPSHOT)
            .display()
            .to_string(),
        format!("--name={name}"),
        format!("--initial-cluster={name}={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!(
            "--data-dir={}",
            options.data_dir.join(RESTORE_DIR).display()
        ),
    ];
    if skip_hash_check {
        args.push("--skip-hash-check".to_string());
    }
    let mut spec = one_shot(
        options,
        &options.etcdctl,
        args,
        &[
            (&options.data_dir, "read-write"),
            (&options.recover_dir, "read-only"),
        ],
        "etcdctl",
    );
    // etcdctl 2/3 is chosen by this variable in 3.4.
    spec.env.insert("ETCDCTL_API".to_string(), "3".to_string());
    spec
}

/// `etcd-restore-adopt`: k8sd's program with `--adopt-restored`, under etcd's uid (the restored
/// files are etcd's 0700), moves `.restore/member` into the data directory.
pub fn adopt_spec(options: &EtcdOptions) -> ServiceSpecSpec {
    one_shot(
        options,
        &options.wipe_binary,
        vec![
            "--adopt-restored".to_string(),
            options.data_dir.join(RESTORE_DIR).display().to_string(),
        ],
        &[(&options.data_dir, "read-write")],
        "wipe",
    )
}

/// How often a join is tried while no member answers (upstream: every 3 s).
pub const JOIN_RETRY: Duration = Duration::from_secs(3);
/// How often a failing join is logged.
const JOIN_LOG: Duration = Duration::from_secs(30);

/// The value of `--flag=` among `args`.
pub fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let prefix = format!("--{flag}=");
    args.iter().find_map(|a| a.strip_prefix(prefix.as_str()))
}

/// The client endpoints (`https://host:2379`) of the other members named in an
/// `--initial-cluster` value (`name=https://host:2380,...`), `own` name excluded.
pub fn member_endpoints(initial_cluster: &str, own: &str) -> Vec<String> {
    let mut out: Vec<String> = initial_cluster
        .split(',')
        .filter_map(|e| e.split_once('='))
        .filter(|(n, _)| *n != own)
        .filter_map(|(_, url)| super::join::client_endpoint(url))
        .collect();
    out.dedup();
    out
}

/// `etcd.ServiceController`.
pub struct ServiceController {
    options: EtcdOptions,
    /// The last refusal of the arguments logged.
    refused: Option<String>,
    /// The last join attempt and when a failure was last logged.
    joined_at: Option<Instant>,
    join_logged: Option<Instant>,
}

impl ServiceController {
    /// etcd as `options` say.
    pub fn new(options: EtcdOptions) -> Self {
        Self {
            options,
            refused: None,
            joined_at: None,
            join_logged: None,
        }
    }

    /// The members to join through: the control plane endpoint's host, unless it is this node.
    fn join_endpoints(config: Option<&str>, own: &[std::net::IpAddr]) -> Vec<String> {
        let Some(text) = config else {
            return Vec::new();
        };
        let Ok(config) = Config::from_yaml(text) else {
            return Vec::new();
        };
        let Some(url) = config
            .cluster()
            .and_then(|c| c.control_plane.as_ref())
            .and_then(|cp| cp.endpoint.clone())
        else {
            return Vec::new();
        };
        super::join::client_endpoint(&url)
            .filter(|ep| {
                !own.iter()
                    .any(|ip| *ep == super::args::url(*ip, CLIENT_PORT))
            })
            .into_iter()
            .collect()
    }
}

impl Controller for ServiceController {
    fn name(&self) -> &'static str {
        "etcd.ServiceController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<EtcdConfigSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<EtcdSpecSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<PkiStatusSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<EtcdBootstrapRequestSpec>(APID),
            Input::weak::<MachineConfigSpec>(REDACTED_NAMESPACE).with_id(ACTIVE_ID),
            Input::weak::<EtcdCertsSpec>(SECRETS).with_id(SECRETS_ETCD_ID),
            Input::weak::<EtcdLeaveSpec>(NAMESPACE).with_id(ETCD_ID),
            Input::weak::<ServiceStatusSpec>(RUNTIME).with_id(SERVICE_ID),
            Input::weak::<ServiceStatusSpec>(RUNTIME).with_id(RESTORE_SERVICE_ID),
            Input::weak::<ServiceStatusSpec>(RUNTIME).with_id(ADOPT_SERVICE_ID),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<ServiceSpecSpec>().in_namespace(NAMESPACE),
            Output::exclusive::<EtcdBootstrapSpec>(),
            Output::exclusive::<EtcdBootstrapAnswerSpec>(),
        ]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let config = ctx.get::<EtcdConfigSpec>(NAMESPACE, ETCD_ID).await?;
        let data = has_data(&self.options.data_dir).map_err(|e| {
            ReconcileError::failed(
                format!("cannot read {}", self.options.data_dir.display()),
                e,
            )
        })?;

        let left = ctx.get::<EtcdLeaveSpec>(NAMESPACE, ETCD_ID).await?;
        // Bootstrap: the accepted one, then every request's answer.
        let mut bootstrap = ctx
            .get::<EtcdBootstrapSpec>(NAMESPACE, ETCD_ID)
            .await?
            .filter(|_| config.is_some());
        let requests = ctx.list::<EtcdBootstrapRequestSpec>(APID).await?;
        let answered = ctx.list::<EtcdBootstrapAnswerSpec>(NAMESPACE).await?;
        let mut answers = Vec::new();
        for req in &requests {
            let id = req.id();
            if let Some(a) = answered.iter().find(|a| a.id() == id) {
                answers.push(a.clone());
                continue;
            }
            let (code, message) = if config.is_none() {
                (
                    "FailedPrecondition",
                    "this node runs no etcd: bootstrap a control plane node (one whose configuration has cluster.etcd.ca)".to_string(),
                )
            } else if left.is_some() {
                (
                    "FailedPrecondition",
                    "this node left the etcd cluster: etcd stays stopped until the node restarts"
                        .to_string(),
                )
            } else if req.spec.recover_etcd
                && !self.options.recover_dir.join(RECOVER_SNAPSHOT).exists()
            {
                (
                    "FailedPrecondition",
                    "no etcd snapshot was uploaded to this node: `talosctl bootstrap --recover-from FILE` uploads one (EtcdRecover) first".to_string(),
                )
            } else if data {
                (
                    "AlreadyExists",
                    format!(
                        "etcd data directory {} is not empty: this node is bootstrapped or a member already",
                        self.options.data_dir.display()
                    ),
                )
            } else if bootstrap.is_some() {
                (
                    "AlreadyExists",
                    "this node accepted a bootstrap already; etcd is starting".to_string(),
                )
            } else {
                bootstrap = Some(Resource::new(
                    NAMESPACE,
                    ETCD_ID,
                    EtcdBootstrapSpec {
                        request: id.to_string(),
                        recover: req.spec.recover_etcd,
                        skip_hash_check: req.spec.recover_skip_hash_check,
                    },
                ));
                tracing::info!(request = %id, recover = req.spec.recover_etcd, "etcd bootstrap accepted");
                (
                    "",
                    "etcd will start as a new cluster of this member".to_string(),
                )
            };
            if !code.is_empty() {
                tracing::warn!(request = %id, code, %message, "etcd bootstrap refused");
            }
            answers.push(Resource::new(
                NAMESPACE,
                id,
                EtcdBootstrapAnswerSpec {
                    code: code.to_string(),
                    message,
                },
            ));
        }
        if let Some(b) = bootstrap.clone() {
            ctx.apply(b).await?;
        }
        ctx.apply_all(answers).await?;

        // The service.
        let spec = ctx.get::<EtcdSpecSpec>(NAMESPACE, ETCD_ID).await?;
        let pki = ctx.get::<PkiStatusSpec>(NAMESPACE, ETCD_ID).await?;
        if config.is_none() {
            // Not a control plane (any more): no etcd.
            return Ok(Action::AwaitChange);
        }
        if left.is_some() {
            // Left the cluster: etcd stopped (its spec is not asserted), then its data removed
            // by the one-shot wipe once it is down; a failed wipe stays, for its status.
            let running = ctx
                .get::<ServiceStatusSpec>(RUNTIME, SERVICE_ID)
                .await?
                .is_some();
            if data && !running {
                ctx.apply(Resource::new(
                    NAMESPACE,
                    WIPE_SERVICE_ID,
                    wipe_spec(&self.options),
                ))
                .await?;
            }
            return Ok(Action::AwaitChange);
        }
        let (Some(spec), Some(_)) = (spec, pki.filter(|p| p.spec.ready)) else {
            // Inputs not ready (an address change, certificates being rewritten): a running
            // etcd keeps running as it is (upstream's SkipReconcile).
            super::keep::<ServiceSpecSpec>(ctx, NAMESPACE, SERVICE_ID).await?;
            return Ok(Action::AwaitChange);
        };
        if let Some(b) = bootstrap.as_ref().filter(|b| b.spec.recover) {
            if !self.restored(ctx, &spec.spec, &b.spec).await? {
                return Ok(Action::AwaitChange);
            }
        }
        let stored = ctx
            .get::<ServiceSpecSpec>(NAMESPACE, SERVICE_ID)
            .await?
            .map(|s| s.spec);
        let stored_join = stored
            .as_ref()
            .filter(|s| arg_value(&s.args, "initial-cluster-state") == Some("existing"))
            .and_then(|s| arg_value(&s.args, "initial-cluster"))
            .map(str::to_string);
        let start = if data {
            Start::Resume
        } else if bootstrap.is_some() {
            Start::Bootstrap
        } else if let Some(initial_cluster) = stored_join.clone() {
            // Added as a learner already: etcd is joining with these arguments.
            Start::Join { initial_cluster }
        } else {
            match self.join(ctx, &spec.spec).await? {
                Some(initial_cluster) => Start::Join { initial_cluster },
                None => return Ok(Action::RequeueAfter(JOIN_RETRY)),
            }
        };
        let (data_dir, pki_dir) = (self.options.data_dir.clone(), self.options.pki_dir.clone());
        let paths = Paths {
            data_dir: &data_dir,
            pki_dir: &pki_dir,
        };
        let render = |start: &Start| args::render(&spec.spec, start, &paths);
        let args = match render(&start) {
            Ok(a) => a,
            Err(e) => {
                let why = e.to_string();
                if self.refused.as_deref() != Some(why.as_str()) {
                    tracing::error!(error = %why, "etcd's arguments are refused: cluster.etcd.extraArgs overrides a pinned flag; etcd keeps its arguments (or is not started)");
                    self.refused = Some(why);
                }
                super::keep::<ServiceSpecSpec>(ctx, NAMESPACE, SERVICE_ID).await?;
                return Ok(Action::AwaitChange);
            }
        };
        self.refused = None;
        let mut wanted = service_spec(&self.options, args);
        if let Some(stored) = stored {
            // A bootstrapped or joined etcd whose data directory filled keeps its arguments.
            let joined = stored_join.map(|initial_cluster| Start::Join { initial_cluster });
            let still_fits = data
                && (render(&Start::Bootstrap).is_ok_and(|b| b == stored.args)
                    || joined.is_some_and(|j| render(&j).is_ok_and(|b| b == stored.args)));
            if still_fits {
                wanted.args = stored.args;
            }
        }
        ctx.apply(Resource::new(NAMESPACE, SERVICE_ID, wanted))
            .await?;
        Ok(Action::AwaitChange)
    }
}

impl ServiceController {
    /// A recovery: the uploaded snapshot restored into `.restore` by `etcd-restore`
    /// (etcdctl, etcd's uid), its member moved into the data directory by
    /// `etcd-restore-adopt`, one after the other (a failed one stays, for its status and log);
    /// `true` once the data directory holds the restored member (the snapshot is then removed
    /// and etcd resumes from it as a one-member cluster).
    async fn restored(
        &self,
        ctx: &mut Context,
        spec: &EtcdSpecSpec,
        bootstrap: &EtcdBootstrapSpec,
    ) -> Result<bool, ReconcileError> {
        let o = &self.options;
        let staging = o.data_dir.join(RESTORE_DIR);
        let member = o.data_dir.join("member").exists();
        if member && !staging.exists() {
            let snapshot = o.recover_dir.join(RECOVER_SNAPSHOT);
            if snapshot.exists() {
                match std::fs::remove_file(&snapshot) {
                    Ok(()) => {
                        tracing::info!("etcd snapshot restored; the uploaded file is removed")
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot remove the restored snapshot"),
                }
            }
            return Ok(true);
        }
        let state = |s: Option<Resource<ServiceStatusSpec>>| s.map(|s| s.spec.state);
        let restore = state(
            ctx.get::<ServiceStatusSpec>(RUNTIME, RESTORE_SERVICE_ID)
                .await?,
        );
        let Some(peer) = spec.advertised_addresses.first() else {
            return Ok(false);
        };
        let peer = super::args::url(*peer, PEER_PORT);
        let restore_spec = restore_spec(o, &spec.name, &peer, bootstrap.skip_hash_check);
        ctx.apply(Resource::new(NAMESPACE, RESTORE_SERVICE_ID, restore_spec))
            .await?;
        if staging.exists() && restore == Some(ServiceState::Finished) {
            ctx.apply(Resource::new(NAMESPACE, ADOPT_SERVICE_ID, adopt_spec(o)))
                .await?;
        }
        Ok(false)
    }

    /// One attempt to join (at most every [`JOIN_RETRY`]): `Some(--initial-cluster)` once this
    /// node was added as a learner.
    async fn join(
        &mut self,
        ctx: &Context,
        spec: &EtcdSpecSpec,
    ) -> Result<Option<String>, ReconcileError> {
        if self.joined_at.is_some_and(|t| t.elapsed() < JOIN_RETRY) {
            return Ok(None);
        }
        self.joined_at = Some(Instant::now());
        let config = ctx
            .get::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
            .await?
            .map(|c| c.spec.0);
        let endpoints = Self::join_endpoints(config.as_deref(), &spec.advertised_addresses);
        let Some(certs) = ctx.get::<EtcdCertsSpec>(SECRETS, SECRETS_ETCD_ID).await? else {
            return Ok(None);
        };
        // A name (`https://k8s.example.com:6443`) joins through the addresses it resolves to.
        let why = match super::join::resolve(&endpoints, &spec.advertised_addresses).await {
            Err(why) => why,
            Ok(endpoints) if endpoints.is_empty() => {
                "no other control plane to join through (this node is the control plane endpoint)"
                    .to_string()
            }
            Ok(endpoints) => {
                let peers: Vec<String> = spec
                    .advertised_addresses
                    .iter()
                    .map(|ip| super::args::url(*ip, PEER_PORT))
                    .collect();
                match super::join::add_learner(&certs.spec, &endpoints, &spec.name, &peers).await {
                    Ok((id, initial_cluster)) => {
                        tracing::info!(member = %format!("{id:016x}"), %initial_cluster, "added to the etcd cluster as a learner");
                        self.join_logged = None;
                        return Ok(Some(initial_cluster));
                    }
                    Err(e) => e,
                }
            }
        };
        if self.join_logged.is_none_or(|t| t.elapsed() >= JOIN_LOG) {
            self.join_logged = Some(Instant::now());
            let ips: Vec<String> = spec
                .advertised_addresses
                .iter()
                .map(ToString::to_string)
                .collect();
            tracing::warn!(reason = %why, "etcd is waiting to join the cluster, if this node is the first node in the cluster, please run `talosctl bootstrap` against one of the following IPs: [{}]", ips.join(" "));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_is_sandboxed_to_its_files_and_ports() {
        let s = service_spec(&EtcdOptions::default(), vec!["--name=a".into()]);
        assert!(s.capabilities.is_empty());
        assert_eq!(s.bind_tcp, vec![2379, 2380]);
        let rw: Vec<_> = s
            .paths
            .iter()
            .filter(|p| p.access == "read-write")
            .collect();
        assert_eq!(rw.len(), 1);
        assert_eq!(rw[0].path, "/var/lib/etcd");
        assert_eq!(s.seccomp_profile, "etcd");
    }

    #[test]
    fn the_other_members_are_reached_on_their_client_port() {
        let ic = "cp-1=https://10.5.0.2:2380,cp-2=https://10.5.0.3:2380";
        assert_eq!(member_endpoints(ic, "cp-2"), vec!["https://10.5.0.2:2379"]);
        let args = vec![
            "--initial-cluster-state=existing".to_string(),
            format!("--initial-cluster={ic}"),
        ];
        assert_eq!(arg_value(&args, "initial-cluster"), Some(ic));
        assert_eq!(arg_value(&args, "initial-cluster-state"), Some("existing"));
    }

    #[test]
    fn a_node_never_joins_through_itself() {
        let config = "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  controlPlane:\n    endpoint: https://10.5.0.2:6443\n";
        let own: Vec<std::net::IpAddr> = vec!["10.5.0.2".parse().unwrap()];
        assert!(ServiceController::join_endpoints(Some(config), &own).is_empty());
        let other: Vec<std::net::IpAddr> = vec!["10.5.0.3".parse().unwrap()];
        assert_eq!(
            ServiceController::join_endpoints(Some(config), &other),
            vec!["https://10.5.0.2:2379"]
        );
    }

    #[test]
    fn an_empty_or_missing_data_directory_has_no_data() {
        let d = tempfile::tempdir().unwrap();
        assert!(!has_data(d.path()).unwrap());
        assert!(!has_data(&d.path().join("nope")).unwrap());
        std::fs::create_dir(d.path().join("member")).unwrap();
        assert!(has_data(d.path()).unwrap());
    }
}
