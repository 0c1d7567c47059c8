//! `etcd.RecoverController` (ours: upstream's machined writes the upload itself): a snapshot
//! uploaded with `EtcdRecover`, which `talosctl bootstrap --recover-from` then restores. apid
//! passes the upload in chunks (`apid/EtcdRecoverChunks`, one at a time); k8sd appends each to
//! `<recovery dir>/<upload>.part` and acknowledges it in `EtcdRecoverAcks`; at the end the
//! file is synced and renamed to [`RECOVER_SNAPSHOT`] (0440 in the setgid directory of etcd's
//! group: the restore, under etcd's uid, reads it). A chunk out of order, an upload larger
//! than [`MAX_RECOVER_BYTES`] or a write that fails ends the upload with an error and removes
//! its part file; so does a k8sd restart mid-upload (the part file is gone with it).

use std::io::Write as _;
use std::path::PathBuf;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::apid::{EtcdRecoverChunkSpec, NAMESPACE as APID};
use machinery::resources::etcd::{
    EtcdRecoverAckSpec, MAX_RECOVER_BYTES, NAMESPACE, RECOVER_SNAPSHOT,
};

/// One upload in progress.
struct Upload {
    id: String,
    file: std::fs::File,
    part: PathBuf,
    ack: EtcdRecoverAckSpec,
}

/// `etcd.RecoverController`.
pub struct RecoverController {
    dir: PathBuf,
    upload: Option<Upload>,
    /// Finished uploads' last acknowledgements, kept while their chunk exists.
    finished: std::collections::BTreeMap<String, EtcdRecoverAckSpec>,
    /// Part files of earlier lives were removed.
    cleaned: bool,
}

impl RecoverController {
    /// Uploads go to `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            upload: None,
            finished: std::collections::BTreeMap::new(),
            cleaned: false,
        }
    }

    /// Takes chunk `c` of upload `id`: the acknowledgement to publish.
    fn take(&mut self, id: &str, c: &EtcdRecoverChunkSpec) -> EtcdRecoverAckSpec {
        if self.upload.as_ref().is_some_and(|u| u.id != id) {
            // A new upload replaces one that was abandoned.
            self.abandon();
        }
        if self.upload.is_none() {
            if c.seq != 1 {
                return failed("the upload did not start at its first chunk (k8sd restarted?)");
            }
            // The ID is apid's choice: it must name a file in the recovery directory.
            let name = match machinery::path_id::file_name(id) {
                Ok(name) => name,
                Err(e) => return failed(&e.to_string()),
            };
            let part = self.dir.join(format!("{name}.part"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&part)
            {
                Ok(file) => {
                    self.upload = Some(Upload {
                        id: id.to_string(),
                        file,
                        part,
                        ack: EtcdRecoverAckSpec::default(),
                    })
                }
                Err(e) => return failed(&format!("cannot create {}: {e}", part.display())),
            }
        }
        let Some(u) = self.upload.as_mut() else {
            return failed("no upload");
        };
        if c.seq <= u.ack.acked {
            return u.ack.clone();
        }
        if c.seq != u.ack.acked + 1 {
            let why = format!("chunk {} came after chunk {}", c.seq, u.ack.acked);
            self.abandon();
            return failed(&why);
        }
        let result = write_chunk(u, c);
        match result {
            Ok(()) => {
                let ack = u.ack.clone();
                if ack.done {
                    self.finished.insert(id.to_string(), ack.clone());
                    self.upload = None;
                }
                ack
            }
            Err(why) => {
                self.abandon();
                failed(&why)
            }
        }
    }

    fn abandon(&mut self) {
        if let Some(u) = self.upload.take() {
            let _ = std::fs::remove_file(&u.part);
        }
    }
}

fn failed(why: &str) -> EtcdRecoverAckSpec {
    EtcdRecoverAckSpec {
        error: why.to_string(),
        ..EtcdRecoverAckSpec::default()
    }
}

