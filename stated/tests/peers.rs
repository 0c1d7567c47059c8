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
  - {name: block}
daemons:
  - {name: stated, broker: true, binary: /s, uid: 1990000010, gid: 1990000010, seccomp: stated}
  - {name: networkd, binary: /n, uid: 1990000011, gid: 1990000011, seccomp: networkd,
     writes: [network], reads: [config], defines: [net.talos.dev]}
  - {name: blockd, binary: /b, uid: 1990000012, gid: 1990000012, seccomp: blockd,
     writes: [block], defines: [block.talos.dev], reads: ["network/Links.net.talos.dev"]}
"#;

const NETWORKD: u32 = 1_990_000_011;
const BLOCKD: u32 = 1_990_000_012;
const STRANGER: u32 = 61_099;
const RD: &str = "ResourceDefinitions.meta.cosi.dev";

fn definition(def: &cosi::ResourceDefinition) -> cosi::RawResource {
    cosi::RawResource {
        metadata: cosi::Metadata::new("meta", RD, def.id()),
        spec: cosi::resource::encode_spec(def).unwrap(),
        yaml_spec: String::new(),
    }
}

const T: &str = "Things.test.talos.dev";
const LINKS: &str = "Links.net.talos.dev";

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
    if !testkit::require_root("it runs clients under other uids") {
        return;
    }
    let h = Harness::start_with(Some(stated::Manifest::parse_substituted(MANIFEST).unwrap())).await;
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
    h.client
        .create(&res("network", LINKS, "lo", "up"), "")
        .await
        .unwrap();
    let socket = h.socket.clone();
    let results = tokio::task::spawn_blocking(move || {
        (
            run_as(NETWORKD, &socket, "networkd"),
            run_as(STRANGER, &socket, "stranger"),
            run_as(BLOCKD, &socket, "one-type-reader"),
        )
    })
    .await
    .unwrap();
    assert!(results.0, "networkd child failed");
    assert!(results.1, "stranger child failed");
    assert!(results.2, "blockd (one type of network) child failed");
    // Nothing the children were refused got written.
    for (ns, id) in [
        ("config", "from-networkd"),
        ("config", "from-networkd-batch"),
        ("network", "evil-batch"),
    ] {
        assert!(h.client.get(ns, T, id).await.unwrap_err().is_not_found());
    }
    assert!(h
        .client
        .get("meta", RD, "mounts.block.talos.dev")
        .await
        .unwrap_err()
        .is_not_found());
    h.client.get("network", T, "batch-ok").await.unwrap();
    assert_eq!(
        cosi::resource::decode_spec::<String>(&h.client.get("runtime", T, "r").await.unwrap().spec)
            .unwrap(),
        "x"
    );
    // What networkd may write, it wrote.
    h.client.get("network", T, "eth0").await.unwrap();
}

const CLIENT_REQUESTS: &str = "ClientCertificateRequests.apid.talos.dev";
const CLIENT_CERTIFICATES: &str = "ClientCertificates.secrets.talos.dev";
const CLIENT_OWNER: &str = "apid.GenerateClientConfiguration";

