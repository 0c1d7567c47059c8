//! Identity comes from the kernel: a process under another uid is held to the manifest whatever
//! owner string it sends. The test re-executes this test binary as the other uid.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use common::res;
use cosi::ErrorKind;
use stated::testing::Harness;

const MANIFEST: &str = r#"
namespaces:
  - {name: config, durable: true}
  - {name: network}
  - {name: runtime}
daemons:
  - {name: init, uid: 61001, writes: [runtime]}
  - {name: networkd, uid: 61002, writes: [network], reads: [config]}
"#;

const T: &str = "Things.test.talos.dev";

/// Runs `child_client` in a copy of this binary under `uid`; returns whether it passed.
fn run_as(uid: u32, socket: &std::path::Path, role: &str) -> bool {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_client",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STATED_TEST_SOCKET", socket)
        .env("STATED_TEST_ROLE", role)
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "child {role} as {uid}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.success() && stdout.contains("1 passed")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_writes_only_its_namespaces() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a client under other uids");
        return;
    }
    let h = Harness::start_with(Some(stated::Manifest::parse(MANIFEST).unwrap())).await;
    // Let other uids reach the socket (access is decided by peer credentials, not file modes).
    std::fs::set_permissions(h.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    h.client
        .create(&res("config", T, "cfg", "secret"), "")
        .await
        .unwrap();
    h.client
        .create(&res("runtime", T, "r", "x"), "init-controller")
        .await
        .unwrap();
    let socket = h.socket.clone();
    let results = tokio::task::spawn_blocking(move || {
        (
            run_as(61002, &socket, "networkd"),
            run_as(61099, &socket, "stranger"),
        )
    })
    .await
    .unwrap();
    assert!(results.0, "networkd child failed");
    assert!(results.1, "stranger child failed");
    // Nothing the children were refused got written.
    assert!(h
        .client
        .get("config", T, "from-networkd")
        .await
        .unwrap_err()
        .is_not_found());
    assert_eq!(
        cosi::resource::decode_spec::<String>(&h.client.get("runtime", T, "r").await.unwrap().spec)
            .unwrap(),
        "x"
    );
    // What networkd may write, it wrote.
    h.client.get("network", T, "eth0").await.unwrap();
}

/// The other side of the test above: runs only when re-executed with the environment set.
#[tokio::test]
#[ignore = "run by a_daemon_writes_only_its_namespaces under another uid"]
async fn child_client() {
    let Ok(socket) = std::env::var("STATED_TEST_SOCKET") else {
        return;
    };
    let role = std::env::var("STATED_TEST_ROLE").unwrap_or_default();
    let c = cosi::Client::new(socket).unwrap();
    match role.as_str() {
        "networkd" => {
            c.create(
                &res("network", T, "eth0", "up"),
                "network.LinkSpecController",
            )
            .await
            .unwrap();
            // Reads of config are allowed, writes are not, whatever owner it claims.
            c.get("config", T, "cfg").await.unwrap();
            let e = c
                .create(&res("config", T, "from-networkd", "x"), "")
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            // Another daemon's namespace: no read, no write, no destroy, even as its owner.
            assert_eq!(
                c.get("runtime", T, "r").await.unwrap_err().kind(),
                ErrorKind::PermissionDenied
            );
            let mut r = res("runtime", T, "r", "hijack");
            r.metadata.version = 1;
            let e = c.update(&r, "init-controller", None).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c
                .destroy("runtime", T, "r", "init-controller")
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            // meta: readable; defining types is allowed only for its own namespaces.
            c.list("meta", "Namespaces.meta.cosi.dev", &Default::default())
                .await
                .unwrap();
            let mine = cosi::ResourceDefinition::new("Links.net.talos.dev", "network");
            let theirs = cosi::ResourceDefinition::new("Services.v1alpha1.talos.dev", "runtime");
            for (def, ok) in [(mine, true), (theirs, false)] {
                let r = cosi::RawResource {
                    metadata: cosi::Metadata::new(
                        "meta",
                        "ResourceDefinitions.meta.cosi.dev",
                        def.id(),
                    ),
                    spec: cosi::resource::encode_spec(&def).unwrap(),
                    yaml_spec: String::new(),
                };
                let got = c.create(&r, "networkd").await;
                assert_eq!(got.is_ok(), ok, "{got:?}");
            }
            // An undeclared namespace is invalid on a node.
            let e = c.get("elsewhere", T, "x").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
        "stranger" => {
            let e = c.get("network", T, "eth0").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c
                .create(&res("network", T, "evil", "x"), "")
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        }
        other => panic!("unknown role {other}"),
    }
}
