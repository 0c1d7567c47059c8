//! /etc/hosts, /etc/resolv.conf and /etc/hostname rendered as resources and written under a
//! temporary root.

mod controllers_support;

use controllers_support::{eventually, Node};
use ipnet::IpNet;
use machinery::resources::network::{
    AddressStatusSpec, EtcFileSpecSpec, EtcFileStatusSpec, Family, HostnameStatusSpec, Scope,
    StatusSpec, NAMESPACE,
};

const CONFIG: &str = r#"
version: v1alpha1
machine:
  network:
    nameservers: [10.0.0.53, 10.0.0.54, 10.0.0.55, 10.0.0.56]
    searchDomains: [corp.example]
    extraHostEntries:
      - {ip: 10.0.0.10, aliases: [registry.corp.example]}
      - {ip: 10.0.0.10, aliases: [mirror.corp.example]}
"#;

async fn file(node: &Node, name: &str, want: &str) {
    let path = node.etc_root.path().join("etc").join(name);
    eventually(&format!("{} = {want:?}", path.display()), || async {
        tokio::fs::read_to_string(&path)
            .await
            .ok()
            .filter(|c| c == want)
            .map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn etc_files_are_rendered_and_written() {
    let node = Node::start().await;
    node.physical_link("eth0", "52:54:00:00:00:01").await;
    let address: IpNet = "10.0.0.2/24".parse().expect("prefix");
    node.put(
        NAMESPACE,
        "eth0/10.0.0.2/24",
        AddressStatusSpec {
            address,
            local: Some(address.addr()),
            broadcast: None,
            anycast: None,
            multicast: None,
            link_index: 2,
            link_name: "eth0".into(),
            family: Family::Inet4,
            scope: Scope::Global,
            flags: Default::default(),
            priority: 0,
        },
    )
    .await;
    node.config(CONFIG).await;

    // Without a hostname only resolv.conf can be rendered.
    file(
        &node,
        "resolv.conf",
        "nameserver 10.0.0.53\nnameserver 10.0.0.54\nnameserver 10.0.0.55\n\nsearch corp.example\n",
    )
    .await;
    assert!(node
        .get::<EtcFileSpecSpec>(NAMESPACE, "hosts")
        .await
        .is_none());
    node.expect::<StatusSpec>(NAMESPACE, "status", |s| !s.etc_files_ready)
        .await;

    node.put(
        NAMESPACE,
        "hostname",
        HostnameStatusSpec {
            hostname: "node-1".into(),
            domainname: "example.com".into(),
        },
    )
    .await;
    file(
        &node,
        "hosts",
        "127.0.0.1 localhost\n\
         10.0.0.2  node-1.example.com node-1\n\
         ::1       localhost ip6-localhost ip6-loopback\n\
         ff02::1   ip6-allnodes\n\
         ff02::2   ip6-allrouters\n\
         10.0.0.10 registry.corp.example mirror.corp.example\n",
    )
    .await;
    file(&node, "hostname", "node-1\n").await;
    let spec = node
        .expect::<EtcFileSpecSpec>(NAMESPACE, "hosts", |_| true)
        .await;
    assert_eq!(spec.spec.mode, 0o644);
    node.expect::<EtcFileStatusSpec>(NAMESPACE, "hosts", |s| {
        s.spec_version == spec.metadata.version.to_string()
    })
    .await;
    node.expect::<StatusSpec>(NAMESPACE, "status", |s| s.etc_files_ready)
        .await;
    let mode = std::fs::metadata(node.etc_root.path().join("etc/hosts"))
        .expect("written")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o644
    );

    // A change of resolvers rewrites resolv.conf; the hostname's domain is a search domain.
    node.config(&CONFIG.replace("[10.0.0.53, 10.0.0.54, 10.0.0.55, 10.0.0.56]", "[9.9.9.9]"))
        .await;
    file(
        &node,
        "resolv.conf",
        "nameserver 9.9.9.9\n\nsearch corp.example example.com\n",
    )
    .await;

    // A file changed behind networkd's back is restored on the next change of its spec.
    std::fs::write(node.etc_root.path().join("etc/hostname"), "intruder\n").expect("write");
    node.put(
        NAMESPACE,
        "hostname",
        HostnameStatusSpec {
            hostname: "node-2".into(),
            domainname: "example.com".into(),
        },
    )
    .await;
    file(&node, "hostname", "node-2\n").await;
}
