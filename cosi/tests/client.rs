//! The client against a stated that does not answer: init holds stated's listening socket
//! across its restarts, so while stated is down a connection is accepted by the kernel and then
//! never served. Every call must end with a clear error instead of hanging.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cosi::{ErrorKind, Query, WatchSpec};

#[tokio::test]
async fn calls_to_a_stated_that_does_not_answer_fail_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sock");
    // Listening, never accepting: what clients meet while init holds the socket for a stated
    // that is restarting.
    let _held = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let c = cosi::Client::new(&path)
        .unwrap()
        .with_request_timeout(Duration::from_millis(300))
        .with_read_retry(Duration::from_millis(500));
    let started = Instant::now();
    let e = c.get("default", "T.test.dev", "x").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("did not answer"), "{e}");
    assert!(e.message().contains("restarting"), "{e}");
    let e = c
        .list("default", "T.test.dev", &Query::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let r = cosi::RawResource {
        metadata: cosi::Metadata::new("default", "T.test.dev", "x"),
        ..Default::default()
    };
    let e = c.create(&r, "").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Four calls, each bounded by its deadline (and the reads' retry window).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // A watch does not end (it waits for stated to come back), but it does not deliver
    // anything either, and dropping it is prompt.
    let mut w = c.watch(WatchSpec {
        namespace: "default".into(),
        r#type: "T.test.dev".into(),
        ..Default::default()
    });
    assert!(tokio::time::timeout(Duration::from_millis(800), w.next())
        .await
        .is_err());
}