fn write_chunk(u: &mut Upload, c: &EtcdRecoverChunkSpec) -> Result<(), String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(c.data.as_bytes())
        .map_err(|e| format!("chunk {}: {e}", c.seq))?;
    if u.ack.size + bytes.len() as u64 > MAX_RECOVER_BYTES {
        return Err(format!(
            "the snapshot is larger than {} GiB",
            MAX_RECOVER_BYTES >> 30
        ));
    }
    u.file
        .write_all(&bytes)
        .map_err(|e| format!("cannot write {}: {e}", u.part.display()))?;
    u.ack.size += bytes.len() as u64;
    u.ack.acked = c.seq;
    if c.eof {
        if u.ack.size == 0 {
            return Err("the snapshot is empty".into());
        }
        u.file
            .sync_all()
            .map_err(|e| format!("cannot sync {}: {e}", u.part.display()))?;
        // Through the descriptor (fchmod: k8sd's seccomp profile has no chmod), exactly (the
        // umask is 077): the restore reads it through etcd's group.
        use std::os::unix::fs::PermissionsExt as _;
        u.file
            .set_permissions(std::fs::Permissions::from_mode(0o440))
            .map_err(|e| format!("cannot make {} read-only: {e}", u.part.display()))?;
        let to = u.part.with_file_name(RECOVER_SNAPSHOT);
        std::fs::rename(&u.part, &to)
            .map_err(|e| format!("cannot rename {}: {e}", u.part.display()))?;
        if let Some(dir) = to.parent() {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        tracing::info!(upload = %u.id, bytes = u.ack.size, path = %to.display(), "etcd snapshot uploaded");
        u.ack.done = true;
    }
    Ok(())
}

impl Controller for RecoverController {
    fn name(&self) -> &'static str {
        "etcd.RecoverController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<EtcdRecoverChunkSpec>(APID)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<EtcdRecoverAckSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        if !self.cleaned {
            // Part files of an earlier k8sd: their uploads cannot go on.
            if let Ok(entries) = std::fs::read_dir(&self.dir) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().ends_with(".part") {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
            self.cleaned = true;
        }
        let chunks = ctx.list::<EtcdRecoverChunkSpec>(APID).await?;
        let mut acks = Vec::new();
        for c in &chunks {
            let id = c.id().to_string();
            let ack = match self.finished.get(&id) {
                Some(a) => a.clone(),
                None => self.take(&id, &c.spec),
            };
            if !ack.error.is_empty() {
                tracing::warn!(upload = %id, error = %ack.error, "etcd snapshot upload failed");
                self.finished.insert(id.clone(), ack.clone());
            }
            acks.push(Resource::new(NAMESPACE, id, ack));
        }
        // Uploads whose chunk is gone: finished, or abandoned by apid.
        self.finished
            .retain(|id, _| chunks.iter().any(|c| c.id() == id));
        if self
            .upload
            .as_ref()
            .is_some_and(|u| !chunks.iter().any(|c| c.id() == u.id))
        {
            self.abandon();
        }
        ctx.apply_all(acks).await?;
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn chunk(seq: u64, data: &[u8], eof: bool) -> EtcdRecoverChunkSpec {
        EtcdRecoverChunkSpec {
            seq,
            data: base64::engine::general_purpose::STANDARD.encode(data),
            eof,
        }
    }

    #[test]
    fn chunks_in_order_make_the_snapshot_and_out_of_order_ends_the_upload() {
        let d = tempfile::tempdir().unwrap();
        let mut c = RecoverController::new(d.path().to_path_buf());
        assert_eq!(c.take("u1", &chunk(1, b"ab", false)).acked, 1);
        // The same chunk again (apid polled before it saw the ack): acknowledged, not written.
        assert_eq!(c.take("u1", &chunk(1, b"ab", false)).acked, 1);
        let done = c.take("u1", &chunk(2, b"cd", true));
        assert!(done.done && done.error.is_empty(), "{done:?}");
        assert_eq!(done.size, 4);
        let snap = d.path().join(RECOVER_SNAPSHOT);
        assert_eq!(std::fs::read(&snap).unwrap(), b"abcd");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&snap).unwrap().permissions().mode() & 0o777,
            0o440
        );

        let gap = {
            c.take("u2", &chunk(1, b"x", false));
            c.take("u2", &chunk(3, b"y", false))
        };
        assert!(gap.error.contains("came after"), "{gap:?}");
        assert!(!d.path().join("u2.part").exists());
        let late = c.take("u3", &chunk(2, b"z", false));
        assert!(late.error.contains("first chunk"), "{late:?}");
        let empty = c.take("u4", &chunk(1, b"", true));
        assert!(empty.error.contains("empty"), "{empty:?}");
    }

    #[test]
    fn an_upload_whose_id_leaves_the_directory_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("recover");
        std::fs::create_dir(&dir).unwrap();
        let mut c = RecoverController::new(dir.clone());
        for id in ["../escape", "..", ".hidden", "a/b"] {
            let ack = c.take(id, &chunk(1, b"data", true));
            assert!(ack.error.contains("cannot name a file"), "{id}: {ack:?}");
        }
        assert!(!d.path().join("escape.part").exists());
        assert!(!d.path().join(RECOVER_SNAPSHOT).exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // A plain ID beside them is taken.
        assert!(c.take("upload-1", &chunk(1, b"data", true)).done);
    }
}
