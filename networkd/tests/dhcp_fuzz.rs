//! Property test of the DHCP reply parser: random, truncated and mutated packets go through the
//! whole parse path (decode, transaction match, option extraction, lease construction) for a
//! bounded number of iterations and time. Nothing may panic, not even inside the codec where the
//! decoder's guard would catch it; nothing malformed may yield a lease for another client or
//! transaction.
//!
//! Reproduce a failure with `DHCP_FUZZ_SEED=<seed printed on failure>`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::Encodable;
use networkd::dhcp::lease::Lease;
use networkd::dhcp::packet::{decode, parse_reply};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const XID: u32 = 0x1234_5678;
const ITERATIONS: usize = 200_000;
const TIME_BUDGET: Duration = Duration::from_secs(20);

/// A rich, valid ACK for our transaction: the seed the mutations start from.
fn valid_ack() -> Vec<u8> {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_xid(XID)
        .set_chaddr(&MAC)
        .set_yiaddr(Ipv4Addr::new(10, 0, 0, 5));
    let o = msg.opts_mut();
    o.insert(DhcpOption::MessageType(MessageType::Ack));
    o.insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 1)));
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
    msg.to_vec().expect("encode")
}

/// The whole path a received datagram takes in the client.
fn parse_path(bytes: &[u8]) {
    let _ = decode(bytes);
    if let Some(reply) = parse_reply(bytes, XID, &MAC) {
        // Only our transaction and our hardware address get through.
        let msg = decode(bytes).expect("a parsed reply decodes");
        assert_eq!(msg.xid(), XID);
        assert_eq!(msg.chaddr(), MAC);
        if reply.kind == MessageType::Ack {
            if let Some(lease) = Lease::from_ack("eth0", &reply, SystemTime::now()) {
                assert!(lease.prefix_len <= 32);
                assert!(lease.renewal <= lease.rebinding && lease.rebinding <= lease.lease_time);
            }
        }
    }
}

fn mutate(rng: &mut StdRng, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    if b.is_empty() {
        return b;
    }
    match rng.random_range(0..6) {
        // Flip a few random bytes.
        0 => {
            for _ in 0..rng.random_range(1..8) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
        }
        // Truncate.
        1 => b.truncate(rng.random_range(0..b.len())),
        // Corrupt the options area only (after the 240-byte fixed part), keeping the header ours.
        2 => {
            for _ in 0..rng.random_range(1..16) {
                let i = rng.random_range(240.min(b.len() - 1)..b.len());
                b[i] = rng.random();
            }
        }
        // Option lengths and codes: set a length byte to an extreme value.
        3 => {
            let i = rng.random_range(240.min(b.len() - 1)..b.len());
            b[i] = *[0u8, 1, 2, 3, 4, 5, 0x7f, 0x80, 0xfe, 0xff]
                .get(rng.random_range(0..10))
                .expect("in range");
        }
        // Append garbage.
        4 => {
            let n = rng.random_range(1..512);
            b.extend((0..n).map(|_| rng.random::<u8>()));
        }
        // Header fields: hlen, htype, opcode.
        _ => {
            let i = rng.random_range(0..4.min(b.len()));
            b[i] = rng.random();
        }
    }
    b
}

#[test]
fn malformed_packets_are_ignored_without_panic() {
    let seed: u64 = std::env::var("DHCP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("DHCP_FUZZ_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let base = valid_ack();
    assert!(
        parse_reply(&base, XID, &MAC).is_some(),
        "the seed packet parses"
    );

    // Count every panic, also those the decoder's own guard would catch: the codec must never
    // panic at all on what the sanitizer lets through.
    let panics = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = panics.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        default_hook(info);
    }));

    let started = Instant::now();
    let mut done = 0;
    let mut accepted = 0;
    while done < ITERATIONS && started.elapsed() < TIME_BUDGET {
        let bytes = match done % 4 {
            // Pure noise, of lengths around the 240-byte minimum.
            0 => {
                let n = rng.random_range(0..700);
                (0..n).map(|_| rng.random::<u8>()).collect()
            }
            // Noise behind a valid fixed part (our xid and MAC), so the option parser runs.
            1 => {
                let mut b = base[..240].to_vec();
                let n = rng.random_range(0..400);
                b.extend((0..n).map(|_| rng.random::<u8>()));
                b
            }
            // Mutations of a valid ACK, one or several rounds.
            _ => {
                let mut b = mutate(&mut rng, &base);
                for _ in 0..rng.random_range(0..3) {
                    if b.is_empty() {
                        break;
                    }
                    b = mutate(&mut rng, &b);
                }
                b
            }
        };
        let outcome = std::panic::catch_unwind(|| parse_path(&bytes));
        assert!(
            outcome.is_ok(),
            "parse path panicked on {} bytes (seed {seed}, iteration {done}): {bytes:02x?}",
            bytes.len()
        );
        if parse_reply(&bytes, XID, &MAC).is_some() {
            accepted += 1;
        }
        done += 1;
    }
    eprintln!(
        "{done} packets in {:?}, {accepted} still parsed as replies",
        started.elapsed()
    );
    assert!(done >= 10_000, "too few iterations ran: {done}");
    assert_eq!(
        panics.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the codec panicked (caught) on some input (seed {seed})"
    );
}
