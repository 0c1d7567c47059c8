//! The State API through the gRPC client against a real stated: the COSI error matrix, CAS,
//! finalizers, teardown, bad input, and watch semantics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{next, raw, res, value};
use cosi::{ErrorKind, EventKind, Phase, Query, WatchSpec};
use stated::testing::Harness;

const NS: &str = "default";
const T: &str = "Things.test.talos.dev";

#[tokio::test]
async fn crud_cas_and_error_matrix() {
    let h = Harness::start().await;
    let c = &h.client;

    let created = c.create(&res(NS, T, "a", "one"), "ctrl").await.unwrap();
    assert_eq!(created.metadata.version, 1);
    assert_eq!(created.metadata.owner, "ctrl");
    assert!(created.metadata.created.is_some());
    assert_eq!(
        c.create(&res(NS, T, "a", "x"), "ctrl")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        c.get(NS, T, "nope").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // Compare-and-set on the version.
    let mut upd = created.clone();
    upd.spec = cosi::resource::encode_spec(&"two").unwrap();
    let v2 = c.update(&upd, "ctrl", Some(Phase::Running)).await.unwrap();
    assert_eq!(v2.metadata.version, 2);
    assert_eq!(v2.metadata.created, created.metadata.created);
    let stale = c.update(&upd, "ctrl", None).await.unwrap_err();
    assert_eq!(stale.kind(), ErrorKind::Conflict, "{stale}");
    assert!(stale.is_conflict());

    // Owner is checked exactly on Update, Destroy and Teardown.
    let mut other = v2.clone();
    other.metadata.owner = "other".into();
    assert_eq!(
        c.update(&other, "other", None).await.unwrap_err().kind(),
        ErrorKind::OwnerConflict
    );
    assert_eq!(
        c.destroy(NS, T, "a", "other").await.unwrap_err().kind(),
        ErrorKind::OwnerConflict
    );
    assert_eq!(
        c.teardown(NS, T, "a", "").await.unwrap_err().kind(),
        ErrorKind::OwnerConflict
    );
    assert_eq!(
        c.update(&res(NS, T, "zz", "v"), "ctrl", None)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        c.destroy(NS, T, "zz", "ctrl").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        c.teardown(NS, T, "zz", "ctrl").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // Finalizers block Destroy; Teardown reports readiness; phase conflicts on Update.
    c.add_finalizer(NS, T, "a", "fin").await.unwrap();
    assert_eq!(
        c.destroy(NS, T, "a", "ctrl").await.unwrap_err().kind(),
        ErrorKind::Conflict
    );
    assert!(!c.teardown(NS, T, "a", "ctrl").await.unwrap());
    let cur = c.get(NS, T, "a").await.unwrap();
    assert_eq!(cur.metadata.phase, Phase::TearingDown);
    let e = c
        .update(&cur, "ctrl", Some(Phase::Running))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PhaseConflict, "{e}");
    // Unset expected phase means any phase.
    c.update(&cur, "ctrl", None).await.unwrap();

    // TeardownAndDestroy blocks until the finalizer is gone.
    let c2 = c.clone();
    let td = tokio::spawn(async move { c2.teardown_and_destroy(NS, T, "a", "ctrl").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!td.is_finished());
    c.remove_finalizer(NS, T, "a", "fin").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), td)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(c.get(NS, T, "a").await.unwrap_err().is_not_found());
    // Removing a finalizer of a missing resource is not an error.
    c.remove_finalizer(NS, T, "a", "fin").await.unwrap();
}

#[tokio::test]
async fn list_filters_and_sorts() {
    let h = Harness::start().await;
    let c = &h.client;
    for id in ["c", "a", "b", "eth0", "eth1"] {
        let mut r = res(NS, T, id, id);
        if id.starts_with("eth") {
            r.metadata.labels.insert("kind".into(), "link".into());
        }
        c.create(&r, "").await.unwrap();
    }
    let all: Vec<String> = c
        .list(NS, T, &Query::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.metadata.id)
        .collect();
    assert_eq!(all, ["a", "b", "c", "eth0", "eth1"]);
    let links = c
        .list(NS, T, &Query::default().label_equal("kind", "link"))
        .await
        .unwrap();
    assert_eq!(links.len(), 2);
    let by_id = c
        .list(NS, T, &Query::default().id_regexp("1$"))
        .await
        .unwrap();
    assert_eq!(by_id.len(), 1);
    assert_eq!(value(&by_id[0]), "eth1");
    let bad = c
        .list(NS, T, &Query::default().id_regexp("("))
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidArgument);
    // Namespaces appear in meta once written.
    c.get("meta", "Namespaces.meta.cosi.dev", NS).await.unwrap();
}

