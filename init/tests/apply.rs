//! `machine.ApplyConfiguration` through apid on a real node (every daemon sandboxed under its
//! own uid; init is the config writer). An admin reads the configuration as apid serves it
//! (redacted), edits it and sends it back: the node keeps its own secrets where `******` stands.
//! Dry run, reader refused, every problem of a bad configuration listed with nothing written,
//! modes no-reboot, try (reverted at its timeout, or cancelled by a later apply, or ended by a
//! reboot), staged (active after a reboot), reboot refused. Needs root.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use init::testing::Node;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE, REDACTED_NAMESPACE};
use machinery::secrets::Bundle;
use machinery::tls;
use proto::machine::apply_configuration_request::Mode;
use proto::machine::machine_service_client::MachineServiceClient;
use proto::machine::{ApplyConfiguration, ApplyConfigurationRequest};
use serde_yaml_ng::Value;
use tonic::transport::Channel;
use tonic::Code;

const T: Duration = Duration::from_secs(60);
const API: &str = "127.0.0.1:50000";
const DAEMONS: &[&str] = &["stated", "networkd", "blockd", "secretsd", "trustd", "apid"];

fn channel(node: &Node, bundle: &Bundle, role: &str) -> Channel {
    let c = bundle
        .client_certificate(&[role.to_string()], SystemTime::now(), T * 100)
        .unwrap();
    let (crt, key) = c.pem().unwrap();
    let config =
        Arc::new(tls::client_config(&[bundle.os_ca().unwrap().0], Some((&crt, &key))).unwrap());
    let addr: SocketAddr = API.parse().unwrap();
    tls::channel_via(
        addr,
        "127.0.0.1",
        config,
        Duration::from_secs(5),
        node.dial(),
    )
    .unwrap()
}

