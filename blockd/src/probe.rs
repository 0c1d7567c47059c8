//! What a disk or a partition holds: its partition table (GPT, through the `gpt` crate) and the
//! filesystem superblocks of the types upstream names (`xfs`, `ext4`, `vfat`, `swap`), what
//! volumes are located by. A device on which none of these is found is blank only if its first
//! and last MiB are zeros ([`Found::in_use`]); before a disk is written, blkid itself (a
//! service init runs for blockd, [`crate::blkid`]) must find nothing on it either: what this
//! probe does not know (an MBR, LVM, LUKS, btrfs, ZFS, RAID…) is never taken for blank.
//!
//! The superblocks are read here: no kept Rust crate probes filesystems without linking
//! libblkid (C, which would parse what a disk holds inside blockd, with its capability: it runs
//! as a sandboxed service instead), and each is a magic number and a few fields at fixed
//! offsets. Everything is
//! read from one descriptor of the whole disk (a partition at its offset), under a shared
//! `flock` as udev and blkid take it (a writer holding the exclusive lock, mkfs or a
//! partitioner, is never read half-way: the probe reports [`ProbeError::Busy`] and is retried).

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

/// Errors of probing.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The device cannot be opened or read.
    #[error("cannot read {path}")]
    Read {
        /// The device.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Another program holds the device's exclusive lock (it is writing it).
    #[error("{0} is locked by a writer")]
    Busy(String),
    /// A GPT header this probe does not read (and the disk is therefore not taken for blank).
    #[error("{path}: {reason}")]
    Unsupported {
        /// The device.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The most partition entries a GPT may declare here (the specification's minimum array is
/// 128; partitioners write 128). A header may declare up to 2^32: the gpt crate would then read
/// (and buffer) the whole declared array, so a hostile disk could exhaust blockd's memory.
pub const MAX_GPT_ENTRIES: u64 = 1024;

/// What was found on a device (or a partition).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// `xfs`, `ext4`, `vfat`, `swap`, `gpt`, or empty.
    pub name: String,
    /// UUID (a filesystem's; a GPT disk's GUID), as blkid prints it.
    pub uuid: String,
    /// Label.
    pub label: String,
    /// Block size.
    pub block_size: u64,
    /// The filesystem's own unit (xfs: its sector size).
    pub filesystem_block_size: u64,
    /// The size the filesystem says it has.
    pub probed_size: u64,
    /// A GPT's partitions.
    pub partitions: Vec<Partition>,
    /// An xfs superblock mkfs.xfs had not finished (`sb_inprogress`: mkfs was stopped half-way):
    /// no usable filesystem, reported as blank by discovery.
    pub incomplete: bool,
    /// A whole device on which nothing known was found, but whose first or last MiB holds a
    /// byte that is not zero: something is there (an MBR, LVM, LUKS, RAID, a filesystem this
    /// probe does not read): it is in use, never blank.
    pub in_use: bool,
}

/// How much of a device's start and of its end must be zeros for it to be blank.
pub const BLANK_EDGE: u64 = 1024 * 1024;

/// What a device that is [`Found::in_use`] holds, as said to people.
pub const IN_USE: &str = "data in its first or last MiB";

/// Whether a byte of the first or the last [`BLANK_EDGE`] of `file` (of `size` bytes) is not
/// zero.
pub(crate) fn edges_hold_data(file: &mut std::fs::File, size: u64) -> std::io::Result<bool> {
    let mut buf = vec![0u8; 64 * 1024];
    let head = BLANK_EDGE.min(size);
    let tail_from = size.saturating_sub(BLANK_EDGE).max(head);
    for (from, to) in [(0, head), (tail_from, size)] {
        file.seek(SeekFrom::Start(from))?;
        let mut at = from;
        while at < to {
            let want = usize::try_from((to - at).min(buf.len() as u64)).unwrap_or(buf.len());
            let n = match file.read(&mut buf[..want]) {
                Ok(0) => return Ok(false),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf[..n].iter().any(|&b| b != 0) {
                return Ok(true);
            }
            at += n as u64;
        }
    }
    Ok(false)
}

/// A partition of a GPT.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    /// Its number (from 1).
    pub index: u64,
    /// Its GUID, uppercase.
    pub uuid: String,
    /// Its type GUID, uppercase.
    pub type_uuid: String,
    /// Its name.
    pub label: String,
    /// Byte offset on the disk.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// What it holds.
    pub found: Found,
}

/// How much of a device's start the superblock probes read.
const HEAD: usize = 64 * 1024 + 4096;

fn be16(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_be_bytes([b[at], b[at + 1]]))
}
fn be32(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
fn le16(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([b[at], b[at + 1]]))
}
fn le32(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
}

