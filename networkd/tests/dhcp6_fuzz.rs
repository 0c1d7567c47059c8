//! Property test of the DHCPv6 reply parser: random, truncated and mutated packets go through
//! the whole parse path (sanitize, decode, transaction and client match, IA_NA and option
//! extraction, lease construction) for a bounded number of iterations and time. Nothing may
//! panic, not even inside the codec where the decoder's guard would catch it; nothing may yield
//! a lease for another client or transaction.
//!
//! Reproduce a failure with `DHCP6_FUZZ_SEED=<seed printed on failure>`.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant, SystemTime};

use dhcproto::v6::{
    DhcpOption, IAAddr, Message, MessageType, NtpSuboption, OptionCode, Status, StatusCode,
    UnknownOption, IANA,
};
use dhcproto::Encodable;
use networkd::dhcp6::lease::Lease;
use networkd::dhcp6::packet::{decode, duid_ll, parse_reply, Identity};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const XID: u32 = 0x00ab_cdef;
const ITERATIONS: usize = 200_000;
const TIME_BUDGET: Duration = Duration::from_secs(20);

fn identity() -> Identity {
    Identity {
        duid: duid_ll(&[2, 0, 0, 0, 0, 1]).expect("duid"),
        iaid: 7,
        request_hostname: true,
    }
}

/// A rich, valid REPLY for our transaction: the seed the mutations start from.
fn valid_reply() -> Vec<u8> {
    let mut msg = Message::new_with_id(MessageType::Reply, [0xab, 0xcd, 0xef]);
    let o = msg.opts_mut();
    o.insert(DhcpOption::ClientId(identity().duid));
    o.insert(DhcpOption::ServerId(vec![
        0, 1, 0, 1, 1, 2, 3, 4, 2, 0, 0, 0, 0, 2,
    ]));
    o.insert(DhcpOption::Preference(5));
    let mut addr_opts = dhcproto::v6::DhcpOptions::new();
    addr_opts.insert(DhcpOption::StatusCode(StatusCode {
        status: Status::Success,
        msg: "ok".into(),
    }));
    let mut ia = IANA {
        id: identity().iaid,
        t1: 60,
        t2: 105,
        opts: dhcproto::v6::DhcpOptions::new(),
    };
    ia.opts.insert(DhcpOption::IAAddr(IAAddr {
        addr: "fd00:213::150".parse().expect("ip"),
        preferred_life: 120,
        valid_life: 120,
        opts: addr_opts,
    }));
    o.insert(DhcpOption::IANA(ia));
    o.insert(DhcpOption::StatusCode(StatusCode {
        status: Status::Success,
        msg: "all fine".into(),
    }));
    o.insert(DhcpOption::DomainNameServers(vec![
        "fd00:213::53".parse().expect("ip"),
        "fd00:213::54".parse().expect("ip"),
    ]));
    o.insert(DhcpOption::DomainSearchList(vec![
        "corp6.example.".parse().expect("name"),
        "example.org.".parse().expect("name"),
    ]));
    o.insert(DhcpOption::NtpServer(vec![NtpSuboption::ServerAddress(
        "fd00:213::123".parse().expect("ip"),
    )]));
    o.insert(DhcpOption::Unknown(UnknownOption::new(
        OptionCode::ClientFqdn,
        vec![0, 4, b'n', b'o', b'd', b'e', 3, b'o', b'r', b'g', 0],
    )));
    msg.to_vec().expect("encode")
}

/// The whole path a received datagram takes in the client.
fn parse_path(bytes: &[u8]) {
    let _ = decode(bytes);
    let id = identity();
    if let Some(reply) = parse_reply(bytes, XID, &id) {
        // Only our transaction and our client ID get through.
        let msg = decode(bytes).expect("a parsed reply decodes");
        assert_eq!(msg.xid_num(), XID);
        assert!(matches!(
            msg.opts().get(OptionCode::ClientId),
            Some(DhcpOption::ClientId(d)) if *d == id.duid
        ));
        let _ = reply.failure();
        if let Some(a) = reply.address() {
            assert!(a.valid > 0 && a.preferred <= a.valid);
            assert!(!a.address.is_unspecified() && !a.address.is_multicast());
        }
        if let Some(lease) = Lease::from_reply("eth0", &id, &reply, SystemTime::now()) {
            assert!(lease.renewal <= lease.rebinding);
            assert!(lease.rebinding <= lease.valid_lifetime);
            assert_ne!(lease.address, Ipv6Addr::UNSPECIFIED);
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
        // Corrupt the options only, keeping the header ours.
        2 => {
            for _ in 0..rng.random_range(1..16) {
                let i = rng.random_range(4.min(b.len() - 1)..b.len());
                b[i] = rng.random();
            }
        }
        // Option lengths: set a length byte to an extreme value.
        3 => {
            let i = rng.random_range(4.min(b.len() - 1)..b.len());
            b[i] = *[0u8, 1, 2, 3, 4, 12, 16, 24, 0x7f, 0x80, 0xfe, 0xff]
                .get(rng.random_range(0..12))
                .expect("in range");
        }
        // Append garbage.
        4 => {
            let n = rng.random_range(1..512);
            b.extend((0..n).map(|_| rng.random::<u8>()));
        }
        // The message type.
        _ => b[0] = rng.random(),
    }
    b
}

#[test]
fn malformed_dhcpv6_packets_are_ignored_without_panic() {
    let seed: u64 = std::env::var("DHCP6_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("DHCP6_FUZZ_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let base = valid_reply();
    let parsed = parse_reply(&base, XID, &identity()).expect("the seed packet parses");
    assert!(parsed.address().is_some(), "the seed packet has an address");
    assert_eq!(parsed.options.fqdn.as_deref(), Some("node.org"));

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
            // Pure noise.
            0 => {
                let n = rng.random_range(0..600);
                (0..n).map(|_| rng.random::<u8>()).collect()
            }
            // Noise behind a valid header (a REPLY of our transaction), so the option parser
            // runs.
            1 => {
                let mut b = base[..4].to_vec();
                let n = rng.random_range(0..400);
                b.extend((0..n).map(|_| rng.random::<u8>()));
                b
            }
            // Mutations of a valid REPLY, one or several rounds.
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
        if parse_reply(&bytes, XID, &identity()).is_some() {
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
