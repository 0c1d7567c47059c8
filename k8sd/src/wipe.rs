//! What k8sd's program does as a one-shot service under etcd's uid, on files that are etcd's
//! (0700: k8sd itself cannot touch them):
//! - `k8sd --wipe-contents DIR` (`etcd-wipe`, after a leave): removes every entry of etcd's
//!   data directory and keeps the directory (k8sd's, the mount point on a VM). Symbolic links
//!   are removed, never followed; landlock confines the process to the directory anyway.
//! - `k8sd --adopt-restored DIR` (`etcd-restore-adopt`, after `etcdctl snapshot restore` into
//!   `DIR`, which etcd 3.4 insists on creating itself): moves `DIR/member` up into the data
//!   directory and removes `DIR`.

use std::path::Path;

/// Removes every entry of `dir`; the number removed.
///
/// # Errors
///
/// The first entry that cannot be removed.
pub fn contents(dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
        n += 1;
    }
    Ok(n)
}

/// Moves `staging/member` to `staging/../member` and removes `staging`; done already (a
/// member there, none in `staging`) is fine.
///
/// # Errors
///
/// Nothing was restored, the data directory has a member of its own, or the move fails.
pub fn adopt_restored(staging: &Path) -> std::io::Result<()> {
    let parent = staging
        .parent()
        .ok_or_else(|| std::io::Error::other("the restore directory has no parent"))?;
    let (from, to) = (staging.join("member"), parent.join("member"));
    if from.exists() {
        if to.exists() {
            return Err(std::io::Error::other(format!(
                "{} exists already: not replaced",
                to.display()
            )));
        }
        std::fs::rename(&from, &to)?;
    } else if !to.exists() {
        return Err(std::io::Error::other(format!(
            "nothing was restored into {}",
            staging.display()
        )));
    }
    std::fs::remove_dir_all(staging)?;
    std::fs::File::open(parent)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_inside_goes_and_links_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let data = d.path().join("etcd");
        std::fs::create_dir_all(data.join("member/snap")).unwrap();
        std::fs::write(data.join("member/snap/db"), b"db").unwrap();
        std::fs::write(data.join("file"), b"f").unwrap();
        std::os::unix::fs::symlink(outside.path(), data.join("link")).unwrap();
        assert_eq!(contents(&data).unwrap(), 3);
        assert!(data.is_dir());
        assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
        assert!(outside.path().join("keep").exists());
    }

    #[test]
    fn the_restored_member_moves_up_once() {
        let d = tempfile::tempdir().unwrap();
        let staging = d.path().join(".restore");
        std::fs::create_dir_all(staging.join("member/snap")).unwrap();
        std::fs::write(staging.join("member/snap/db"), b"db").unwrap();
        adopt_restored(&staging).unwrap();
        assert_eq!(
            std::fs::read(d.path().join("member/snap/db")).unwrap(),
            b"db"
        );
        assert!(!staging.exists());
        // Again after a crash between the move and the removal: fine.
        std::fs::create_dir(&staging).unwrap();
        adopt_restored(&staging).unwrap();
        // Nothing restored and no member: an error.
        let e = tempfile::tempdir().unwrap();
        std::fs::create_dir(e.path().join(".restore")).unwrap();
        assert!(adopt_restored(&e.path().join(".restore")).is_err());
    }
}
