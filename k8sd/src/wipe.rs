//! `k8sd --wipe-contents DIR`: what the one-shot `etcd-wipe` service runs after a leave, under
//! etcd's uid, to remove etcd's data (its files are etcd's, 0700: k8sd cannot delete them). It
//! removes every entry of the directory and keeps the directory (k8sd's, the mount point on a
//! VM). Symbolic links are removed, never followed; landlock confines the process to the
//! directory anyway.

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
}