#[tokio::test]
async fn bad_input_is_invalid_argument_and_changes_nothing() {
    let h = Harness::start().await;
    let mut r = raw(&h.socket).await;
    let before = h.store.seq();
    // No resource at all.
    let e = r
        .create(proto::CreateRequest {
            resource: None,
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Missing metadata.
    let e = r
        .create(proto::CreateRequest {
            resource: Some(proto::Resource {
                metadata: None,
                spec: None,
            }),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Empty ID, control characters, bad phase, bad version.
    for (id, phase, version) in [
        ("", "running", ""),
        ("a\u{1}b", "running", ""),
        ("x", "exploding", ""),
        ("x", "", "v1"),
    ] {
        let mut m = res(NS, T, id, "v").to_proto();
        let md = m.metadata.as_mut().unwrap();
        md.phase = phase.into();
        md.version = version.into();
        let e = r
            .create(proto::CreateRequest {
                resource: Some(m),
                options: None,
            })
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            tonic::Code::InvalidArgument,
            "{id:?} {phase:?}: {e}"
        );
    }
    // Oversize spec.
    let mut big = res(NS, T, "big", "");
    big.spec = vec![0; stated::store::MAX_SPEC + 1];
    let e = h.client.create(&big, "").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // Bad regexp in a watch, unknown expected phase in an update.
    let e = r
        .watch(proto::WatchRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: None,
            options: Some(proto::WatchOptions {
                id_query: Some(proto::IdQuery { regexp: "[".into() }),
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = r
        .update(proto::UpdateRequest {
            new_resource: Some(res(NS, T, "x", "v").to_proto()),
            options: Some(proto::UpdateOptions {
                owner: String::new(),
                expected_phase: Some("sideways".into()),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Single watch with bootstrap contents or labels is unimplemented, as in COSI.
    let e = r
        .watch(proto::WatchRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: Some("x".into()),
            options: Some(proto::WatchOptions {
                bootstrap_contents: true,
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    assert_eq!(h.store.seq(), before, "a rejected request wrote something");
}

#[tokio::test]
async fn watch_marker_bootstrap_and_api_version() {
    let h = Harness::start().await;
    h.client.create(&res(NS, T, "b", "1"), "").await.unwrap();
    h.client.create(&res(NS, T, "a", "1"), "").await.unwrap();
    let mut r = raw(&h.socket).await;
    for api_version in [0, 1] {
        let mut s = r
            .watch(proto::WatchRequest {
                namespace: NS.into(),
                r#type: T.into(),
                id: None,
                options: Some(proto::WatchOptions {
                    bootstrap_contents: true,
                    aggregated: true,
                    ..Default::default()
                }),
                api_version,
            })
            .await
            .unwrap()
            .into_inner();
        let marker = s.message().await.unwrap().unwrap();
        assert!(
            marker.event.is_empty(),
            "first response must be the empty marker"
        );
        let batch = s.message().await.unwrap().unwrap();
        let kinds: Vec<i32> = batch.event.iter().map(|e| e.event_type).collect();
        let ids: Vec<String> = batch
            .event
            .iter()
            .map(|e| {
                e.resource
                    .as_ref()
                    .unwrap()
                    .metadata
                    .as_ref()
                    .unwrap()
                    .id
                    .clone()
            })
            .collect();
        if api_version == 0 {
            assert_eq!(kinds, [0, 0], "api_version 0 gets no BOOTSTRAPPED");
        } else {
            assert_eq!(kinds, [0, 0, proto::EventType::Bootstrapped as i32]);
        }
        assert_eq!(&ids[..2], ["a", "b"], "bootstrap sorted by id");
        // COSI: the contents carry no bookmark; only BOOTSTRAPPED does (a client resuming from
        // a bookmark on a CREATED would skip the rest of the contents).
        let n = batch.event.len();
        for e in &batch.event[..2] {
            assert!(
                e.bookmark.is_none(),
                "a bootstrap CREATED carries no bookmark"
            );
        }
        if api_version >= 1 {
            assert!(
                batch.event[n - 1].bookmark.is_some(),
                "BOOTSTRAPPED carries one"
            );
        }
    }
}

#[tokio::test]
async fn watch_single_tail_filter_rewrite_and_bookmark() {
    let h = Harness::start().await;
    let c = &h.client;

    // Single watch of a missing resource starts with a tombstone.
    let mut single = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        id: Some("x".into()),
        ..Default::default()
    });
    assert_eq!(next(&mut single).await.kind, EventKind::Destroyed);

    let mut labelled = res(NS, T, "x", "1");
    labelled.metadata.labels.insert("app".into(), "web".into());
    let x = c.create(&labelled, "").await.unwrap();
    let e = next(&mut single).await;
    assert_eq!(
        (e.kind, value(&e.resource)),
        (EventKind::Created, "1".into())
    );

    // Kind watch filtered by label: leaving the filter is DESTROYED, entering it is CREATED.
    let mut filtered = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap: true,
        query: Query::default().label_equal("app", "web"),
        ..Default::default()
    });
    assert_eq!(next(&mut filtered).await.kind, EventKind::Created);
    assert_eq!(next(&mut filtered).await.kind, EventKind::Bootstrapped);
    let mut off = x.clone();
    off.metadata.labels.clear();
    let off = c.update(&off, "", None).await.unwrap();
    assert_eq!(next(&mut filtered).await.kind, EventKind::Destroyed);
    let mut on = off.clone();
    on.metadata.labels.insert("app".into(), "web".into());
    let on = c.update(&on, "", None).await.unwrap();
    let e = next(&mut filtered).await;
    assert_eq!(e.kind, EventKind::Created);
    let bookmark = e.bookmark.clone().expect("bookmark");
    // A non-matching resource never shows up.
    c.create(&res(NS, T, "y", "other"), "").await.unwrap();

    // Writes after the bookmark, then resume from it: exactly the later events.
    let mut v = on.clone();
    v.spec = cosi::resource::encode_spec(&"2").unwrap();
    c.update(&v, "", None).await.unwrap();
    c.destroy(NS, T, "y", "").await.unwrap();
    let mut resumed = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        start_from_bookmark: Some(bookmark),
        ..Default::default()
    });
    let e = next(&mut resumed).await;
    assert_eq!(e.kind, EventKind::Created);
    assert_eq!(e.resource.metadata.id, "y");
    let e = next(&mut resumed).await;
    assert_eq!(
        (e.kind, value(&e.resource)),
        (EventKind::Updated, "2".into())
    );
    assert_eq!(value(e.old.as_ref().unwrap()), "1");
    assert_eq!(next(&mut resumed).await.kind, EventKind::Destroyed);

    // Tail: the last two events of the kind.
    let mut tail = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        tail_events: 2,
        ..Default::default()
    });
    assert_eq!(next(&mut tail).await.kind, EventKind::Updated);
    assert_eq!(next(&mut tail).await.kind, EventKind::Destroyed);

    // A bookmark from nowhere is refused.
    let mut bad = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        start_from_bookmark: Some(vec![1, 2, 3]),
        ..Default::default()
    });
    let err = tokio::time::timeout(Duration::from_secs(5), bad.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidBookmark);
}

#[tokio::test]
async fn bookmarks_and_data_survive_a_restart_and_watches_resume() {
    let mut h = Harness::start().await;
    let c = h.client.clone();
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap: true,
        ..Default::default()
    });
    assert_eq!(next(&mut w).await.kind, EventKind::Bootstrapped);
    let a = c.create(&res(NS, T, "a", "1"), "o").await.unwrap();
    let e = next(&mut w).await;
    let bookmark = e.bookmark.clone().unwrap();

    h.restart().await;
    // Data is back, versions intact.
    let got = c.get(NS, T, "a").await.unwrap();
    assert_eq!(got.metadata.version, a.metadata.version);
    // The old watch resumed by itself: it sees a write made after the restart.
    c.create(&res(NS, T, "b", "2"), "o").await.unwrap();
    let e = next(&mut w).await;
    assert_eq!(
        (e.kind, e.resource.metadata.id.as_str()),
        (EventKind::Created, "b")
    );
    // A bookmark taken before the restart is still valid.
    let mut resumed = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        start_from_bookmark: Some(bookmark),
        ..Default::default()
    });
    let e = next(&mut resumed).await;
    assert_eq!(e.resource.metadata.id, "b");
}

