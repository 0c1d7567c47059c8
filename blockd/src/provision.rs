//! Partitioning a blank disk for the system volumes (a GPT with STATE and EPHEMERAL), as the
//! volume manager will do it: only a disk on which nothing is found ([`crate::probe`]: no
//! partition table, no filesystem, nothing but zeros in its first and last MiB; and blkid
//! found nothing either, which the volume manager asked first) is ever written, under its exclusive `flock` (the lock probes
//! and udev respect), fixed-size partitions first, growing ones filling what is left, each
//! aligned to 1 MiB, written by the gpt crate (protective MBR, both headers).
//!
//! On a block device the kernel is then asked to read the new table (`BLKRRPART`, with
//! CAP_SYS_ADMIN), so that the partitions' devices appear. The volume manager
//! ([`crate::volumes`]) calls it; it is tested on files and loop devices.

use std::str::FromStr as _;

use machinery::resources::block::PartitionSpec;

/// Errors of partitioning.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Something is on the disk: it is never overwritten.
    #[error("{path} is not blank ({found}): not partitioned")]
    NotBlank {
        /// The disk.
        path: String,
        /// What is on it.
        found: String,
    },
    /// The disk cannot be probed, opened, locked or written.
    #[error("{path}: {reason}")]
    Io {
        /// The disk.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The partitions do not fit.
    #[error("{path}: no room for {label} ({need} bytes at least)")]
    NoSpace {
        /// The disk.
        path: String,
        /// The partition.
        label: String,
        /// Its minimum size.
        need: u64,
    },
}

/// A partition written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// Its number (from 1).
    pub index: u32,
    /// Its name.
    pub label: String,
    /// Byte offset.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Partitions are aligned to this many bytes.
pub const ALIGN: u64 = 1024 * 1024;

