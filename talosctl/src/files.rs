//! Files holding keys or credentials (talosconfig, secrets bundles, machine configurations):
//! written with mode 0600 and atomically, a temporary file renamed into place, so that a reader
//! never sees half a file and a failed write leaves the old one.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Writes `data` at `path` with mode 0600, atomically (the directory must exist).
pub fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}