#[tokio::test]
async fn a_stalled_watcher_delays_no_one_and_gets_a_resumable_error() {
    let h = Harness::start_configured(|c| c.history = 64).await;
    let c = h.client.clone();
    c.create(&res(NS, T, "k", "0"), "").await.unwrap();
    // A raw watcher that never reads.
    let mut r = raw(&h.socket).await;
    let mut stalled = r
        .watch(proto::WatchRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: None,
            options: Some(proto::WatchOptions {
                aggregated: false,
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let mut healthy = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        ..Default::default()
    });
    // Give the healthy watch time to be established before writing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    const N: usize = 20_000;
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut cur = c.get(NS, T, "k").await.unwrap();
            for i in 1..=N {
                cur.spec = cosi::resource::encode_spec(&i.to_string()).unwrap();
                cur = c.update(&cur, "", None).await.unwrap();
            }
        })
    };
    let mut last = String::new();
    let mut seen = 0;
    while last != N.to_string() {
        let e = next(&mut healthy).await;
        seen += 1;
        last = value(&e.resource);
    }
    writer.await.unwrap();
    // The healthy watcher saw every update (no overrun: it kept up), or resumed transparently.
    assert!(seen >= 1);
    // The stalled one, read now, ends in a resumable ERRORED event carrying a bookmark.
    let mut errored = None;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(5), stalled.message())
        .await
        .unwrap()
    {
        if let Some(e) = m
            .event
            .iter()
            .find(|e| e.event_type == proto::EventType::Errored as i32)
        {
            errored = Some(e.clone());
            break;
        }
    }
    let e = errored.expect("stalled watcher gets ERRORED");
    assert!(e.error.unwrap().contains("overrun"));
    assert!(e.bookmark.is_some());
}

