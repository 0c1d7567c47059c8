//! The kernel log (`/dev/kmsg`) for `machine.MachineService/Dmesg`: records read as upstream's
//! go-kmsg reads them and printed as upstream's machined prints them
//! (`kern:    info: [2026-12-03T18:00:00.123456Z]: message`).
//!
//! On a VM node this is the node's own kernel. A container-mode node shares the host's kernel
//! and is given no `/dev/kmsg` (the host's log is the host's: `kernel.dmesg_restrict` keeps it
//! from the host's own users, so a node's API must not hand it out either): the call then says
//! so ([`KmsgError::NotHere`]).

use std::io::{ErrorKind, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

/// The kernel's log device.
pub const KMSG: &str = "/dev/kmsg";

/// How often a follower looks for new records.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Largest record the kernel hands out (a read with a smaller buffer fails with EINVAL).
const RECORD: usize = 8192;

/// Why the kernel log cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// The node has no kernel log device of its own.
    #[error(
        "this node has no kernel log of its own: a container-mode node shares the host's kernel \
         and is not given its log ({KMSG}); dmesg works on VM nodes"
    )]
    NotHere,
    /// The device cannot be opened or read.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Facility names (`<sys/syslog.h>`), as go-kmsg prints them.
const FACILITIES: [&str; 19] = [
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv",
    "local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7",
];
/// Priority names, as go-kmsg prints them.
const PRIORITIES: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

/// One record as upstream's Dmesg sends it: `facility: priority: [time]: message` (the message
/// as the kernel wrote it, its continuation lines and final newline included). A record that
/// does not parse is an error naming what is wrong (go-kmsg's).
pub fn format(record: &str, boot: SystemTime) -> Result<String, String> {
    let (prefix, message) = record
        .split_once(';')
        .ok_or("kernel message should contain a prefix")?;
    let fields: Vec<&str> = prefix.split(',').collect();
    if fields.len() < 3 {
        return Err(format!(
            "message metdata should have at least 3 parts, got {}",
            fields.len()
        ));
    }
    let prio: u64 = fields[0]
        .parse()
        .map_err(|e| format!("error parsing priority: {e}"))?;
    let _sequence: u64 = fields[1]
        .parse()
        .map_err(|e| format!("error parsing sequence: {e}"))?;
    let clock: u64 = fields[2]
        .parse()
        .map_err(|e| format!("errors parsing clock from boot: {e}"))?;
    let facility = usize::try_from(prio >> 3)
        .ok()
        .and_then(|f| FACILITIES.get(f))
        .copied()
        .unwrap_or("unknown");
    let priority = PRIORITIES[usize::try_from(prio & 7).unwrap_or(0)];
    // A clock past what SystemTime holds is not a time: the boot time stands in.
    let at = boot
        .checked_add(Duration::from_micros(clock))
        .unwrap_or(boot);
    Ok(format!(
        "{facility}: {priority:>7}: [{}]: {message}",
        machinery::rfc3339::rfc3339(at)
    ))
}

/// When the kernel's clock of `/dev/kmsg` (monotonic, from boot) was zero, in wall-clock time.
fn boot_time() -> SystemTime {
    let since_boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default();
    SystemTime::now()
        .checked_sub(since_boot)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Reads the kernel log at `path` ([`KMSG`]): from the start of the kernel's buffer, or only
/// what comes after now (`tail`); to its end, or on as new records come (`follow`). Records
/// arrive formatted ([`format`]) on the returned channel, a record that does not parse as an
/// `Err`; the reader stops when the receiver is dropped.
///
/// # Errors
///
/// [`KmsgError::NotHere`] when the device does not exist; [`KmsgError::Io`] when it cannot be
/// opened.
pub fn read(
    path: &Path,
    follow: bool,
    tail: bool,
) -> Result<mpsc::Receiver<Result<String, String>>, KmsgError> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|source| match source.kind() {
            ErrorKind::NotFound => KmsgError::NotHere,
            _ => KmsgError::Io {
                what: "cannot open the kernel log",
                source,
            },
        })?;
    if tail {
        file.seek(SeekFrom::End(0))
            .map_err(|source| KmsgError::Io {
                what: "error seeking to the tail of kmsg",
                source,
            })?;
    }
    let boot = boot_time();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut buf = vec![0u8; RECORD];
        loop {
            // Non-blocking: a read returns at once, with a record or EAGAIN.
            let n = match file.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                // Records were overwritten before they were read: go on with the next.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !follow {
                        return;
                    }
                    // Polling the device would need tokio's AsyncFd, whose registration is
                    // `unsafe` (all of it lives in the sandbox crate): a look every
                    // FOLLOW_POLL is as good for a person following the log.
                    tokio::select! {
                        () = tx.closed() => return,
                        () = tokio::time::sleep(FOLLOW_POLL) => continue,
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("error reading from kmsg: {e}"))).await;
                    return;
                }
            };
            let record = String::from_utf8_lossy(&buf[..n]);
            if tx.send(format(&record, boot)).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_print_as_upstreams_dmesg() {
        let boot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            format("6,339,5140900,-;NET: Registered protocol family 10\n", boot).unwrap(),
            "kern:    info: [2023-11-14T22:13:25.1409Z]: NET: Registered protocol family 10\n"
        );
        let with_dict = "30,1,0,-,caller=T1;systemd[1]: started\n SUBSYSTEM=net\n";
        assert_eq!(
            format(with_dict, boot).unwrap(),
            "daemon:    info: [2023-11-14T22:13:20Z]: systemd[1]: started\n SUBSYSTEM=net\n"
        );
        assert_eq!(
            format("3,2,3;x", boot).unwrap(),
            "kern:     err: [2023-11-14T22:13:20.000003Z]: x"
        );
        assert!(format("no prefix", boot).is_err());
        assert!(format("6,1;m", boot)
            .unwrap_err()
            .contains("at least 3 parts"));
        assert!(format("x,1,2;m", boot).unwrap_err().contains("priority"));
        // Absurd numbers do not panic.
        let huge = format!("{},1,{};m", u64::MAX, u64::MAX);
        assert!(format(&huge, boot)
            .unwrap()
            .starts_with("unknown:   debug: ["));
    }

    #[test]
    fn a_missing_device_says_the_node_has_no_kernel_log() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(&dir.path().join("kmsg"), false, false).unwrap_err();
        assert!(matches!(e, KmsgError::NotHere), "{e}");
        assert!(e.to_string().contains("container-mode"), "{e}");
    }
}