/// secretsd signs, with the OS CA, whatever CSR is in `apid/ClientCertificateRequests`: with
/// the node's own manifest, only apid's uid may write there (another daemon is refused
/// whatever owner it names), and only apid and secretsd read the answers. With the same
/// manifest none of networkd, trustd, secretsd and apid may write a VIP election (k8sd's).
#[tokio::test(flavor = "multi_thread")]
async fn with_the_shipped_manifest_only_apid_asks_secretsd_for_client_certificates() {
    if !testkit::require_root("it runs clients under other uids") {
        return;
    }
    let paths = machinery::manifest::Paths {
        root: "/".into(),
        bin: "/bin".into(),
    };
    let manifest =
        stated::Manifest::parse(include_str!("../../rootfs/etc/daemons.yaml"), &paths).unwrap();
    let h = Harness::start_with(Some(manifest)).await;
    std::fs::set_permissions(h.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    h.client
        .define_types(&machinery::resources::definitions(), "")
        .await
        .unwrap();
    let socket = h.socket.clone();
    let (networkd, trustd, secretsd, apid) = tokio::task::spawn_blocking(move || {
        (
            run_as(1_990_000_011, &socket, "ask-for-a-client-certificate"),
            run_as(1_990_000_013, &socket, "ask-for-a-client-certificate"),
            run_as(
                1_990_000_012,
                &socket,
                "ask-for-a-client-certificate-as-signer",
            ),
            run_as(1_990_000_014, &socket, "apid-asks"),
        )
    })
    .await
    .unwrap();
    assert!(networkd, "networkd's uid");
    assert!(trustd, "trustd's uid");
    assert!(secretsd, "secretsd's uid");
    assert!(apid, "apid's uid");
    let requests = h
        .client
        .list("apid", CLIENT_REQUESTS, &cosi::Query::default())
        .await
        .unwrap();
    let ids: Vec<&str> = requests.iter().map(|r| r.metadata.id.as_str()).collect();
    assert_eq!(ids, vec!["real"], "only apid's request is there");
}

/// The other side of the tests above: runs only when re-executed with the environment set.
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
            // meta: readable; defining types is allowed only for its own namespaces and groups.
            c.list("meta", "Namespaces.meta.cosi.dev", &Default::default())
                .await
                .unwrap();
            let mine = cosi::ResourceDefinition::new("Links.net.talos.dev", "network");
            let theirs = cosi::ResourceDefinition::new("Services.v1alpha1.talos.dev", "runtime");
            for (def, ok) in [(mine, true), (theirs, false)] {
                let got = c.create(&definition(&def), "networkd").await;
                assert_eq!(got.is_ok(), ok, "{got:?}");
            }
            // An undeclared namespace is invalid on a node.
            let e = c.get("elsewhere", T, "x").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            // A batch is held to the same rules, write by write: what networkd may write is
            // done, everything else refused, whatever owner it names.
            let mut hijack = res("runtime", T, "r", "hijack");
            hijack.metadata.version = 1;
            let theirs = cosi::ResourceDefinition::new("Mounts.block.talos.dev", "block");
            let results = c
                .write_batch(vec![
                    cosi::BatchWrite::Create {
                        resource: res("network", T, "batch-ok", "x"),
                        owner: "network.LinkSpecController".into(),
                    },
                    cosi::BatchWrite::Create {
                        resource: res("config", T, "from-networkd-batch", "x"),
                        owner: "".into(),
                    },
                    cosi::BatchWrite::Update {
                        resource: hijack,
                        owner: "init-controller".into(),
                        expected_phase: None,
                    },
                    cosi::BatchWrite::Destroy {
                        namespace: "runtime".into(),
                        r#type: T.into(),
                        id: "r".into(),
                        owner: "init-controller".into(),
                    },
                    cosi::BatchWrite::Create {
                        resource: definition(&theirs),
                        owner: "blockd".into(),
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
                    Some(ErrorKind::PermissionDenied),
                    Some(ErrorKind::PermissionDenied),
                    Some(ErrorKind::PermissionDenied),
                    Some(ErrorKind::PermissionDenied),
                ],
                "{results:?}"
            );
            let done = results[0].as_ref().unwrap().as_ref().unwrap();
            assert_eq!(done.metadata.owner, "network.LinkSpecController");
        }
        "stranger" => {
            let e = c.get("network", T, "eth0").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let results = c
                .write_batch(vec![cosi::BatchWrite::Create {
                    resource: res("network", T, "evil-batch", "x"),
                    owner: "".into(),
                }])
                .await
                .unwrap();
            let e = results[0].as_ref().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c
                .create(&res("network", T, "evil", "x"), "")
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        }
        "one-type-reader" => {
            // blockd may read network's Links, and nothing else of network: not another type,
            // not by get, list or watch.
            c.get("network", LINKS, "lo").await.unwrap();
            assert_eq!(
                c.list("network", LINKS, &Default::default())
                    .await
                    .unwrap()
                    .len(),
                1
            );
            let mut w = c.watch(cosi::client::WatchSpec {
                namespace: "network".into(),
                r#type: LINKS.into(),
                id: None,
                bootstrap: true,
                bootstrap_bookmark: false,
                tail_events: 0,
                start_from_bookmark: None,
                query: Default::default(),
                omit_old: false,
            });
            assert!(w.next().await.unwrap().is_ok());
            let e = c.get("network", T, "eth0").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c.list("network", T, &Default::default()).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let mut w = c.watch(cosi::client::WatchSpec {
                namespace: "network".into(),
                r#type: T.into(),
                id: None,
                bootstrap: true,
                bootstrap_bookmark: false,
                tail_events: 0,
                start_from_bookmark: None,
                query: Default::default(),
                omit_old: false,
            });
            let e = w.next().await.unwrap().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c
                .create(&res("network", LINKS, "evil", "x"), "")
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c.get("config", T, "cfg").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        }
        "hijack-networkd" => hijack_as_networkd(&c).await,
        "ask-for-a-client-certificate" => {
            forge_a_vip_election(&c).await;
            // Any daemon but apid: refused, whatever owner it names; and no daemon but apid
            // (and secretsd, which signs them) reads the answers.
            let e = c
                .create(&res("apid", CLIENT_REQUESTS, "forged", "x"), CLIENT_OWNER)
                .await
                .expect_err("a request in apid's namespace");
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            let e = c
                .list("secrets", CLIENT_CERTIFICATES, &cosi::Query::default())
                .await
                .expect_err("secretsd's answers");
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        }
        "ask-for-a-client-certificate-as-signer" => {
            forge_a_vip_election(&c).await;
            // secretsd reads the requests and writes the answers, but writes no request.
            let e = c
                .create(&res("apid", CLIENT_REQUESTS, "forged", "x"), CLIENT_OWNER)
                .await
                .expect_err("a request in apid's namespace");
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
            c.list("apid", CLIENT_REQUESTS, &cosi::Query::default())
                .await
                .unwrap();
        }
        "apid-asks" => {
            forge_a_vip_election(&c).await;
            c.create(&res("apid", CLIENT_REQUESTS, "real", "x"), CLIENT_OWNER)
                .await
                .unwrap();
            // apid reads secretsd's answers (none yet), not the CA key beside them.
            c.list("secrets", CLIENT_CERTIFICATES, &cosi::Query::default())
                .await
                .unwrap();
            let e = c
                .get("secrets", "OSRootSecrets.secrets.talos.dev", "os")
                .await
                .expect_err("the OS root");
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        }
        "hijack-blockd" => hijack_as_blockd(&c).await,
        other => panic!("unknown role {other}"),
    }
}