/// A UUID as blkid prints it (lowercase, dashed).
fn uuid(b: &[u8]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A fixed-size, NUL- or space-padded label.
fn label(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

/// The filesystem whose superblock starts `head` (the first bytes of a device or partition),
/// if one of the known ones.
pub fn superblock(head: &[u8]) -> Option<Found> {
    if head.len() < HEAD {
        return None;
    }
    // xfs: "XFSB" at 0 (big-endian fields).
    if &head[0..4] == b"XFSB" {
        let block = be32(head, 4);
        return Some(Found {
            name: "xfs".into(),
            uuid: uuid(&head[32..48]),
            label: label(&head[108..120]),
            block_size: block,
            filesystem_block_size: be16(head, 102),
            probed_size: be64(head, 8).saturating_mul(block),
            // sb_inprogress: set by mkfs.xfs first, cleared when it is done.
            incomplete: head[126] != 0,
            ..Default::default()
        });
    }
    // ext2/3/4: 0xEF53 at 1024 + 56 (little-endian fields).
    let sb = &head[1024..2048];
    if le16(sb, 56) == 0xEF53 {
        let block = 1024u64 << le32(sb, 24).min(16);
        let incompat = le32(sb, 96);
        let blocks = le32(sb, 4)
            | if incompat & 0x80 != 0 {
                le32(sb, 0x150) << 32
            } else {
                0
            };
        let name = if incompat & (0x40 | 0x80 | 0x200) != 0 {
            "ext4"
        } else if le32(sb, 92) & 0x4 != 0 {
            "ext3"
        } else {
            "ext2"
        };
        return Some(Found {
            name: name.into(),
            uuid: uuid(&sb[104..120]),
            label: label(&sb[120..136]),
            block_size: block,
            filesystem_block_size: block,
            probed_size: blocks.saturating_mul(block),
            ..Default::default()
        });
    }
    // swap (version 1): "SWAPSPACE2" at the end of the first page (4 KiB pages).
    if &head[4096 - 10..4096] == b"SWAPSPACE2" {
        return Some(Found {
            name: "swap".into(),
            uuid: uuid(&head[1036..1052]),
            label: label(&head[1052..1068]),
            block_size: 4096,
            filesystem_block_size: 4096,
            probed_size: (le32(head, 1028) + 1).saturating_mul(4096),
            ..Default::default()
        });
    }
    // FAT: the boot sector's signature and its type string (FAT32 at 82, FAT12/16 at 54).
    if head[510] == 0x55 && head[511] == 0xAA {
        let (serial_at, label_at) = if &head[82..87] == b"FAT32" {
            (67, 71)
        } else if &head[54..57] == b"FAT" {
            (39, 43)
        } else {
            return None;
        };
        let sector = le16(head, 11);
        let cluster = u64::from(head[13]);
        let sectors = match le16(head, 19) {
            0 => le32(head, 32),
            n => n,
        };
        let serial = le32(head, serial_at);
        let mut lab = label(&head[label_at..label_at + 11]);
        if lab == "NO NAME" {
            lab.clear();
        }
        return Some(Found {
            name: "vfat".into(),
            uuid: format!("{:04X}-{:04X}", serial >> 16, serial & 0xffff),
            label: lab,
            block_size: sector.saturating_mul(cluster),
            filesystem_block_size: sector,
            probed_size: sectors.saturating_mul(sector),
            ..Default::default()
        });
    }
    None
}

/// Reads `HEAD` bytes at `offset` (fewer at the end: then zero-filled).
fn head_at(file: &mut std::fs::File, offset: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; HEAD];
    file.seek(SeekFrom::Start(offset))?;
    let mut got = 0;
    while got < HEAD {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

/// Probes the whole device at `path` (`sector_size` its logical sector size): a filesystem on
/// the whole device, else a GPT with each partition probed at its offset, else nothing known.
///
/// # Errors
///
/// [`ProbeError`].
pub fn probe(path: &Path, sector_size: u64) -> Result<Found, ProbeError> {
    let shown = path.display().to_string();
    let read_err = |source| ProbeError::Read {
        path: shown.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(read_err)?;
    let locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock).map_err(
        |(_, e)| {
            if e == nix::errno::Errno::EWOULDBLOCK {
                ProbeError::Busy(shown.clone())
            } else {
                read_err(std::io::Error::from(e))
            }
        },
    )?;
    let mut file = locked.try_clone().map_err(read_err)?;
    let head = head_at(&mut file, 0).map_err(read_err)?;
    if let Some(found) = superblock(&head) {
        return Ok(found);
    }
    if let Err(reason) = gpt_headers_sane(&mut file, sector_size) {
        return Err(ProbeError::Unsupported {
            path: shown,
            reason,
        });
    }
    let Some(found) = gpt(&file, sector_size) else {
        let size = file.seek(SeekFrom::End(0)).map_err(read_err)?;
        return Ok(Found {
            in_use: edges_hold_data(&mut file, size).map_err(read_err)?,
            ..Found::default()
        });
    };
    let mut found = found;
    for p in &mut found.partitions {
        let head = head_at(&mut file, p.offset).map_err(read_err)?;
        if let Some(f) = superblock(&head) {
            p.found = f;
        }
    }
    drop(locked);
    Ok(found)
}

use std::os::unix::fs::OpenOptionsExt as _;

/// Checks the GPT headers (primary at LBA 1, backup at the last LBA) before the gpt crate reads
/// them: one that carries the GPT signature must declare 128-byte entries, at most
/// [`MAX_GPT_ENTRIES`] of them, inside the disk.
fn gpt_headers_sane(file: &mut std::fs::File, sector_size: u64) -> Result<(), String> {
    let ss = if sector_size == 4096 { 4096 } else { 512 };
    let size = file.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    for (which, lba) in [("primary", 1), ("backup", (size / ss).saturating_sub(1))] {
        if lba == 0 {
            continue;
        }
        let mut h = [0u8; 92];
        file.seek(SeekFrom::Start(lba * ss))
            .and_then(|_| file.read_exact(&mut h))
            .map_err(|e| e.to_string())?;
        if &h[0..8] != b"EFI PART" {
            continue;
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[72..80]);
        let start = u64::from_le_bytes(a);
        let entries = le32(&h, 80);
        let entry_size = le32(&h, 84);
        let end = start
            .saturating_mul(ss)
            .saturating_add(entries.saturating_mul(entry_size));
        if entry_size != 128 || entries > MAX_GPT_ENTRIES || end > size {
            return Err(format!(
                "the {which} GPT header declares {entries} entries of {entry_size} bytes at LBA \
                 {start}: not read (at most {MAX_GPT_ENTRIES} entries of 128 bytes, inside the disk)"
            ));
        }
    }
    Ok(())
}

/// The GPT of `file`, if it has a valid one (primary or backup header).
fn gpt(file: &std::fs::File, sector_size: u64) -> Option<Found> {
    let lb = match sector_size {
        4096 => gpt::disk::LogicalBlockSize::Lb4096,
        _ => gpt::disk::LogicalBlockSize::Lb512,
    };
    let device = file.try_clone().ok()?;
    let disk = gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(lb)
        .open_from_device(device)
        .ok()?;
    let ss = lb.as_u64();
    let partitions = disk
        .partitions()
        .iter()
        .filter(|(_, p)| p.is_used())
        .map(|(&index, p)| Partition {
            index: u64::from(index),
            uuid: p.part_guid.to_string().to_uppercase(),
            type_uuid: p.part_type_guid.guid.to_string().to_uppercase(),
            label: p.name.clone(),
            offset: p.first_lba.saturating_mul(ss),
            size: (p.last_lba.saturating_sub(p.first_lba) + 1).saturating_mul(ss),
            found: Found::default(),
        })
        .collect();
    Some(Found {
        name: "gpt".into(),
        uuid: disk.guid().to_string(),
        block_size: ss,
        filesystem_block_size: ss,
        partitions,
        ..Default::default()
    })
}
