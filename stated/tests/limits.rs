//! Nothing a client sends grows stated's memory or disk without bound: watches of made-up types
//! leave nothing behind, each peer's watches and connections are capped, half-open connections
//! are closed, the run log is compacted at twice the live data, the watch history has a byte
//! budget, and a namespace holds bounded resources, bytes and types. Each limit answers with
//! RESOURCE_EXHAUSTED and a message naming it, and changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{raw, res};
use cosi::{ErrorKind, WatchSpec};
use stated::testing::Harness;
use tokio::io::AsyncReadExt;

const NS: &str = "default";
const T: &str = "Things.test.talos.dev";

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn watches_of_made_up_types_leave_nothing_behind() {
    let h = Harness::start().await;
    let baseline = h.store.stats().collections;
    let mut conns = Vec::new();
    let mut streams = Vec::new();
    for i in 0..2000 {
        // 500 per connection: a connection carries at most 1024 streams.
        if i % 500 == 0 {
            conns.push(raw(&h.socket).await);
        }
        let r = conns.last_mut().unwrap();
        let s = r
            .watch(proto::WatchRequest {
                namespace: NS.into(),
                r#type: format!("Made{i}.up.example"),
                id: None,
                options: None,
                api_version: 1,
            })
            .await
            .unwrap()
            .into_inner();
        streams.push(s);
    }
    assert!(h.store.stats().collections >= baseline + 2000);
    drop(streams);
    wait_for("the watched collections to be released", || {
        h.store.stats().collections == baseline
    })
    .await;
    // Kinds that hold resources stay, with their history.
    h.client.create(&res(NS, T, "a", "1"), "").await.unwrap();
    let w = h.client.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        ..Default::default()
    });
    drop(w);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.client.get(NS, T, "a").await.unwrap().metadata.version, 1);
    assert_eq!(h.store.stats().collections, baseline + 1);
}

#[tokio::test]
async fn a_peer_has_a_bounded_number_of_watches() {
    let h = Harness::start_configured(|c| c.peer_limits.watches_admin = 50).await;
    let mut r = raw(&h.socket).await;
    let open = |r: &mut proto::state_client::StateClient<tonic::transport::Channel>, i: usize| {
        let mut r = r.clone();
        async move {
            r.watch(proto::WatchRequest {
                namespace: NS.into(),
                r#type: format!("W{i}.test.talos.dev"),
                id: None,
                options: None,
                api_version: 1,
            })
            .await
        }
    };
    let mut held = Vec::new();
    for i in 0..50 {
        held.push(open(&mut r, i).await.unwrap().into_inner());
    }
    let e = open(&mut r, 50).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("50 open watches"), "{}", e.message());
    assert_eq!(
        cosi::StateError::from_status(cosi::error::Op::Watch, &e).kind(),
        ErrorKind::LimitReached
    );
    // Closing some gives the slots back.
    held.truncate(40);
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..10 {
        held.push(open(&mut r, 100 + i).await.unwrap().into_inner());
    }
}

#[tokio::test]
async fn connections_are_capped_per_peer_and_silent_ones_are_closed() {
    let h = Harness::start_configured(|c| {
        c.peer_limits.connections_admin = 8;
        c.peer_limits.first_bytes_within = Duration::from_millis(300);
    })
    .await;
    // 20 connections that never speak.
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(tokio::net::UnixStream::connect(&h.socket).await.unwrap());
    }
    // 12 of them are closed at once, the other 8 after the silence limit: every one ends.
    // (stated's HTTP/2 settings may come first: read until the end.)
    let mut ended = 0;
    for s in &mut silent {
        let mut b = [0u8; 256];
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "a silent connection was kept open");
        ended += 1;
    }
    assert_eq!(ended, 20);
    // And the slots are free again: a real client is served.
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.client.create(&res(NS, T, "x", "1"), "").await.unwrap();
    // A client over the cap cannot connect while 8 others (the harness's own and 7 more) are
    // open and live.
    let mut live = Vec::new();
    for _ in 0..7 {
        let c = cosi::Client::new(&h.socket).unwrap();
        c.get(NS, T, "x").await.unwrap();
        live.push(c);
    }
    let extra = cosi::Client::new(&h.socket)
        .unwrap()
        .with_read_retry(Duration::ZERO);
    let e = extra.get(NS, T, "x").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    drop(live);
}

#[tokio::test]
async fn the_run_log_stays_within_twice_the_live_data() {
    let h = Harness::start().await;
    let c = &h.client;
    let big = "x".repeat(8 * 1024);
    let mut r = c.create(&res(NS, T, "hot", &big), "").await.unwrap();
    // 3000 updates of an 8 KiB resource: 24 MiB of writes for 8 KiB of live data.
    for i in 0..3000 {
        let mut next = res(NS, T, "hot", &format!("{big}{i}"));
        next.metadata.version = r.metadata.version;
        r = c.update(&next, "", None).await.unwrap();
    }
    let stats = h.store.stats();
    let file = std::fs::metadata(h.config.run_dir.join("log"))
        .unwrap()
        .len();
    assert!(
        file <= 4 * 1024 * 1024 + 64 * 1024,
        "log {file} bytes for {} live bytes ({stats:?})",
        stats.live_bytes
    );
    // Nothing was lost to the compactions, across a restart too.
    let mut h = h;
    h.restart().await;
    let got = h.client.get(NS, T, "hot").await.unwrap();
    assert_eq!(got.metadata.version, r.metadata.version);
}