#[tokio::test]
async fn an_idle_kind_keeps_its_bookmark_while_other_kinds_are_written() {
    let mut h = Harness::start_configured(|c| c.history = 16).await;
    let c = h.client.clone();
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap_bookmark: true,
        ..Default::default()
    });
    let noop = next(&mut w).await;
    assert_eq!(noop.kind, EventKind::Noop);
    // Far more writes to another kind than the history holds.
    for i in 0..100 {
        c.create(&res(NS, "Others.test.talos.dev", &i.to_string(), "x"), "")
            .await
            .unwrap();
    }
    h.restart().await;
    // On the wire (the client would hide an expired bookmark by relisting): still valid.
    let mut r = raw(&h.socket).await;
    let mut s = r
        .watch(proto::WatchRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: None,
            options: Some(proto::WatchOptions {
                start_from_bookmark: noop.bookmark.clone(),
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        s.message().await.unwrap().unwrap().event.is_empty(),
        "watch from the bookmark is established"
    );
    let mut resumed = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        start_from_bookmark: noop.bookmark,
        ..Default::default()
    });
    c.create(&res(NS, T, "late", "x"), "").await.unwrap();
    let e = next(&mut resumed).await;
    assert_eq!(
        (e.kind, e.resource.metadata.id.as_str()),
        (EventKind::Created, "late")
    );
}

