//! kill -9 of the real stated binary: no acknowledged write is lost, clients resume, and a
//! durable namespace interrupted mid-write holds the old or the new value after a reboot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{next, res, value};
use cosi::{ErrorKind, EventKind, WatchSpec};

const T: &str = "Things.test.talos.dev";

struct Stated {
    child: Child,
}

impl Stated {
    fn start(socket: &Path, state: &Path, run: &Path) -> Self {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(env!("CARGO_BIN_EXE_stated"))
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state)
            .arg("--run-dir")
            .arg(run)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn stated");
        Self { child }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Stated {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn wait_ready(c: &cosi::Client) {
    for _ in 0..200 {
        if c.list("meta", "Namespaces.meta.cosi.dev", &Default::default())
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("stated did not become ready");
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let (s, st, r) = (
        d.path().join("s.sock"),
        d.path().join("state"),
        d.path().join("run"),
    );
    (d, s, st, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_write_load_loses_no_acknowledged_write() {
    let (_d, sock, state, run) = dirs();
    let mut s = Stated::start(&sock, &state, &run);
    let c = cosi::Client::new(&sock)
        .unwrap()
        .with_read_retry(Duration::from_secs(10));
    wait_ready(&c).await;

    let mut watch = c.watch(WatchSpec {
        namespace: "default".into(),
        r#type: T.into(),
        bootstrap: true,
        ..Default::default()
    });
    assert_eq!(next(&mut watch).await.kind, EventKind::Bootstrapped);

    // Four writers create resources as fast as they can and record what was acknowledged.
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (c, acked) = (c.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let id = format!("w{w}-{i}");
                match c.create(&res("default", T, &id, &id), "").await {
                    Ok(_) => acked.lock().unwrap().push(id),
                    Err(e) if e.is_unavailable() => return,
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.kill9();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "only {} writes before the kill",
        acked.len()
    );

    let _s2 = Stated::start(&sock, &state, &run);
    wait_ready(&c).await;
    let stored = c.list("default", T, &Default::default()).await.unwrap();
    let ids: std::collections::HashSet<String> =
        stored.iter().map(|r| r.metadata.id.clone()).collect();
    let lost: Vec<&String> = acked.iter().filter(|id| !ids.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    for r in &stored {
        assert_eq!(value(r), r.metadata.id, "spec intact");
    }

    // The watch from before the kill resumes by itself: everything acknowledged arrives, then
    // a write made after the restart.
    c.create(&res("default", T, "after", "after"), "")
        .await
        .unwrap();
    let mut seen = std::collections::HashSet::new();
    loop {
        let e = next(&mut watch).await;
        if e.kind == EventKind::Created {
            seen.insert(e.resource.metadata.id.clone());
        }
        if e.resource.metadata.id == "after" {
            break;
        }
    }
    assert!(
        acked.iter().all(|id| seen.contains(id)),
        "the resumed watch missed acknowledged writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_write_interrupted_by_kill9_is_old_or_new_after_reboot() {
    let (_d, sock, state, _) = dirs();
    let mut last_acked = 0u64;
    for round in 0..6u64 {
        // Each round is a new boot (fresh run dir) on the same state dir.
        let run = _d.path().join(format!("run{round}"));
        let mut s = Stated::start(&sock, &state, &run);
        let c = cosi::Client::new(&sock)
            .unwrap()
            .with_read_retry(Duration::from_secs(10));
        wait_ready(&c).await;
        let cur = match c.get("config", T, "v1alpha1").await {
            Ok(r) => Some(r),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("{e}"),
        };
        let mut attempted = last_acked;
        match &cur {
            Some(r) => {
                let v: u64 = value(r).parse().unwrap();
                // Old or new: what was acknowledged, or the one write in flight at the kill.
                assert!(
                    v == last_acked || v == last_acked + 1,
                    "round {round}: found {v}, last acked {last_acked}"
                );
                attempted = v;
            }
            None => assert_eq!(round, 0, "the durable namespace did not survive the reboot"),
        }
        let writer = {
            let c = c.clone();
            tokio::spawn(async move {
                let mut cur = cur;
                let mut acked = attempted;
                loop {
                    let n = acked + 1;
                    let result = match &cur {
                        None => {
                            c.create(&res("config", T, "v1alpha1", &n.to_string()), "")
                                .await
                        }
                        Some(r) => {
                            let mut r = r.clone();
                            r.spec = cosi::resource::encode_spec(&n.to_string()).unwrap();
                            c.update(&r, "", None).await
                        }
                    };
                    match result {
                        Ok(r) => {
                            cur = Some(r);
                            acked = n;
                        }
                        Err(e) if e.is_unavailable() || e.kind() == ErrorKind::Other => {
                            return acked
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(150 + 37 * round)).await;
        s.kill9();
        last_acked = writer.await.unwrap();
        assert!(last_acked > 0);
    }
}