/// A daemon other than k8sd claims a shared IP for networkd to assign (`vip/VIPElections`,
/// networkd's only input of it): refused, whatever owner it names.
async fn forge_a_vip_election(c: &cosi::Client) {
    let e = c
        .create(
            &res("vip", "VIPElections.etcd.talos.dev", "10.5.0.200", "x"),
            "etcd.VIPController",
        )
        .await
        .expect_err("a VIP election written by another daemon than k8sd");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
}

/// networkd (kernel-verified uid) tries to take types that are not its own.
async fn hijack_as_networkd(c: &cosi::Client) {
    let denied = |r: Result<cosi::RawResource, cosi::StateError>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{what}: {e}");
    };
    // stated's own definition of namespaces, re-pointed at networkd's namespace, sent with
    // stated's owner string: refused.
    let mut ns = c.get("meta", RD, "namespaces.meta.cosi.dev").await.unwrap();
    let mut def: cosi::ResourceDefinition = cosi::resource::decode_spec(&ns.spec).unwrap();
    def.default_namespace = "network".into();
    ns.spec = cosi::resource::encode_spec(&def).unwrap();
    denied(
        c.update(&ns, "stated", None).await,
        "update stated's definition",
    );
    // The machine config's definition (registered by init), re-pointed: refused.
    let mut mc = c
        .get("meta", RD, "machineconfigs.config.talos.dev")
        .await
        .unwrap();
    let mut def: cosi::ResourceDefinition = cosi::resource::decode_spec(&mc.spec).unwrap();
    def.default_namespace = "network".into();
    mc.spec = cosi::resource::encode_spec(&def).unwrap();
    denied(
        c.update(&mc, &mc.metadata.owner.clone(), None).await,
        "update init's definition",
    );
    // A type of another group, even one nobody defined yet, in its own namespace: refused.
    let plant = cosi::ResourceDefinition::new("KernelModules.runtime.talos.dev", "network");
    denied(
        c.create(&definition(&plant), "").await,
        "type of another group",
    );
    // Its own group, but an alias another owner's type has: refused.
    let alias = cosi::ResourceDefinition::new("Plants.net.talos.dev", "network")
        .with_aliases(&["machineconfig"]);
    denied(
        c.create(&definition(&alias), "").await,
        "alias of another type",
    );
    // Its own type: created, owned by networkd whatever owner string is sent, and updatable.
    let own = cosi::ResourceDefinition::new("HostnameStatuses.net.talos.dev", "network")
        .with_aliases(&["hostname"]);
    let created = c.create(&definition(&own), "anything").await.unwrap();
    assert_eq!(created.metadata.owner, "networkd");
    let mut again = created.clone();
    let mut def = own.clone();
    def.print_columns.clear();
    def = def.with_columns(&[("Hostname", "{.hostname}")]);
    again.spec = cosi::resource::encode_spec(&def).unwrap();
    c.update(&again, "anything", None).await.unwrap();
    // Another type of its own that takes a name of its first one: refused too (a name names
    // one type, whoever owns both: `talosctl get hostname` would be ambiguous), beside a
    // second type of its own with names of its own, which is created.
    let twin = cosi::ResourceDefinition::new("HostnameTwins.net.talos.dev", "network")
        .with_aliases(&["hostname"]);
    let e = c.create(&definition(&twin), "").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(
        e.message().contains("HostnameStatuses.net.talos.dev"),
        "{e}"
    );
    let display = cosi::ResourceDefinition {
        display_type: "HostnameStatus".into(),
        ..cosi::ResourceDefinition::new("HostnameTwins.net.talos.dev", "network")
    };
    denied(
        c.create(&definition(&display), "").await,
        "another type's display name",
    );
    let second = cosi::ResourceDefinition::new("HostnameTwins.net.talos.dev", "network");
    c.create(&definition(&second), "").await.unwrap();
    // And the first may not take the second's names on an update either.
    let mut first = c
        .get("meta", RD, "hostnamestatuses.net.talos.dev")
        .await
        .unwrap();
    first.spec = cosi::resource::encode_spec(&own.clone().with_aliases(&["hostnametwin"])).unwrap();
    denied(
        c.update(&first, "", None).await,
        "update taking a sibling's name",
    );
}