#[tokio::test]
async fn the_watch_history_has_a_byte_budget() {
    let h = Harness::start_configured(|c| c.limits.history_bytes = 1024 * 1024).await;
    let c = &h.client;
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap: true,
        ..Default::default()
    });
    assert_eq!(
        common::next(&mut w).await.kind,
        cosi::EventKind::Bootstrapped
    );
    let big = "y".repeat(64 * 1024);
    let mut r = c.create(&res(NS, T, "big", &big), "").await.unwrap();
    let first = common::next(&mut w).await;
    let early = first.bookmark.clone().unwrap();
    for i in 0..200 {
        let mut next = res(NS, T, "big", &format!("{big}{i}"));
        next.metadata.version = r.metadata.version;
        r = c.update(&next, "", None).await.unwrap();
    }
    let stats = h.store.stats();
    assert!(
        stats.history_bytes <= 1024 * 1024,
        "history {} bytes ({stats:?})",
        stats.history_bytes
    );
    // A watch from before the trimmed events cannot resume there: its bookmark has expired.
    let mut raw = raw(&h.socket).await;
    let e = raw
        .watch(proto::WatchRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: None,
            options: Some(proto::WatchOptions {
                start_from_bookmark: Some(early),
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    // The client's watch itself delivers the latest version (resumed or relisted).
    let mut last = 0;
    while last < r.metadata.version {
        last = common::next(&mut w).await.resource.metadata.version;
    }
    assert_eq!(last, r.metadata.version);
}

#[tokio::test]
async fn a_namespace_holds_bounded_resources_bytes_and_types() {
    let h = Harness::start_configured(|c| {
        c.limits.resources_per_namespace = 100;
        c.limits.bytes_per_namespace = 200 * 1024;
        c.limits.types_per_namespace = 5;
    })
    .await;
    let c = &h.client;
    for i in 0..100 {
        c.create(&res(NS, T, &format!("r{i}"), "v"), "")
            .await
            .unwrap();
    }
    let seq = h.store.seq();
    let e = c.create(&res(NS, T, "r100", "v"), "").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitReached, "{e}");
    assert!(e.message().contains("100 resources"), "{e}");
    assert_eq!(h.store.seq(), seq, "nothing written");
    // Another namespace has its own limit.
    c.create(&res("other", T, "r0", "v"), "").await.unwrap();
    // Bytes: an update that grows past the limit is refused, the old version stays.
    let e = c
        .create(&res("other", T, "huge", &"z".repeat(300 * 1024)), "")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitReached, "{e}");
    assert!(e.message().contains("bytes"), "{e}");
    // Types.
    for t in 0..4 {
        c.create(&res("other", &format!("K{t}.test.talos.dev"), "a", "v"), "")
            .await
            .unwrap();
    }
    let e = c
        .create(&res("other", "K9.test.talos.dev", "a", "v"), "")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitReached, "{e}");
    assert!(e.message().contains("types"), "{e}");
    // Destroying frees room.
    c.destroy(NS, T, "r0", "").await.unwrap();
    c.create(&res(NS, T, "r100", "v"), "").await.unwrap();
}

/// The resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_burst_of_watches_of_made_up_types_leaves_no_memory_behind() {
    // A stated process of its own (its memory is what is measured), as a node runs it.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_stated"))
        .arg("--socket")
        .arg(&sock)
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id();
    let _kill = Kill(child);
    wait_for("stated's socket", || sock.exists()).await;
    let mut c = raw(&sock).await;
    c.list(proto::ListRequest {
        namespace: NS.into(),
        r#type: T.into(),
        options: None,
    })
    .await
    .unwrap();
    let start = rss_kib(pid);
    // Each round: 5000 watches of made-up types, 1000 at a time on a connection.
    let mut after = Vec::new();
    for round in 0..3 {
        for batch in 0..5 {
            let mut c = raw(&sock).await;
            let mut streams = Vec::new();
            for i in 0..1000 {
                let mut s = c
                    .watch(proto::WatchRequest {
                        namespace: NS.into(),
                        r#type: format!("Made{round}x{batch}x{i}.up.example"),
                        id: None,
                        options: None,
                        api_version: 1,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let _ = s.message().await;
                streams.push(s);
            }
        }
        // What the burst allocated goes back to the kernel (stated trims its allocator's free
        // memory every 10 s): wait for the resident size to come down, then take it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
        let mut last = rss_kib(pid);
        while last > start + 4096 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            last = rss_kib(pid);
        }
        after.push(last);
    }
    assert!(
        after[0] <= start + 4096,
        "a burst of watches left stated {} KiB larger (from {start} KiB): {after:?}",
        after[0] - start
    );
    assert!(
        after[2] <= after[0] + 1024,
        "each further burst left more: {start} KiB at first, then {after:?}"
    );
}
