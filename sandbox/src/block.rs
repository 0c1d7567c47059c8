//! Block device requests no kept crate wraps safely: the kernel re-reading a disk's partition
//! table after it was written (`BLKRRPART`, what `partprobe` and `blockdev --rereadpt` do).

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

mod raw {
    // BLKRRPART = _IO(0x12, 95) (linux/fs.h).
    nix::ioctl_none!(blkrrpart, 0x12, 95);
}

/// Asks the kernel to read the partition table of the disk open at `disk` again, so that its
/// partitions' devices match what was just written. Needs CAP_SYS_ADMIN; `EBUSY` while one of
/// the disk's partitions is in use (mounted).
///
/// # Errors
///
/// The ioctl's errno.
pub fn reread_partitions(disk: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: BLKRRPART takes no argument and only reads the fd, which the borrow keeps open
    // for the call.
    unsafe { raw::blkrrpart(disk.as_raw_fd()) }.map(|_| ())
}