/// Another daemon tries to take networkd's names and definitions.
async fn hijack_as_blockd(c: &cosi::Client) {
    let e = c
        .create(
            &definition(
                &cosi::ResourceDefinition::new("Disks.block.talos.dev", "block")
                    .with_aliases(&["hostname"]),
            ),
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(
        e.message().contains("HostnameStatuses.net.talos.dev"),
        "{e}"
    );
    let mut hs = c
        .get("meta", RD, "hostnamestatuses.net.talos.dev")
        .await
        .unwrap();
    hs.spec = cosi::resource::encode_spec(&cosi::ResourceDefinition::new(
        "HostnameStatuses.net.talos.dev",
        "block",
    ))
    .unwrap();
    let e = c.update(&hs, "networkd", None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    let e = c
        .destroy("meta", RD, "hostnamestatuses.net.talos.dev", "networkd")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    // Its own type, with its own names, is fine.
    c.create(
        &definition(&cosi::ResourceDefinition::new(
            "Disks.block.talos.dev",
            "block",
        )),
        "",
    )
    .await
    .unwrap();
}

/// DESIGN.md §2: type definitions are ownership. No daemon can change a definition it did not
/// create, define a type of another group or namespace, or take another owner's names: so
/// `talosctl get machineconfig` cannot be made to show a resource a daemon planted.
#[tokio::test(flavor = "multi_thread")]
async fn no_daemon_can_take_another_ones_types() {
    if !testkit::require_root("it runs clients under other uids") {
        return;
    }
    let h = Harness::start_with(Some(stated::Manifest::parse_substituted(MANIFEST).unwrap())).await;
    std::fs::set_permissions(h.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mc = cosi::ResourceDefinition::new("MachineConfigs.config.talos.dev", "config");
    h.client.create(&definition(&mc), "init").await.unwrap();
    let socket = h.socket.clone();
    let results = tokio::task::spawn_blocking(move || {
        (
            run_as(NETWORKD, &socket, "hijack-networkd"),
            run_as(BLOCKD, &socket, "hijack-blockd"),
        )
    })
    .await
    .unwrap();
    assert!(results.0, "networkd's attempts were not all refused");
    assert!(results.1, "blockd's attempts were not all refused");
    // What the admin sees is what the owners wrote.
    let defs = h
        .client
        .list("meta", RD, &Default::default())
        .await
        .unwrap();
    let get = |id: &str| {
        let r = defs.iter().find(|r| r.metadata.id == id).unwrap();
        let d: cosi::ResourceDefinition = cosi::resource::decode_spec(&r.spec).unwrap();
        (r.metadata.owner.clone(), d.default_namespace)
    };
    assert_eq!(
        get("machineconfigs.config.talos.dev"),
        ("init".into(), "config".into())
    );
    assert_eq!(
        get("namespaces.meta.cosi.dev"),
        ("stated".into(), "meta".into())
    );
    assert_eq!(
        get("hostnamestatuses.net.talos.dev"),
        ("networkd".into(), "network".into())
    );
    assert!(
        !defs
            .iter()
            .any(|r| r.metadata.id.starts_with("kernelmodules")
                || r.metadata.id.starts_with("plants"))
    );
}
