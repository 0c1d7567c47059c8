//! The node image is reproducible: two builds from the same inputs give byte-identical trees
//! (paths, types, modes, owners, mtimes, contents, link targets) and initramfs archives.
//! Built from this build's binaries (dynamically linked in a test build, so the shipped
//! libraries are part of what is compared).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Every entry of a tree: relative path → (mode, uid, gid, mtime, contents or link target).
fn walk(root: &Path) -> BTreeMap<String, (u32, u32, u32, i64, Vec<u8>)> {
    fn visit(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, u32, u32, i64, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let m = path.symlink_metadata().unwrap();
            let data = if m.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .unwrap()
                    .to_string_lossy()
                    .as_bytes()
                    .to_vec()
            } else if m.is_file() {
                std::fs::read(&path).unwrap()
            } else {
                Vec::new()
            };
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, (m.mode(), m.uid(), m.gid(), m.mtime(), data));
            if m.is_dir() {
                visit(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    let m = root.symlink_metadata().unwrap();
    out.insert(
        String::new(),
        (m.mode(), m.uid(), m.gid(), m.mtime(), vec![]),
    );
    visit(root, root, &mut out);
    out
}

#[test]
fn two_builds_of_the_image_are_byte_identical() {
    let bin = node_tests::target_dir();
    if rootfs::PROGRAMS.iter().any(|p| !bin.join(p).exists()) {
        panic!("build the programs first: cargo build -p init -p stated -p networkd");
    }
    let epoch = 1_700_000_000;
    let inputs = rootfs::Inputs::new(&bin, epoch);
    let dir = tempfile::tempdir().unwrap();
    let a = rootfs::build(&inputs, &dir.path().join("a")).unwrap();
    let b = rootfs::build(&inputs, &dir.path().join("b")).unwrap();

    let (ta, tb) = (walk(&a.tree), walk(&b.tree));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "the same entries"
    );
    for (path, ea) in &ta {
        let eb = &tb[path];
        assert_eq!(
            (ea.0, ea.1, ea.2, ea.3),
            (eb.0, eb.1, eb.2, eb.3),
            "{path}: mode, owner, mtime"
        );
        assert!(ea.4 == eb.4, "{path}: contents");
        assert_eq!(ea.3, epoch as i64, "{path}: mtime is SOURCE_DATE_EPOCH");
        if node_tests::is_root() {
            assert_eq!((ea.1, ea.2), (0, 0), "{path}: owned by root");
        }
    }
    for must in [
        "usr/bin/init",
        "usr/bin/stated",
        "usr/bin/networkd",
        "etc/talos/daemons.yaml",
        "etc/talos/seccomp/stated.json",
        "etc/resolv.conf",
        "system",
        "var",
        "run",
    ] {
        assert!(ta.contains_key(must), "the image has /{must}");
    }
    assert_eq!(ta["etc/resolv.conf"].4, b"/system/network/etc/resolv.conf");

    let ia = std::fs::read(&a.initramfs).unwrap();
    let ib = std::fs::read(&b.initramfs).unwrap();
    assert!(ia == ib, "the initramfs archives are identical");
    assert_eq!(&ia[..2], &[0x1f, 0x8b], "gzip");
    assert_eq!(a.initramfs_bytes, ia.len() as u64);
}
