//! `etcd.ServiceController` (ours: upstream loads machined's etcd service): etcd's
//! `ServiceSpec`, which init runs sandboxed, and `talosctl bootstrap`.
//!
//! etcd is asked for once its spec and its certificates are there, and then:
//! - its data directory holds something: it resumes from it (no initial cluster);
//! - it is empty and this node accepted a bootstrap: a new cluster of this member alone;
//! - it is empty otherwise: it waits (upstream joins the existing members as a learner; the
//!   endpoints to join come from cluster discovery, which this node does not have yet).
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

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::apid::{EtcdBootstrapRequestSpec, NAMESPACE as APID};
use machinery::resources::etcd::{
    EtcdBootstrapAnswerSpec, EtcdBootstrapSpec, EtcdConfigSpec, EtcdSpecSpec, PkiStatusSpec,
    CLIENT_PORT, ETCD_ID, NAMESPACE, PEER_PORT, SERVICE_ID,
};
use machinery::resources::runtime::{ServicePath, ServiceSpecSpec};

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
    let path = |p: &Path, access: &str| ServicePath {
        path: p.display().to_string(),
        access: access.to_string(),
    };
    let mut paths = vec![
        path(&options.binary, "exec"),
        path(&options.data_dir, "read-write"),
        path(&options.pki_dir, "read-only"),
    ];
    paths.extend(options.libs.iter().map(|l| path(l, "exec")));
    ServiceSpecSpec {
        binary: options.binary.display().to_string(),
        args,
        env: std::collections::BTreeMap::new(),
        uid: options.uid,
        gid: options.uid,
        capabilities: Vec::new(),
        paths,
        bind_tcp: vec![CLIENT_PORT, PEER_PORT],
        connect_tcp: vec![CLIENT_PORT, PEER_PORT],
        seccomp_profile: options.seccomp.clone(),
        restart: true,
    }
}

/// `etcd.ServiceController`.
pub struct ServiceController {
    options: EtcdOptions,
    /// The last refusal of the arguments logged.
    refused: Option<String>,
}

impl ServiceController {
    /// etcd as `options` say.
    pub fn new(options: EtcdOptions) -> Self {
        Self {
            options,
            refused: None,
        }
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
            } else if req.spec.recover_etcd {
                (
                    "Unimplemented",
                    "recovering etcd from a snapshot is not supported by talos-rs yet".to_string(),
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
                    },
                ));
                tracing::info!(request = %id, "etcd bootstrap accepted");
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
        let (Some(_), Some(spec), Some(pki)) = (&config, spec, pki) else {
            return Ok(Action::AwaitChange);
        };
        if !pki.spec.ready {
            return Ok(Action::AwaitChange);
        }
        let stored = ctx
            .get::<ServiceSpecSpec>(NAMESPACE, SERVICE_ID)
            .await?
            .map(|s| s.spec);
        let start = if data {
            Start::Resume
        } else if bootstrap.is_some() {
            Start::Bootstrap
        } else {
            return Ok(Action::AwaitChange);
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
                    tracing::error!(error = %why, "etcd's arguments are refused: cluster.etcd.extraArgs overrides a pinned flag; etcd is not started");
                    self.refused = Some(why);
                }
                return Ok(Action::AwaitChange);
            }
        };
        self.refused = None;
        let mut wanted = service_spec(&self.options, args);
        if let Some(stored) = stored {
            // A bootstrapped etcd whose data directory filled keeps its arguments.
            let still_fits = data && render(&Start::Bootstrap).is_ok_and(|b| b == stored.args);
            if still_fits {
                wanted.args = stored.args;
            }
        }
        ctx.apply(Resource::new(NAMESPACE, SERVICE_ID, wanted))
            .await?;
        Ok(Action::AwaitChange)
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
    fn an_empty_or_missing_data_directory_has_no_data() {
        let d = tempfile::tempdir().unwrap();
        assert!(!has_data(d.path()).unwrap());
        assert!(!has_data(&d.path().join("nope")).unwrap());
        std::fs::create_dir(d.path().join("member")).unwrap();
        assert!(has_data(d.path()).unwrap());
    }
}