/// Writes a new GPT with `partitions` (in their order of numbers) on the blank disk at `path`.
///
/// # Errors
///
/// [`ProvisionError`]; on any error before the table is written, the disk is unchanged.
pub fn partition_blank_disk(
    path: &std::path::Path,
    sector_size: u64,
    partitions: &[PartitionSpec],
) -> Result<Vec<Created>, ProvisionError> {
    let shown = path.display().to_string();
    let io = |reason: String| ProvisionError::Io {
        path: shown.clone(),
        reason,
    };
    let found = crate::probe::probe(path, sector_size).map_err(|e| io(e.to_string()))?;
    if !found.name.is_empty() {
        return Err(ProvisionError::NotBlank {
            path: shown,
            found: found.name,
        });
    }
    if found.in_use {
        return Err(ProvisionError::NotBlank {
            path: shown,
            found: crate::probe::IN_USE.into(),
        });
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io(format!("cannot open for writing: {e}")))?;
    let locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| io(format!("cannot take its exclusive lock: {e}")))?;
    let mut device = locked
        .try_clone()
        .map_err(|e| io(format!("cannot use it: {e}")))?;
    // Probed blank under a shared lock; again under the exclusive one (a writer may have come
    // between).
    let head = {
        use std::io::{Read as _, Seek as _};
        const HEAD: usize = 64 * 1024 + 4096;
        let mut head = Vec::with_capacity(HEAD);
        device
            .seek(std::io::SeekFrom::Start(0))
            .and_then(|_| (&mut device).take(HEAD as u64).read_to_end(&mut head))
            .map_err(|e| io(e.to_string()))?;
        head.resize(HEAD, 0);
        head
    };
    // A GPT header at LBA 1 (512- or 4096-byte sectors), or a filesystem.
    let again = if &head[512..520] == b"EFI PART" || &head[4096..4104] == b"EFI PART" {
        Some("gpt".to_string())
    } else {
        crate::probe::superblock(&head).map(|f| f.name)
    };
    if let Some(found) = again {
        return Err(ProvisionError::NotBlank { path: shown, found });
    }
    let size = {
        use std::io::Seek as _;
        device
            .seek(std::io::SeekFrom::End(0))
            .map_err(|e| io(e.to_string()))?
    };
    if crate::probe::edges_hold_data(&mut device, size).map_err(|e| io(e.to_string()))? {
        return Err(ProvisionError::NotBlank {
            path: shown,
            found: crate::probe::IN_USE.into(),
        });
    }
    let lb = if sector_size == 4096 {
        gpt::disk::LogicalBlockSize::Lb4096
    } else {
        gpt::disk::LogicalBlockSize::Lb512
    };
    let lbas = size / lb.as_u64();
    let mbr = gpt::mbr::ProtectiveMBR::with_lb_size(
        u32::try_from(lbas.saturating_sub(1)).unwrap_or(u32::MAX),
    );
    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(lb)
        .create_from_device(device.try_clone().map_err(|e| io(e.to_string()))?, None)
        .map_err(|e| io(format!("cannot make a GPT: {e}")))?;
    let align = ALIGN / lb.as_u64();
    // Fixed sizes first, then the growing ones take what is left; numbers follow `partitions`.
    let mut order: Vec<usize> = (0..partitions.len()).collect();
    order.sort_by_key(|&i| partitions[i].grow);
    for i in order {
        let p = &partitions[i];
        let free = disk
            .find_free_sectors()
            .iter()
            .map(|&(start, len)| {
                let skip = (align - start % align) % align;
                len.saturating_sub(skip).saturating_mul(lb.as_u64())
            })
            .max()
            .unwrap_or(0);
        let want = if p.grow {
            if p.max_size > 0 {
                free.min(p.max_size)
            } else {
                free
            }
        } else {
            p.min_size
        };
        // Whole MiBs.
        let want = want / ALIGN * ALIGN;
        if want < p.min_size.max(1) || want > free {
            return Err(ProvisionError::NoSpace {
                path: shown,
                label: p.label.clone(),
                need: p.min_size,
            });
        }
        let kind = gpt::partition_types::Type::from_str(&p.type_uuid)
            .map_err(|e| io(format!("partition type {:?}: {e}", p.type_uuid)))?;
        let id = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let first = disk
            .find_free_sectors()
            .iter()
            .map(|&(start, len)| (start.div_ceil(align) * align, start + len))
            .find(|&(first, end)| end.saturating_sub(first) >= want / lb.as_u64())
            .map(|(first, _)| first)
            .ok_or_else(|| ProvisionError::NoSpace {
                path: shown.clone(),
                label: p.label.clone(),
                need: want,
            })?;
        disk.add_partition_at(&p.label, id, first, want / lb.as_u64(), kind, 0)
            .map_err(|e| io(format!("cannot add {}: {e}", p.label)))?;
    }
    {
        let mut raw = device.try_clone().map_err(|e| io(e.to_string()))?;
        mbr.overwrite_lba0(&mut raw)
            .map_err(|e| io(format!("cannot write the protective MBR: {e}")))?;
    }
    let created: Vec<Created> = disk
        .partitions()
        .iter()
        .map(|(&index, p)| Created {
            index,
            label: p.name.clone(),
            offset: p.first_lba * lb.as_u64(),
            size: (p.last_lba - p.first_lba + 1) * lb.as_u64(),
        })
        .collect();
    disk.write()
        .map_err(|e| io(format!("cannot write the GPT: {e}")))?;
    device
        .sync_all()
        .map_err(|e| io(format!("cannot flush: {e}")))?;
    let is_block = {
        use std::os::unix::fs::FileTypeExt as _;
        device
            .metadata()
            .is_ok_and(|m| m.file_type().is_block_device())
    };
    if is_block {
        use std::os::fd::AsFd as _;
        sandbox::block::reread_partitions(locked.as_fd()).map_err(|e| {
            io(format!(
                "the GPT is written, but the kernel did not read it again (BLKRRPART): {e}"
            ))
        })?;
    }
    drop(locked);
    Ok(created)
}