/// Boots the node's network (the link the config names) and waits until apid answers.
async fn up(node: &Node, bundle: &Bundle) -> (Channel, Channel) {
    node.wait_healthy(DAEMONS, T).await;
    node.in_netns(&[
        "ip", "link", "add", "tap0", "type", "veth", "peer", "name", "tap1",
    ]);
    node.in_netns(&["ip", "link", "set", "tap0", "up"]);
    let admin = channel(node, bundle, "os:admin");
    let reader = channel(node, bundle, "os:reader");
    let end = Instant::now() + T;
    while let Err(e) = MachineServiceClient::new(admin.clone()).version(()).await {
        assert!(
            Instant::now() < end,
            "apid does not answer: {e:?}\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (admin, reader)
}

async fn apply(
    ch: &Channel,
    text: &str,
    mode: Mode,
    dry_run: bool,
    timeout: Option<Duration>,
) -> Result<ApplyConfiguration, tonic::Status> {
    let reply = MachineServiceClient::new(ch.clone())
        .apply_configuration(ApplyConfigurationRequest {
            data: text.as_bytes().to_vec(),
            mode: mode as i32,
            dry_run,
            try_mode_timeout: timeout.map(|t| prost_types::Duration {
                seconds: i64::try_from(t.as_secs()).unwrap(),
                nanos: 0,
            }),
            expected_version: 0,
        })
        .await?;
    Ok(reply.into_inner().messages.into_iter().next().unwrap())
}

/// The node's full configuration `id` (root, through stated's socket) and its version.
async fn full(node: &Node, id: &str) -> Option<(Value, u64)> {
    match node
        .state()
        .get_typed::<MachineConfigSpec>(NAMESPACE, id)
        .await
    {
        Ok(r) => Some((
            serde_yaml_ng::from_str(&r.spec.0).unwrap(),
            r.metadata.version,
        )),
        Err(e) if e.is_not_found() => None,
        Err(e) => panic!("{id}: {e}"),
    }
}

fn nameservers(config: &Value) -> Value {
    config["machine"]["network"]["nameservers"].clone()
}

fn with_nameserver(config: &Value, ns: &str) -> String {
    let mut c = config.clone();
    c["machine"]["network"]["nameservers"] = serde_yaml_ng::from_str(&format!("[{ns}]")).unwrap();
    serde_yaml_ng::to_string(&c).unwrap()
}

fn ns(list: &str) -> Value {
    serde_yaml_ng::from_str(list).unwrap()
}

async fn wait_active(node: &Node, what: &str, want: &Value) {
    let end = Instant::now() + T;
    loop {
        let (c, _) = full(node, ACTIVE_ID).await.unwrap();
        if nameservers(&c) == *want && full(node, "rollback").await.is_none() {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: nameservers {:?}, want {want:?}",
            nameservers(&c)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_configuration_through_apid_keeps_the_nodes_secrets_and_follows_every_mode() {
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let bundle = Bundle::from_yaml(support::UPSTREAM).unwrap();
    let original: Value =
        serde_yaml_ng::from_str(&support::control_plane(&bundle, "tap1", "172.20.97.2")).unwrap();
    let token = original["machine"]["token"].as_str().unwrap().to_string();
    let ca_key = original["machine"]["ca"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let mut node = Node::builder()
        .config(&serde_yaml_ng::to_string(&original).unwrap())
        .start();
    let (admin, reader) = up(&node, &bundle).await;

    // What an admin reads through apid: no secret.
    let redacted = cosi::Client::over(admin.clone(), "apid")
        .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
        .await
        .unwrap()
        .spec
        .0;
    assert!(!redacted.contains(&token) && !redacted.contains(&ca_key));
    let redacted: Value = serde_yaml_ng::from_str(&redacted).unwrap();
    assert_eq!(redacted["machine"]["token"], "******");
    let (_, v0) = full(&node, ACTIVE_ID).await.unwrap();

    // Dry run: the diff (of the redacted forms), nothing written.
    let edited = with_nameserver(&redacted, "10.9.9.9");
    let r = apply(&admin, &edited, Mode::Auto, true, None)
        .await
        .unwrap();
    assert_eq!(r.mode, Mode::NoReboot as i32, "{r:?}");
    assert!(
        r.mode_details.starts_with("Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:"),
        "{}",
        r.mode_details
    );
    assert!(
        r.mode_details.contains("+    - 10.9.9.9"),
        "{}",
        r.mode_details
    );
    assert!(!r.mode_details.contains(&token) && !r.mode_details.contains(&ca_key));
    assert_eq!(full(&node, ACTIVE_ID).await.unwrap().1, v0, "dry run wrote");

    // A reader may not; a bad configuration gets every problem and writes nothing; a
    // redacted value where the node has none is refused, named.
    let e = apply(&reader, &edited, Mode::Auto, false, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let mut bad = redacted.clone();
    bad["machine"]["bogusOne"] = Value::from(1);
    bad["cluster"]["bogusTwo"] = Value::from(2);
    let e = apply(
        &admin,
        &serde_yaml_ng::to_string(&bad).unwrap(),
        Mode::Auto,
        false,
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("machine.bogusOne") && e.message().contains("cluster.bogusTwo"),
        "{}",
        e.message()
    );
    let mut bad = redacted.clone();
    bad["machine"]["env"] = serde_yaml_ng::from_str("{SECRET: '******'}").unwrap();
    let e = apply(
        &admin,
        &serde_yaml_ng::to_string(&bad).unwrap(),
        Mode::Auto,
        false,
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("machine.env.SECRET"),
        "{}",
        e.message()
    );
    let e = apply(&admin, &edited, Mode::Reboot, false, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    assert_eq!(
        full(&node, ACTIVE_ID).await.unwrap().1,
        v0,
        "a refusal wrote"
    );

    // Applied: the change is there, and so are the node's own secrets.
    let r = apply(&admin, &edited, Mode::Auto, false, None)
        .await
        .unwrap();
    assert_eq!(
        r.mode_details,
        format!(
            "Applied configuration without a reboot (MachineConfig version {})",
            v0 + 1
        )
    );
    let (now, v1) = full(&node, ACTIVE_ID).await.unwrap();
    assert_eq!(v1, v0 + 1);
    assert_eq!(nameservers(&now), ns("[10.9.9.9]"));
    assert_eq!(now["machine"]["token"].as_str(), Some(token.as_str()));
    assert_eq!(now["machine"]["ca"]["key"].as_str(), Some(ca_key.as_str()));
    // The same again changes nothing.
    let r = apply(&admin, &edited, Mode::NoReboot, false, None)
        .await
        .unwrap();
    assert!(r.mode_details.ends_with("(no changes)"), "{r:?}");
    assert_eq!(full(&node, ACTIVE_ID).await.unwrap().1, v1);

    // Try: active now, the previous configuration back at the timeout.
    let r = apply(
        &admin,
        &with_nameserver(&redacted, "10.7.7.7"),
        Mode::Try,
        false,
        Some(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    assert!(
        r.mode_details
            .contains("applied in 'try' mode and will be automatically reverted back in 3s"),
        "{r:?}"
    );
    assert_eq!(
        nameservers(&full(&node, ACTIVE_ID).await.unwrap().0),
        ns("[10.7.7.7]")
    );
    let (rollback, _) = full(&node, "rollback").await.unwrap();
    assert_eq!(nameservers(&rollback), ns("[10.9.9.9]"));
    wait_active(&node, "the try's timeout", &ns("[10.9.9.9]")).await;
    // A try cancelled by a later apply: the later one stays.
    apply(
        &admin,
        &with_nameserver(&redacted, "10.6.6.6"),
        Mode::Try,
        false,
        Some(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    apply(
        &admin,
        &with_nameserver(&redacted, "10.5.5.5"),
        Mode::NoReboot,
        false,
        None,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    wait_active(&node, "a cancelled try", &ns("[10.5.5.5]")).await;

    // A try the node goes down during is over at the next boot.
    apply(
        &admin,
        &with_nameserver(&redacted, "10.4.4.4"),
        Mode::Try,
        false,
        Some(Duration::from_secs(600)),
    )
    .await
    .unwrap();
    node.reboot(T);
    node.wait_healthy(DAEMONS, T).await;
    wait_active(&node, "a try across a reboot", &ns("[10.5.5.5]")).await;

    // Staged: nothing changes until the next boot, which makes it active.
    let (admin, _) = up(&node, &bundle).await;
    let r = apply(
        &admin,
        &with_nameserver(&redacted, "10.3.3.3"),
        Mode::Staged,
        false,
        None,
    )
    .await
    .unwrap();
    assert!(
        r.mode_details
            .starts_with("Staged configuration to be applied after the next reboot"),
        "{r:?}"
    );
    let (active, v) = full(&node, ACTIVE_ID).await.unwrap();
    assert_eq!(nameservers(&active), ns("[10.5.5.5]"));
    let (staged, _) = full(&node, "staged").await.unwrap();
    assert_eq!(nameservers(&staged), ns("[10.3.3.3]"));
    assert_eq!(staged["machine"]["token"].as_str(), Some(token.as_str()));
    node.reboot(T);
    node.wait_healthy(DAEMONS, T).await;
    wait_active(&node, "the staged config after a reboot", &ns("[10.3.3.3]")).await;
    let (active, v2) = full(&node, ACTIVE_ID).await.unwrap();
    assert_eq!(v2, v + 1);
    assert_eq!(
        active["machine"]["ca"]["key"].as_str(),
        Some(ca_key.as_str())
    );
    assert!(full(&node, "staged").await.is_none());
}

/// The redacted copy as an admin reads it through apid, and the version it was made from.
async fn redacted_copy(admin: &Channel) -> (Value, u64) {
    let r = cosi::Client::over(admin.clone(), "apid")
        .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
        .await
        .unwrap();
    let v = machinery::resources::config::source_version(&r).expect("the copy names its source");
    (serde_yaml_ng::from_str(&r.spec.0).unwrap(), v)
}

async fn apply_on(
    ch: &Channel,
    text: &str,
    expected_version: u64,
) -> Result<ApplyConfiguration, tonic::Status> {
    let reply = MachineServiceClient::new(ch.clone())
        .apply_configuration(ApplyConfigurationRequest {
            data: text.as_bytes().to_vec(),
            mode: Mode::NoReboot as i32,
            expected_version,
            ..Default::default()
        })
        .await?;
    Ok(reply.into_inner().messages.into_iter().next().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_on_an_older_version_is_refused_not_applied_over_a_newer_one() {
    if !testkit::require_root("a node switches uids and makes namespaces") {
        return;
    }
    let bundle = Bundle::from_yaml(support::UPSTREAM).unwrap();
    let node = Node::builder()
        .config(&support::control_plane(&bundle, "tap1", "172.20.98.2"))
        .start();
    let (admin, _) = up(&node, &bundle).await;
    // Two administrators read the same configuration.
    let (read, v0) = redacted_copy(&admin).await;
    assert_eq!(full(&node, ACTIVE_ID).await.unwrap().1, v0);
    // The first applies its change, made on v0.
    apply_on(&admin, &with_nameserver(&read, "10.1.1.1"), v0)
        .await
        .unwrap();
    let v1 = full(&node, ACTIVE_ID).await.unwrap().1;
    assert!(v1 > v0);
    // The second's change, made on v0 too, would undo the first's: refused, both versions
    // named, nothing written.
    let e = apply_on(&admin, &with_nameserver(&read, "10.2.2.2"), v0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&format!("made on version {v0}"))
            && e.message().contains(&format!("the node has version {v1}")),
        "{}",
        e.message()
    );
    let (now, v) = full(&node, ACTIVE_ID).await.unwrap();
    assert_eq!((nameservers(&now), v), (ns("[10.1.1.1]"), v1));
    // Read again (the copy follows the new version), the change applies.
    let end = Instant::now() + T;
    let (read, v) = loop {
        let (c, v) = redacted_copy(&admin).await;
        if v == v1 {
            break (c, v);
        }
        assert!(Instant::now() < end, "the copy still says version {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(nameservers(&read), ns("[10.1.1.1]"));
    apply_on(&admin, &with_nameserver(&read, "10.2.2.2"), v)
        .await
        .unwrap();
    let (now, v2) = full(&node, ACTIVE_ID).await.unwrap();
    assert_eq!(nameservers(&now), ns("[10.2.2.2]"));
    // A change of a secret alone leaves the redacted text as it was, but not the version
    // the copy names: a change made on the copy read before it is refused too.
    let (mut secret, _) = full(&node, ACTIVE_ID).await.unwrap();
    secret["machine"]["token"] = Value::from("abcdef.0123456789abcdef");
    apply_on(&admin, &serde_yaml_ng::to_string(&secret).unwrap(), 0)
        .await
        .unwrap();
    let v3 = full(&node, ACTIVE_ID).await.unwrap().1;
    assert!(v3 > v2);
    let end = Instant::now() + T;
    while redacted_copy(&admin).await.1 != v3 {
        assert!(Instant::now() < end, "the copy never named version {v3}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = apply_on(&admin, &with_nameserver(&read, "10.3.3.3"), v2)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Without a version (an upstream client), no check, as upstream.
    apply_on(&admin, &with_nameserver(&read, "10.3.3.3"), 0)
        .await
        .unwrap();
}
