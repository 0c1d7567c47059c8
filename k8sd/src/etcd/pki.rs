//! `etcd.PKIController`: etcd's certificates from `secrets/EtcdSecrets` as files etcd reads,
//! under upstream's names (`ca.crt`, `server.{crt,key}`, `peer.{crt,key}`, `admin.{crt,key}`),
//! rewritten when the secrets change; `PKIStatus` says which version is on disk.
//!
//! Two differences on purpose: upstream also writes `ca.key` (etcd never needs the CA's key: a
//! process that can read it can mint certificates every member trusts), and its files are
//! 0400 owned by etcd's uid; here k8sd writes them 0440 into a directory of etcd's group
//! (setgid: every file takes that group): etcd reads them through its group, and nothing but
//! k8sd can write them.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::etcd::{PkiStatusSpec, ETCD_ID, NAMESPACE};
use machinery::resources::secrets::{
    EtcdCertsSpec, ETCD_ID as SECRETS_ETCD_ID, NAMESPACE as SECRETS,
};

/// `etcd.PKIController`.
pub struct PkiController {
    dir: PathBuf,
}

impl PkiController {
    /// Writes into `dir` (`/system/secrets/etcd`).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }
}

/// The files of `certs`: (name, contents).
pub fn files(certs: &EtcdCertsSpec) -> Vec<(&'static str, &str)> {
    vec![
        ("ca.crt", certs.ca.crt.as_str()),
        ("server.crt", certs.etcd.crt.as_str()),
        ("server.key", certs.etcd.key.as_str()),
        ("peer.crt", certs.etcd_peer.crt.as_str()),
        ("peer.key", certs.etcd_peer.key.as_str()),
        ("admin.crt", certs.etcd_admin.crt.as_str()),
        ("admin.key", certs.etcd_admin.key.as_str()),
    ]
}

/// Writes `contents` to `dir/name` atomically (a temporary file renamed over it), mode 0440;
/// an unchanged file is left alone.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> std::io::Result<bool> {
    write_file_mode(dir, name, contents, 0o440)
}

/// As [`write_file`], with `mode`.
pub fn write_file_mode(dir: &Path, name: &str, contents: &str, mode: u32) -> std::io::Result<bool> {
    let path = dir.join(name);
    if std::fs::read(&path).is_ok_and(|old| old == contents.as_bytes()) {
        return Ok(false);
    }
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    // The mode given to open is masked by the umask: set it exactly.
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    drop(f);
    std::fs::rename(&tmp, &path)?;
    Ok(true)
}

impl Controller for PkiController {
    fn name(&self) -> &'static str {
        "etcd.PKIController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<EtcdCertsSpec>(SECRETS).with_id(SECRETS_ETCD_ID)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<PkiStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(certs) = ctx.get::<EtcdCertsSpec>(SECRETS, SECRETS_ETCD_ID).await? else {
            return Ok(Action::AwaitChange);
        };
        let files = files(&certs.spec);
        if let Some((name, _)) = files.iter().find(|(_, c)| c.is_empty()) {
            return Err(ReconcileError::other(format!(
                "EtcdSecrets version {} has no {name}",
                certs.metadata.version
            )));
        }
        let mut changed = Vec::new();
        for (name, contents) in files {
            match write_file(&self.dir, name, contents) {
                Ok(true) => changed.push(name),
                Ok(false) => {}
                Err(e) => {
                    return Err(ReconcileError::failed(
                        format!("cannot write {}", self.dir.join(name).display()),
                        e,
                    ))
                }
            }
        }
        if !changed.is_empty() {
            tracing::info!(dir = %self.dir.display(), files = ?changed, version = certs.metadata.version, "etcd's certificates written");
        }
        ctx.apply(Resource::new(
            NAMESPACE,
            ETCD_ID,
            PkiStatusSpec {
                ready: true,
                version: certs.metadata.version.to_string(),
            },
        ))
        .await?;
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_replaced_atomically_and_read_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_file(dir.path(), "a.crt", "one").unwrap());
        assert!(
            !write_file(dir.path(), "a.crt", "one").unwrap(),
            "unchanged: not rewritten"
        );
        assert!(write_file(dir.path(), "a.crt", "two").unwrap());
        let p = dir.path().join("a.crt");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o440);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
