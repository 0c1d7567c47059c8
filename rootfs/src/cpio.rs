//! The initramfs archive format the kernel unpacks: "newc" cpio (`070701`), as
//! `Documentation/driver-api/early-userspace/buffer-format.rst` describes it.
//!
//! Reproducible by construction: entries in path order, inode numbers counted from 1, owner
//! 0:0, one mtime for all, no device numbers.

use crate::{Image, Kind};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

fn pad4(out: &mut Vec<u8>) {
    while out.len() & 3 != 0 {
        out.push(0);
    }
}

/// Appends one entry: header, name (NUL-terminated, padded to 4), data (padded to 4).
fn entry(out: &mut Vec<u8>, ino: u32, mode: u32, nlink: u32, mtime: u32, name: &str, data: &[u8]) {
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        mtime,
        u32::try_from(data.len()).unwrap_or(u32::MAX),
        0, // devmajor
        0, // devminor
        0, // rdevmajor
        0, // rdevminor
        u32::try_from(name.len() + 1).unwrap_or(u32::MAX),
        0, // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

/// The image as an uncompressed newc archive: `.` first, then every entry in path order, then
/// the trailer.
pub fn newc(image: &Image, epoch: u64) -> Vec<u8> {
    let mtime = u32::try_from(epoch).unwrap_or(u32::MAX);
    let mut out = Vec::new();
    entry(&mut out, 1, S_IFDIR | 0o755, 2, mtime, ".", &[]);
    let mut ino = 1;
    for (path, kind) in &image.entries {
        ino += 1;
        match kind {
            Kind::Dir { mode } => entry(&mut out, ino, S_IFDIR | mode, 2, mtime, path, &[]),
            Kind::File { mode, data } => entry(&mut out, ino, S_IFREG | mode, 1, mtime, path, data),
            Kind::Symlink { target } => entry(
                &mut out,
                ino,
                S_IFLNK | 0o777,
                1,
                mtime,
                path,
                target.as_bytes(),
            ),
        }
    }
    entry(&mut out, 0, 0, 1, 0, "TRAILER!!!", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_names_and_data_are_aligned_as_the_kernel_expects() {
        let mut image = Image::default();
        image.file("a", 0o644, b"hello".to_vec());
        let out = newc(&image, 7);
        assert_eq!(&out[..6], b"070701");
        // Header 110 bytes + ".\0" padded to 112.
        assert_eq!(&out[110..112], b".\0");
        let second = &out[112..];
        assert_eq!(&second[..6], b"070701");
        // mode of "a": regular file 0644.
        assert_eq!(&second[14..22], b"000081A4");
        // mtime
        assert_eq!(&second[46..54], b"00000007");
        // filesize 5
        assert_eq!(&second[54..62], b"00000005");
        // name "a\0" at 110, padded to 112, data at 112.
        assert_eq!(&second[110..112], b"a\0");
        assert_eq!(&second[112..117], b"hello");
        assert_eq!(out.len() % 4, 0);
        assert!(out.windows(b"TRAILER!!!".len()).any(|w| w == b"TRAILER!!!"));
    }
}
