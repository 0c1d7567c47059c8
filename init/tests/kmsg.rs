//! init's kernel log reader against the host kernel's real `/dev/kmsg` (read only: nothing is
//! written to the host's log). Reading it needs root (`kernel.dmesg_restrict`).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::time::{Duration, SystemTime};

#[tokio::test]
async fn the_kernels_records_are_read_to_the_end_and_print_as_upstreams() {
    if !testkit::require_root("reading /dev/kmsg needs root (kernel.dmesg_restrict)") {
        return;
    }
    let mut rx = init::kmsg::read(Path::new(init::kmsg::KMSG), false, false).unwrap();
    let mut records = Vec::new();
    // Without follow the reader stops at the end of the kernel's buffer: the channel closes.
    while let Some(r) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the reader ends at the end of the buffer")
    {
        records.push(r.unwrap());
    }
    assert!(!records.is_empty(), "the kernel has logged something");
    let now = machinery::rfc3339::rfc3339(SystemTime::now());
    for r in &records {
        let (facility, rest) = r.split_once(": ").unwrap();
        assert!(
            ["kern", "user", "daemon", "syslog", "auth", "authpriv"].contains(&facility)
                || facility.starts_with("local"),
            "{r}"
        );
        let (priority, rest) = rest.split_once(": [").unwrap();
        assert_eq!(priority.len(), 7, "right-aligned as %7s: {r}");
        let (time, _) = rest.split_once("]: ").unwrap();
        // Boot time plus the record's clock: in the past, and this year's or before.
        assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{r}");
        assert!(time <= now.as_str(), "{time} after {now}");
    }

    // From the tail and following: nothing old comes, and the reader stops once the receiver
    // is gone.
    let mut rx = init::kmsg::read(Path::new(init::kmsg::KMSG), true, true).unwrap();
    let first = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
    if let Ok(Some(Ok(r))) = &first {
        // Only a record the kernel logged just now may come.
        assert!(!records.contains(r), "an old record from the tail: {r}");
    }
    drop(rx);
}
