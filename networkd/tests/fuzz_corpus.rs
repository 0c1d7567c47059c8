//! The fuzz targets `networkd_dhcp4` and `networkd_dhcp6` in the normal suite: their whole
//! corpora replay through `networkd::dhcp::packet::fuzz_reply` and
//! `networkd::dhcp6::packet::fuzz_reply` without a panic (not even one the decoder's guard
//! catches), and the seed packets (the replies of the DHCP tests: what dnsmasq sends, and the
//! client's own requests) come to the leases they should.
//!
//! `FUZZ_WRITE_SEEDS=1 cargo test -p networkd --test fuzz_corpus` (re)writes the seeds into
//! `fuzz/corpus/networkd_dhcp{4,6}/seed-*`.

use std::net::{Ipv4Addr, Ipv6Addr};

use dhcproto::Encodable;
use networkd::dhcp::packet as v4;
use networkd::dhcp6::packet as v6;

fn write_seed(target: &str, name: &str, data: &[u8]) {
    if std::env::var_os("FUZZ_WRITE_SEEDS").is_none() {
        return;
    }
    let dir = testkit::fuzz::fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), data).expect("seed written");
}

/// A server reply of `kind` to the fuzzed client, with the options a dnsmasq ACK carries.
fn reply4(kind: dhcproto::v4::MessageType, xid: u32, full: bool) -> Vec<u8> {
    use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_xid(xid)
        .set_chaddr(&v4::FUZZ_MAC);
    if kind != MessageType::Nak {
        msg.set_yiaddr(Ipv4Addr::new(10, 0, 0, 5));
    }
    let o = msg.opts_mut();
    o.insert(DhcpOption::MessageType(kind));
    o.insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 1)));
    if full {
        o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
        o.insert(DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 0, 1)]));
        o.insert(DhcpOption::ClasslessStaticRoute(vec![(
            ipnet::Ipv4Net::new(Ipv4Addr::new(192, 168, 0, 0), 16).expect("prefix"),
            Ipv4Addr::new(10, 0, 0, 254),
        )]));
        o.insert(DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
            10, 0, 0, 53,
        )]));
        o.insert(DhcpOption::DomainSearch(vec![
            "corp.example.".parse().expect("name"),
            "example.org.".parse().expect("name"),
        ]));
        o.insert(DhcpOption::Hostname("node-1".into()));
        o.insert(DhcpOption::DomainName("example.org".into()));
        o.insert(DhcpOption::NtpServers(vec![Ipv4Addr::new(10, 0, 0, 123)]));
        o.insert(DhcpOption::InterfaceMtu(1400));
        o.insert(DhcpOption::AddressLeaseTime(120));
        o.insert(DhcpOption::Renewal(60));
        o.insert(DhcpOption::Rebinding(105));
    }
    msg.to_vec().expect("encode")
}

#[test]
fn dhcp4_seeds_come_to_their_leases() {
    use dhcproto::v4::MessageType;
    let identity = v4::Identity {
        mac: v4::FUZZ_MAC.to_vec(),
        client_id: Some([&[1u8][..], &v4::FUZZ_MAC].concat()),
        request_hostname: true,
        send_hostname: None,
        request_mtu: true,
    };
    let discover = v4::build(
        &identity,
        v4::FUZZ_XID,
        0,
        v4::Request::Discover { previous: None },
    )
    .expect("discover");
    let ack = reply4(MessageType::Ack, v4::FUZZ_XID, true);
    let lease = v4::fuzz_reply(&ack).expect("the full ACK grants a lease");
    assert_eq!(lease.address, Ipv4Addr::new(10, 0, 0, 5));
    assert_eq!(lease.prefix_len, 24);
    assert_eq!(lease.hostname.as_deref(), Some("node-1"));
    let seeds: Vec<(&str, Vec<u8>, bool)> = vec![
        ("ack-full", ack.clone(), true),
        (
            "ack-minimal",
            reply4(MessageType::Ack, v4::FUZZ_XID, false),
            true,
        ),
        (
            "offer",
            reply4(MessageType::Offer, v4::FUZZ_XID, true),
            false,
        ),
        ("nak", reply4(MessageType::Nak, v4::FUZZ_XID, false), false),
        (
            "other-xid",
            reply4(MessageType::Ack, v4::FUZZ_XID + 1, true),
            false,
        ),
        ("truncated", ack[..100].to_vec(), false),
        ("discover", discover, false),
    ];
    for (name, data, leases) in seeds {
        assert_eq!(v4::fuzz_reply(&data).is_some(), leases, "seed {name}");
        write_seed("networkd_dhcp4", name, &data);
    }
}