#[tokio::test]
async fn after_a_reboot_a_watch_relists_and_reports_what_changed() {
    let mut h = Harness::start().await;
    let c = h.client.clone();
    c.create(&res(NS, T, "a", "1"), "").await.unwrap();
    c.create(&res(NS, T, "b", "1"), "").await.unwrap();
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap: true,
        ..Default::default()
    });
    assert_eq!(next(&mut w).await.kind, EventKind::Created);
    assert_eq!(next(&mut w).await.kind, EventKind::Created);
    assert_eq!(next(&mut w).await.kind, EventKind::Bootstrapped);

    // A reboot: the run state is gone (a new epoch, so every bookmark is invalid), the
    // non-durable namespace is empty.
    h.stop().await;
    std::fs::remove_dir_all(&h.config.run_dir).unwrap();
    h.restart().await;
    c.create(&res(NS, T, "b", "2"), "").await.unwrap();

    // The watch could not resume from its bookmark: it relisted and turned the difference into
    // events: `a` destroyed, `b` replaced by a new resource (version 1 again, new creation time)
    // — as Destroyed+Created or as one Updated, depending on when the relist ran.
    let (mut a_destroyed, mut b_new) = (false, false);
    while !(a_destroyed && b_new) {
        let e = next(&mut w).await;
        match (e.kind, e.resource.metadata.id.as_str()) {
            (EventKind::Destroyed, "a") => a_destroyed = true,
            (EventKind::Destroyed, "b") => b_new = false,
            (EventKind::Created | EventKind::Updated, "b") if value(&e.resource) == "2" => {
                b_new = true
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// A watch cut in the middle of its bootstrap contents (stated restarted while the contents are
/// still on their way) delivers every resource exactly once and then BOOTSTRAPPED: the contents
/// carry no bookmark (COSI), so the client relists instead of resuming past what it missed.
#[tokio::test]
async fn a_watch_cut_during_its_bootstrap_delivers_the_rest() {
    let mut h = Harness::start().await;
    let c = h.client.clone();
    const N: usize = 20_000;
    let pad = "x".repeat(2000);
    let mut tasks = Vec::new();
    for part in 0..4 {
        let c = c.clone();
        let pad = pad.clone();
        tasks.push(tokio::spawn(async move {
            for i in (part..N).step_by(4) {
                c.create(&res(NS, T, &format!("r{i:05}"), &pad), "o")
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap: true,
        ..Default::default()
    });
    // The first events arrive; the rest is held back by flow control and the client's queue.
    let first = next(&mut w).await;
    assert_eq!(first.kind, EventKind::Created);
    h.restart().await;
    let mut ids = std::collections::BTreeSet::new();
    ids.insert(first.resource.metadata.id.clone());
    let mut dup = 0;
    loop {
        let e = next(&mut w).await;
        match e.kind {
            EventKind::Created => {
                if !ids.insert(e.resource.metadata.id.clone()) {
                    dup += 1;
                }
            }
            EventKind::Bootstrapped => break,
            other => panic!("unexpected {other:?} during the bootstrap"),
        }
    }
    assert_eq!(dup, 0, "no resource delivered twice");
    assert_eq!(ids.len(), N, "every resource delivered before BOOTSTRAPPED");
    // And the watch goes on live.
    c.create(&res(NS, T, "after", "1"), "o").await.unwrap();
    let e = next(&mut w).await;
    assert_eq!(
        (e.kind, e.resource.metadata.id.as_str()),
        (EventKind::Created, "after")
    );
}

/// A GetRequest whose strings are raw bytes, to send what a generated client cannot: a string
/// field that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGetRequest {
    #[prost(bytes = "vec", tag = "1")]
    namespace: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    r#type: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    id: Vec<u8>,
}

/// Invalid UTF-8 is the client's error (INVALID_ARGUMENT, not INTERNAL), and no error message
/// echoes a huge input back (the trailer would be too large for the client to read).
#[tokio::test]
async fn malformed_requests_are_invalid_argument_with_bounded_messages() {
    let h = Harness::start().await;
    let p = h.socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://stated.local")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    for (ns, ty, id) in [
        (&b"default"[..], &b"T.test.dev"[..], &b"\xff\xfe"[..]),
        (&b"\xc3\x28"[..], &b"T.test.dev"[..], &b"a"[..]),
    ] {
        grpc.ready().await.unwrap();
        let e = grpc
            .unary::<_, proto::GetResponse, _>(
                tonic::Request::new(RawGetRequest {
                    namespace: ns.to_vec(),
                    r#type: ty.to_vec(),
                    id: id.to_vec(),
                }),
                "/cosi.resource.State/Get".parse().unwrap(),
                proto::codec::Codec::<RawGetRequest, proto::GetResponse>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("UTF-8"), "{}", e.message());
    }
    // A 1 MiB ID (well-formed): refused with a short message, on every call that takes one.
    let mut r = raw(&h.socket).await;
    let huge = "x".repeat(1 << 20);
    let e = r
        .get(proto::GetRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: huge.clone(),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().len() < 300, "{} bytes", e.message().len());
    let e = r
        .create(proto::CreateRequest {
            resource: Some(res(NS, T, &huge, "v").to_proto()),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().len() < 300, "{} bytes", e.message().len());
    let e = r
        .destroy(proto::DestroyRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: huge.clone(),
            options: Some(proto::DestroyOptions { owner: huge }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().len() < 300, "{} bytes", e.message().len());
}

/// gRPC's C-core clients (Python here) send the socket path as `:authority` on a Unix socket;
/// stated must answer them like any other client (h2 rejects such an authority by default:
/// hyperium/h2#487; the workspace patches h2 to ignore it, see vendor/h2/TALOS-RS.md).
#[tokio::test]
async fn a_grpc_c_core_client_is_served_over_the_unix_socket() {
    let python = std::process::Command::new("python3")
        .args(["-c", "import grpc"])
        .status();
    if !testkit::require(
        python.is_ok_and(|s| s.success()),
        "python3 with grpcio is missing (scripts/install-deps.sh installs it)",
    ) {
        return;
    }
    let h = Harness::start().await;
    h.client
        .create(&res(NS, T, "hello", "world"), "")
        .await
        .unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/python_client.py"
    );
    let socket = h.socket.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(&socket)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "python client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A watch is read in its consumer's task, and a consumer may drop a read half-way (a
/// `select!`, a `timeout`): nothing may be lost or repeated by that, whether the read was
/// waiting for the stream, for the first open or for a reconnect's backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_read_dropped_half_way_loses_nothing() {
    let mut h = Harness::start().await;
    let c = h.client.clone();
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap_bookmark: true,
        omit_old: true,
        ..Default::default()
    });
    // The watch was opened by `watch` itself: a write made before the first read is seen.
    let noop = next(&mut w).await;
    assert_eq!(noop.kind, EventKind::Noop);
    const N: usize = 300;
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut cur = c.create(&res(NS, T, "k", "0"), "").await.unwrap();
            for i in 1..N {
                cur.spec = cosi::resource::encode_spec(&i.to_string()).unwrap();
                cur = c.update(&cur, "", None).await.unwrap();
                if i % 50 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    // Reads cut after 50 µs, most of them while waiting: every version arrives once, in order.
    let mut got = Vec::new();
    let mut cut = 0;
    while got.len() < N {
        match tokio::time::timeout(Duration::from_micros(50), w.next()).await {
            Ok(Some(Ok(e))) => {
                assert!(e.old.is_none(), "asked without the old resource");
                got.push(e.resource.metadata.version);
            }
            Ok(other) => panic!("watch ended: {other:?}"),
            Err(_) => cut += 1,
        }
    }
    writer.await.unwrap();
    assert_eq!(got, (1..=N as u64).collect::<Vec<_>>());
    assert!(cut > 0, "no read was cut: the test did not test");

    // stated goes away; the watch, read with short deadlines, keeps its backoff across the
    // cut reads and resumes from its bookmark once stated is back.
    h.stop().await;
    for _ in 0..20 {
        assert!(tokio::time::timeout(Duration::from_millis(10), w.next())
            .await
            .is_err());
    }
    h.restart().await;
    let mut cur = c.get(NS, T, "k").await.unwrap();
    cur.spec = cosi::resource::encode_spec(&"after").unwrap();
    c.update(&cur, "", None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let e = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch did not resume"
        );
        if let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(10), w.next()).await {
            break e.unwrap();
        }
    };
    assert_eq!(
        (e.kind, e.resource.metadata.version),
        (EventKind::Updated, N as u64 + 1)
    );
}

/// `omit_old` (a talos-rs extension) leaves the old resource out of updates; without it an
/// update carries it, as COSI's do.
#[tokio::test]
async fn updates_carry_the_old_resource_unless_asked_not_to() {
    let h = Harness::start().await;
    let c = &h.client;
    let spec = |omit_old| WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap_bookmark: true,
        omit_old,
        ..Default::default()
    };
    let (mut with, mut without) = (c.watch(spec(false)), c.watch(spec(true)));
    assert_eq!(next(&mut with).await.kind, EventKind::Noop);
    assert_eq!(next(&mut without).await.kind, EventKind::Noop);
    let mut cur = c.create(&res(NS, T, "a", "1"), "").await.unwrap();
    cur.spec = cosi::resource::encode_spec(&"2").unwrap();
    c.update(&cur, "", None).await.unwrap();
    for w in [&mut with, &mut without] {
        let e = next(w).await;
        assert_eq!(
            (e.kind, value(&e.resource).as_str()),
            (EventKind::Created, "1")
        );
        assert!(e.old.is_none());
    }
    let e = next(&mut with).await;
    assert_eq!(
        (e.kind, value(&e.resource).as_str()),
        (EventKind::Updated, "2")
    );
    assert_eq!(value(e.old.as_ref().expect("old resource")), "1");
    let e = next(&mut without).await;
    assert_eq!(
        (e.kind, value(&e.resource).as_str()),
        (EventKind::Updated, "2")
    );
    assert!(e.old.is_none());
}

/// `talosrs.state.Batch`: several writes in one call, each done or refused as its own call
/// would be, in order; large batches are split by the client; a server without the service
/// gets the writes one by one.
#[tokio::test]
async fn a_batch_of_writes_is_each_write_as_its_own_call() {
    let h = Harness::start().await;
    let c = &h.client;
    let a = c.create(&res(NS, T, "a", "1"), "ctrl").await.unwrap();
    let mut a2 = a.clone();
    a2.spec = cosi::resource::encode_spec(&"2").unwrap();
    let mut stale = a.clone();
    stale.spec = cosi::resource::encode_spec(&"stale").unwrap();
    let write = |r: cosi::RawResource, update: bool| {
        if update {
            cosi::BatchWrite::Update {
                resource: r,
                owner: "ctrl".into(),
                expected_phase: None,
            }
        } else {
            cosi::BatchWrite::Create {
                resource: r,
                owner: "ctrl".into(),
            }
        }
    };
    let results = c
        .write_batch(vec![
            write(res(NS, T, "b", "1"), false),
            write(a2, true),
            // The same version again: the first update moved it on.
            write(stale, true),
            write(res(NS, T, "b", "again"), false),
            cosi::BatchWrite::Destroy {
                namespace: NS.into(),
                r#type: T.into(),
                id: "nope".into(),
                owner: "ctrl".into(),
            },
            write(res(NS, T, "bad\nid", "1"), false),
            cosi::BatchWrite::Destroy {
                namespace: NS.into(),
                r#type: T.into(),
                id: "b".into(),
                owner: "ctrl".into(),
            },
        ])
        .await
        .unwrap();
    let kinds: Vec<Option<ErrorKind>> = results
        .iter()
        .map(|r| r.as_ref().err().map(|e| e.kind()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            None,
            None,
            Some(ErrorKind::Conflict),
            Some(ErrorKind::AlreadyExists),
            Some(ErrorKind::NotFound),
            Some(ErrorKind::InvalidArgument),
            None,
        ],
        "{results:?}"
    );
    let updated = results[1].as_ref().unwrap().as_ref().unwrap();
    assert_eq!(
        (updated.metadata.version, value(updated).as_str()),
        (2, "2")
    );
    assert!(
        results[6].as_ref().unwrap().is_none(),
        "a destroy returns nothing"
    );
    assert_eq!(value(&c.get(NS, T, "a").await.unwrap()), "2");
    assert!(c.get(NS, T, "b").await.unwrap_err().is_not_found());

    // More than one call's worth: split by the client, all done, in order.
    let many: Vec<_> = (0..600)
        .map(|i| write(res(NS, T, &format!("m{i:04}"), &i.to_string()), false))
        .collect();
    let results = c.write_batch(many).await.unwrap();
    assert_eq!(results.len(), 600);
    assert!(results.iter().all(|r| r.is_ok()));
    assert_eq!(
        results[599].as_ref().unwrap().as_ref().unwrap().metadata.id,
        "m0599"
    );
    assert_eq!(c.list(NS, T, &Query::default()).await.unwrap().len(), 601);

    // A batch with a write of a durable namespace is written to disk before it is answered.
    let results = c
        .write_batch(vec![
            write(res("config", T, "c", "1"), false),
            write(res(NS, T, "after-durable", "1"), false),
        ])
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let durable_file = std::fs::read(h.config.state_dir.join("config.ns")).unwrap();
    assert!(
        durable_file.windows(T.len()).any(|w| w == T.as_bytes()),
        "the durable file holds the resource"
    );

    // stated refuses more than 256 writes in one call, whoever sends them.
    let mut raw =
        proto::talosrs::state::batch_client::BatchClient::new(cosi::unix_channel(&h.socket));
    let write = proto::talosrs::state::Write {
        op: Some(proto::talosrs::state::write::Op::Destroy(
            proto::DestroyRequest {
                namespace: NS.into(),
                r#type: T.into(),
                id: "m0000".into(),
                options: None,
            },
        )),
    };
    let e = raw
        .write(proto::talosrs::state::WriteRequest {
            writes: vec![write; 257],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    c.get(NS, T, "m0000").await.unwrap();
}

/// A server with only COSI's State service (an upstream one) gets a batch one write at a time.
#[tokio::test]
async fn a_batch_to_a_server_without_the_batch_service_is_written_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("state.sock");
    let store = std::sync::Arc::new(
        stated::Store::open(stated::store::StoreConfig {
            run_dir: None,
            state_dir: None,
            durable: Box::new(|_| false),
            namespaces: Vec::new(),
            history: 64,
            limits: Default::default(),
        })
        .unwrap(),
    );
    let service = stated::server::StateService::new(
        store,
        std::sync::Arc::new(stated::Policy::standalone()),
        Default::default(),
    );
    let listener = stated::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(proto::state_server::StateServer::new(service))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let c = cosi::Client::new(&socket).unwrap();
    let writes = (0..40)
        .map(|i| cosi::BatchWrite::Create {
            resource: res(NS, T, &format!("x{i}"), "1"),
            owner: "".into(),
        })
        .chain([cosi::BatchWrite::Create {
            resource: res(NS, T, "x0", "1"),
            owner: "".into(),
        }])
        .collect();
    let results = c.write_batch(writes).await.unwrap();
    assert_eq!(results.len(), 41);
    assert!(results[..40].iter().all(|r| r.is_ok()));
    assert_eq!(
        results[40].as_ref().unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    assert_eq!(c.list(NS, T, &Query::default()).await.unwrap().len(), 40);
}

/// A watch far behind (600 writes since its bookmark, more than one response's 256) gets every
/// event, in order, a batch at a time.
#[tokio::test]
async fn a_watch_far_behind_gets_every_event_a_batch_at_a_time() {
    let h = Harness::start().await;
    let c = &h.client;
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap_bookmark: true,
        ..Default::default()
    });
    let bookmark = next(&mut w).await.bookmark.expect("the NOOP's bookmark");
    let writes: Vec<_> = (0..600)
        .map(|i| cosi::BatchWrite::Create {
            resource: res(NS, T, &format!("b{i:04}"), "x"),
            owner: "".into(),
        })
        .collect();
    assert!(c
        .write_batch(writes)
        .await
        .unwrap()
        .iter()
        .all(|r| r.is_ok()));
    let mut r = raw(&h.socket).await;
    let mut stream = r
        .watch(proto::WatchRequest {
            namespace: NS.into(),
            r#type: T.into(),
            id: None,
            options: Some(proto::WatchOptions {
                aggregated: true,
                start_from_bookmark: Some(bookmark),
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let mut ids = Vec::new();
    let mut responses = 0;
    while ids.len() < 600 {
        let m = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("events within 10 s")
            .unwrap()
            .expect("stream open");
        if m.event.is_empty() {
            continue;
        }
        responses += 1;
        assert!(m.event.len() <= 256, "one batch is at most 256 events");
        ids.extend(m.event.into_iter().map(|e| {
            e.resource
                .and_then(|r| r.metadata)
                .map(|m| m.id)
                .unwrap_or_default()
        }));
    }
    assert!(responses >= 3, "{responses} responses");
    let want: Vec<String> = (0..600).map(|i| format!("b{i:04}")).collect();
    assert_eq!(ids, want);
}

/// Resource definitions as a daemon writes them at start (`define_types`: one batch of creates,
/// then one list for those already there): new ones created, equal ones left alone (their
/// version unchanged), changed ones (a newer build) updated in place.
#[tokio::test]
async fn definitions_are_created_in_one_go_and_only_changed_ones_updated() {
    use cosi::{ResourceDefinition, ResourceSpec as _, META_NAMESPACE};
    let h = Harness::start().await;
    let c = &h.client;
    let a = ResourceDefinition::new("Apples.test.talos.dev", NS);
    let b = ResourceDefinition::new("Pears.test.talos.dev", NS);
    c.define_types(&[a.clone(), b.clone()], "d").await.unwrap();
    let version = |id: String| async move {
        c.get(META_NAMESPACE, ResourceDefinition::TYPE, &id)
            .await
            .unwrap()
            .metadata
            .version
    };
    let (va, vb) = (version(a.id()).await, version(b.id()).await);
    let b2 = b.clone().with_columns(&[("Ripe", "{.ripe}")]);
    let c3 = ResourceDefinition::new("Plums.test.talos.dev", NS);
    c.define_types(&[a.clone(), b2.clone(), c3.clone()], "d")
        .await
        .unwrap();
    assert_eq!(
        version(a.id()).await,
        va,
        "an equal definition is not rewritten"
    );
    assert_eq!(
        version(b.id()).await,
        vb + 1,
        "a changed definition is updated"
    );
    let stored = c
        .get(META_NAMESPACE, ResourceDefinition::TYPE, &b.id())
        .await
        .unwrap();
    assert_eq!(
        cosi::resource::decode_spec::<ResourceDefinition>(&stored.spec).unwrap(),
        b2
    );
    assert_eq!(version(c3.id()).await, 1, "a new one is created");
}

/// Replies and watch responses of every size around h2's write-buffer boundaries (the vendored
/// h2 copies DATA payloads under 4 KiB into its buffer and chains larger ones: the two paths
/// meet there; frames split at 16 KiB) arrive whole and in order, by Get, List and Watch.
#[tokio::test]
async fn messages_of_every_size_around_the_write_buffer_limits_arrive_whole() {
    let h = Harness::start().await;
    let c = &h.client;
    let mut w = c.watch(WatchSpec {
        namespace: NS.into(),
        r#type: T.into(),
        bootstrap_bookmark: true,
        ..Default::default()
    });
    assert_eq!(next(&mut w).await.kind, EventKind::Noop);

    let mut sizes: Vec<usize> = vec![0, 1, 200, 240, 250, 256, 300, 1000];
    sizes.extend((3950..4250).step_by(3));
    sizes.extend([8000, 12_000, 16_300, 16_384, 16_400, 40_000, 70_000]);
    let text = |i: usize, n: usize| -> String {
        let head = format!("{i}:");
        let fill = (b'a' + (i % 26) as u8) as char;
        head.chars()
            .chain(std::iter::repeat(fill))
            .take(n.max(head.len()))
            .collect()
    };
    for (i, &n) in sizes.iter().enumerate() {
        let id = format!("s{i:03}");
        let created = c
            .create(&res(NS, T, &id, &text(i, n)), "ctrl")
            .await
            .unwrap();
        assert_eq!(value(&created), text(i, n), "create reply of {n}");
        let got = c.get(NS, T, &id).await.unwrap();
        assert_eq!(value(&got), text(i, n), "get of {n}");
        let e = next(&mut w).await;
        assert_eq!(e.kind, EventKind::Created);
        assert_eq!(e.resource.metadata.id, id);
        assert_eq!(value(&e.resource), text(i, n), "event of {n}");
    }
    let listed = c.list(NS, T, &Query::default()).await.unwrap();
    assert_eq!(listed.len(), sizes.len());
    for (i, r) in listed.iter().enumerate() {
        assert_eq!(value(r), text(i, sizes[i]), "list item {i}");
    }
}