/// A server message of `kind` to the fuzzed client, with the options of a dnsmasq REPLY.
fn reply6(
    kind: dhcproto::v6::MessageType,
    xid: u32,
    status: Option<dhcproto::v6::Status>,
) -> Vec<u8> {
    use dhcproto::v6::{
        DhcpOption, DhcpOptions, IAAddr, Message, NtpSuboption, OptionCode, StatusCode,
        UnknownOption, IANA,
    };
    let [_, a, b, c] = xid.to_be_bytes();
    let mut msg = Message::new_with_id(kind, [a, b, c]);
    let o = msg.opts_mut();
    o.insert(DhcpOption::ClientId(
        v6::duid_ll(&v6::FUZZ_MAC).expect("duid"),
    ));
    o.insert(DhcpOption::ServerId(vec![
        0, 1, 0, 1, 1, 2, 3, 4, 2, 0, 0, 0, 0, 2,
    ]));
    o.insert(DhcpOption::Preference(5));
    let mut ia = IANA {
        id: v6::FUZZ_IAID,
        t1: 60,
        t2: 105,
        opts: DhcpOptions::new(),
    };
    if let Some(status) = status {
        ia.opts.insert(DhcpOption::StatusCode(StatusCode {
            status,
            msg: "no".into(),
        }));
    } else {
        ia.opts.insert(DhcpOption::IAAddr(IAAddr {
            addr: "fd00:213::150".parse().expect("ip"),
            preferred_life: 120,
            valid_life: 120,
            opts: DhcpOptions::new(),
        }));
    }
    o.insert(DhcpOption::IANA(ia));
    o.insert(DhcpOption::DomainNameServers(vec!["fd00:213::53"
        .parse()
        .expect("ip")]));
    o.insert(DhcpOption::DomainSearchList(vec!["corp6.example."
        .parse()
        .expect("name")]));
    o.insert(DhcpOption::NtpServer(vec![NtpSuboption::ServerAddress(
        "fd00:213::123".parse().expect("ip"),
    )]));
    o.insert(DhcpOption::Unknown(UnknownOption::new(
        OptionCode::ClientFqdn,
        vec![0, 4, b'n', b'o', b'd', b'e', 3, b'o', b'r', b'g', 0],
    )));
    msg.to_vec().expect("encode")
}

#[test]
fn dhcp6_seeds_come_to_their_leases() {
    use dhcproto::v6::{MessageType, Status};
    let identity = v6::Identity {
        duid: v6::duid_ll(&v6::FUZZ_MAC).expect("duid"),
        iaid: v6::FUZZ_IAID,
        request_hostname: true,
    };
    let solicit = v6::build(
        &identity,
        v6::FUZZ_XID,
        0,
        &v6::Request::Solicit { previous: None },
    )
    .expect("solicit");
    let reply = reply6(MessageType::Reply, v6::FUZZ_XID, None);
    let lease = v6::fuzz_reply(&reply).expect("the REPLY grants a lease");
    assert_eq!(
        lease.address,
        "fd00:213::150".parse::<Ipv6Addr>().expect("ip")
    );
    assert_eq!(lease.fqdn.as_deref(), Some("node.org"));
    let seeds: Vec<(&str, Vec<u8>, bool)> = vec![
        ("reply", reply.clone(), true),
        (
            "advertise",
            reply6(MessageType::Advertise, v6::FUZZ_XID, None),
            true,
        ),
        (
            "no-addresses",
            reply6(MessageType::Reply, v6::FUZZ_XID, Some(Status::NoAddrsAvail)),
            false,
        ),
        (
            "other-xid",
            reply6(MessageType::Reply, v6::FUZZ_XID + 1, None),
            false,
        ),
        ("truncated", reply[..reply.len() / 2].to_vec(), false),
        ("solicit", solicit, false),
    ];
    for (name, data, leases) in seeds {
        assert_eq!(v6::fuzz_reply(&data).is_some(), leases, "seed {name}");
        write_seed("networkd_dhcp6", name, &data);
    }
}

#[test]
fn corpus_replays_without_panic() {
    testkit::fuzz::replay_crate(
        "networkd",
        &[
            ("networkd_dhcp4", &|data| {
                let _ = v4::fuzz_reply(data);
            }),
            ("networkd_dhcp6", &|data| {
                let _ = v6::fuzz_reply(data);
            }),
        ],
    );
}
