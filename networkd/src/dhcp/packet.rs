//! DHCPv4 messages: building the client's requests and parsing the server's replies with
//! `dhcproto`. Parsing never panics and never trusts a field: whatever does not decode, belongs to
//! another transaction or lacks what its type requires is `None`.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};

/// The largest DHCP message we accept (and announce in option 57).
pub const MAX_MESSAGE: u16 = 1500;

/// What the client says about itself in every message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The link's hardware address (`chaddr`), at most 16 bytes.
    pub mac: Vec<u8>,
    /// Option 61, if any (`0x01` + MAC for the `mac` client identifier).
    pub client_id: Option<Vec<u8>>,
    /// Ask for options 12 (hostname) and 15 (domain name).
    pub request_hostname: bool,
    /// Send this hostname (option 12) instead; never together with `request_hostname`.
    pub send_hostname: Option<String>,
    /// Ask for option 26 (interface MTU).
    pub request_mtu: bool,
}

/// The kind of a client message, with what it carries besides the identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// DHCPDISCOVER, with the address we had before (option 50), if any.
    Discover {
        /// Requested address.
        previous: Option<Ipv4Addr>,
    },
    /// DHCPREQUEST in SELECTING state: the offered address (50) from this server (54).
    Select {
        /// Offered address.
        address: Ipv4Addr,
        /// Server identifier of the offer.
        server: Ipv4Addr,
    },
    /// DHCPREQUEST in RENEWING (unicast) or REBINDING (broadcast) state: `ciaddr` set, no 50/54.
    Extend {
        /// Leased address.
        address: Ipv4Addr,
    },
    /// DHCPRELEASE of `address` to `server`.
    Release {
        /// Leased address.
        address: Ipv4Addr,
        /// Server identifier.
        server: Ipv4Addr,
    },
}

/// Encodes a client message.
///
/// # Errors
///
/// A `dhcproto` encoding error (only for values out of the protocol's range, e.g. a hostname
/// longer than 255 bytes).
pub fn build(
    identity: &Identity,
    xid: u32,
    secs: u16,
    request: Request,
) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(xid)
        .set_secs(secs)
        .set_chaddr(&identity.mac);
    let (kind, broadcast) = match request {
        Request::Discover { .. } => (MessageType::Discover, true),
        Request::Select { .. } => (MessageType::Request, true),
        Request::Extend { address } => {
            msg.set_ciaddr(address);
            (MessageType::Request, false)
        }
        Request::Release { address, .. } => {
            msg.set_ciaddr(address);
            (MessageType::Release, false)
        }
    };
    // Without an address the reply cannot be unicast to us: ask for broadcast replies, so a
    // plain UDP socket receives them (see `socket`).
    if broadcast {
        msg.set_flags(Flags::default().set_broadcast());
    }
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    if let Some(id) = &identity.client_id {
        opts.insert(DhcpOption::ClientIdentifier(id.clone()));
    }
    match request {
        Request::Discover {
            previous: Some(prev),
        } => {
            opts.insert(DhcpOption::RequestedIpAddress(prev));
        }
        Request::Select { address, server } => {
            opts.insert(DhcpOption::RequestedIpAddress(address));
            opts.insert(DhcpOption::ServerIdentifier(server));
        }
        Request::Release { server, .. } => {
            opts.insert(DhcpOption::ServerIdentifier(server));
        }
        _ => {}
    }
    if !matches!(request, Request::Release { .. }) {
        opts.insert(DhcpOption::MaxMessageSize(MAX_MESSAGE));
        opts.insert(DhcpOption::ParameterRequestList(parameters(identity)));
        if let Some(h) = &identity.send_hostname {
            opts.insert(DhcpOption::Hostname(h.clone()));
        }
    }
    msg.to_vec()
}

/// The parameter request list (option 55), as upstream: subnet, router, DNS, domain search, NTP,
/// classless routes, lease times; MTU and hostname/domain when asked.
fn parameters(identity: &Identity) -> Vec<OptionCode> {
    let mut p = vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
        OptionCode::DomainName,
        OptionCode::DomainSearch,
        OptionCode::NtpServers,
        OptionCode::ClasslessStaticRoute,
        OptionCode::AddressLeaseTime,
        OptionCode::Renewal,
        OptionCode::Rebinding,
    ];
    if identity.request_mtu {
        p.push(OptionCode::InterfaceMtu);
    }
    if identity.request_hostname && identity.send_hostname.is_none() {
        p.push(OptionCode::Hostname);
    }
    p
}

/// A server reply of our transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// OFFER, ACK or NAK.
    pub kind: MessageType,
    /// The offered or leased address (`yiaddr`).
    pub address: Ipv4Addr,
    /// Option 54 (required in OFFER and ACK).
    pub server: Option<Ipv4Addr>,
    /// The options that matter to the lease.
    pub options: LeaseOptions,
}

/// The options of an OFFER or ACK that a lease uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Option 1.
    pub subnet_mask: Option<Ipv4Addr>,
    /// Option 3.
    pub routers: Vec<Ipv4Addr>,
    /// Option 121: (destination, prefix length, gateway), destinations masked.
    pub classless_routes: Vec<(Ipv4Addr, u8, Ipv4Addr)>,
    /// Option 6.
    pub dns: Vec<Ipv4Addr>,
    /// Option 119.
    pub search: Vec<String>,
    /// Option 12, trailing NULs trimmed.
    pub hostname: Option<String>,
    /// Option 15, trailing NULs and dots trimmed.
    pub domain: Option<String>,
    /// Option 42.
    pub ntp: Vec<Ipv4Addr>,
    /// Option 26.
    pub mtu: Option<u16>,
    /// Option 51 (seconds).
    pub lease_time: Option<u32>,
    /// Option 58 (seconds).
    pub renewal: Option<u32>,
    /// Option 59 (seconds).
    pub rebinding: Option<u32>,
}

/// The BOOTP fixed part, up to and including the magic cookie.
const FIXED_LEN: usize = 240;
/// The DHCP magic cookie (RFC 2131 §3).
const MAGIC: [u8; 4] = [99, 130, 83, 99];

/// Options a reply may carry that the client reads, with their allowed lengths: `Some(n)` exactly
/// `n` bytes (first occurrence only), `None` any non-zero length (long options split across
/// occurrences are concatenated by the codec, RFC 3396).
const KEPT_OPTIONS: &[(u8, Option<usize>)] = &[
    (1, Some(4)),  // subnet mask
    (3, None),     // routers
    (6, None),     // DNS
    (12, None),    // hostname
    (15, None),    // domain name
    (26, Some(2)), // interface MTU
    (42, None),    // NTP servers
    (51, Some(4)), // lease time
    (53, Some(1)), // message type
    (54, Some(4)), // server identifier
    (58, Some(4)), // T1
    (59, Some(4)), // T2
    (119, None),   // domain search
    (121, None),   // classless static routes
];

/// Rebuilds a received datagram with only the fixed part and the options the client reads, each
/// checked for its length; `None` if the fixed part is short, `hlen` is impossible, the magic
/// cookie is wrong or an option runs past the end.
///
/// The codec is only ever shown this canonical subset: options it would mis-decode (vendor,
/// relay, bulk lease query... some of which trip its debug assertions) never reach it.
pub fn sanitize(bytes: &[u8]) -> Option<Vec<u8>> {
    let fixed = bytes.get(..FIXED_LEN)?;
    // `Message::chaddr` slices by `hlen`.
    if fixed[2] > 16 || fixed[236..240] != MAGIC {
        return None;
    }
    let mut out = fixed.to_vec();
    let mut seen = [false; 256];
    let mut rest = &bytes[FIXED_LEN..];
    loop {
        let (&code, tail) = rest.split_first()?;
        match code {
            0 => {
                rest = tail;
                continue;
            }
            255 => break,
            _ => {}
        }
        let (&len, tail) = tail.split_first()?;
        let len = usize::from(len);
        let value = tail.get(..len)?;
        rest = &tail[len..];
        let Some((_, allowed)) = KEPT_OPTIONS.iter().find(|(c, _)| *c == code) else {
            continue;
        };
        let ok = match allowed {
            Some(n) => len == *n && !seen[usize::from(code)],
            None => len > 0 && (code != 3 && code != 6 && code != 42 || len % 4 == 0),
        };
        if ok {
            seen[usize::from(code)] = true;
            out.push(code);
            out.push(u8::try_from(len).ok()?);
            out.extend_from_slice(value);
        }
    }
    out.push(255);
    Some(out)
}

/// Decodes bytes into a DHCP message. Never panics, whatever the bytes: the codec sees only the
/// [`sanitize`]d subset, and a panic inside it (a bug there) would still be caught and count as
/// malformed.
pub fn decode(bytes: &[u8]) -> Option<Message> {
    let clean = sanitize(bytes)?;
    std::panic::catch_unwind(|| Message::decode(&mut Decoder::new(&clean)).ok())
        .ok()
        .flatten()
}

/// Parses a server reply to the transaction `xid` of the client with hardware address `mac`;
/// `None` for anything else (malformed, a request, another client's or transaction's, a type we
/// do not expect, an OFFER/ACK without an address).
pub fn parse_reply(bytes: &[u8], xid: u32, mac: &[u8]) -> Option<Reply> {
    let msg = decode(bytes)?;
    if msg.opcode() != Opcode::BootReply || msg.xid() != xid || msg.chaddr() != mac {
        return None;
    }
    let kind = msg.opts().msg_type()?;
    let server = match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
        _ => None,
    };
    match kind {
        MessageType::Nak => {}
        MessageType::Offer | MessageType::Ack => {
            let a = msg.yiaddr();
            if a.is_unspecified() || a.is_broadcast() || a.is_multicast() || server.is_none() {
                return None;
            }
        }
        _ => return None,
    }
    Some(Reply {
        kind,
        address: msg.yiaddr(),
        server,
        options: lease_options(&msg),
    })
}

fn lease_options(msg: &Message) -> LeaseOptions {
    let mut o = LeaseOptions::default();
    for (_, opt) in msg.opts().iter() {
        match opt {
            DhcpOption::SubnetMask(m) => o.subnet_mask = Some(*m),
            DhcpOption::Router(r) => o.routers.clone_from(r),
            DhcpOption::ClasslessStaticRoute(routes) => {
                o.classless_routes = routes
                    .iter()
                    .map(|(net, gw)| (net.network(), net.prefix_len(), *gw))
                    .collect();
            }
            DhcpOption::DomainNameServer(d) => o.dns.clone_from(d),
            DhcpOption::DomainSearch(names) => {
                o.search = names
                    .iter()
                    .map(|n| n.to_utf8().trim_end_matches('.').to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
            }
            DhcpOption::Hostname(h) => o.hostname = clean_name(h),
            DhcpOption::DomainName(d) => o.domain = clean_name(d),
            DhcpOption::NtpServers(n) => o.ntp.clone_from(n),
            DhcpOption::InterfaceMtu(m) => o.mtu = Some(*m),
            DhcpOption::AddressLeaseTime(t) => o.lease_time = Some(*t),
            DhcpOption::Renewal(t) => o.renewal = Some(*t),
            DhcpOption::Rebinding(t) => o.rebinding = Some(*t),
            _ => {}
        }
    }
    o
}

/// Trims trailing NULs, whitespace and dots; `None` if nothing is left or the name has
/// characters no DNS name has.
fn clean_name(s: &str) -> Option<String> {
    let t = s.trim_end_matches(['\0', '.']).trim();
    let valid = !t.is_empty()
        && t.len() <= 253
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    valid.then(|| t.to_string())
}

#[cfg(feature = "fuzzing")]
/// Transaction ID of the client that [`fuzz_reply`] receives replies for.
pub const FUZZ_XID: u32 = 0x1234_5678;
#[cfg(feature = "fuzzing")]
/// Hardware address of that client.
pub const FUZZ_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

#[cfg(feature = "fuzzing")]
/// The fuzzing entry of the DHCPv4 client's receive path: `bytes`, a datagram as the client's
/// socket receives it, goes through [`decode`] and [`parse_reply`] for transaction [`FUZZ_XID`]
/// of [`FUZZ_MAC`]; an ACK through the lease it grants (stored as a resource and read back) and
/// the specs networkd makes of that lease. Returns the lease, `None` if the datagram is ignored.
///
/// Whatever the bytes, nothing panics, not even inside the codec (a fuzzer counts a panic that
/// [`decode`]'s guard catches); this panics (a fuzzer finding) if a reply of another
/// transaction or client is accepted or a lease has impossible timers.
pub fn fuzz_reply(bytes: &[u8]) -> Option<crate::dhcp::Lease> {
    use crate::dhcp::Lease;
    let _ = decode(bytes);
    let reply = parse_reply(bytes, FUZZ_XID, &FUZZ_MAC)?;
    let msg = decode(bytes).expect("a parsed reply decodes");
    assert!(
        msg.xid() == FUZZ_XID && msg.chaddr() == FUZZ_MAC,
        "a reply of another transaction or client was accepted"
    );
    if reply.kind != MessageType::Ack {
        return None;
    }
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let lease = Lease::from_ack("eth0", &reply, now)?;
    assert!(lease.prefix_len <= 32, "prefix length {}", lease.prefix_len);
    assert!(
        lease.renewal <= lease.rebinding && lease.rebinding <= lease.lease_time,
        "timers {} {} {}",
        lease.renewal,
        lease.rebinding,
        lease.lease_time
    );
    let _ = (lease.until_renewal(now), lease.until_expiry(now));
    let stored = cosi::resource::encode_spec(&lease).expect("a lease encodes");
    let back: Lease = cosi::resource::decode_spec(&stored).expect("a stored lease decodes");
    assert_eq!(back, lease, "a lease reads back as stored");
    let operator = machinery::resources::network::OperatorSpecSpec {
        link_name: "eth0".into(),
        ..Default::default()
    };
    let _ = crate::controllers::operator_spec::lease_specs(&operator, &lease, true);
    Some(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unsanitized decode: client messages carry options a reply parser drops.
    fn raw(bytes: &[u8]) -> Option<Message> {
        Message::decode(&mut Decoder::new(bytes)).ok()
    }

    fn ident() -> Identity {
        Identity {
            mac: vec![2, 0, 0, 0, 0, 1],
            client_id: Some(vec![1, 2, 0, 0, 0, 0, 1]),
            request_hostname: true,
            send_hostname: None,
            request_mtu: true,
        }
    }

    /// A server reply as dnsmasq would send it.
    pub(crate) fn reply(kind: MessageType, xid: u32, mac: &[u8], opts: Vec<DhcpOption>) -> Vec<u8> {
        let mut msg = Message::default();
        msg.set_opcode(Opcode::BootReply)
            .set_xid(xid)
            .set_chaddr(mac)
            .set_yiaddr(Ipv4Addr::new(10, 0, 0, 5));
        msg.opts_mut().insert(DhcpOption::MessageType(kind));
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 1)));
        for o in opts {
            msg.opts_mut().insert(o);
        }
        msg.to_vec().expect("encode")
    }

    #[test]
    fn discover_asks_for_broadcast_and_the_upstream_options() {
        let bytes = build(
            &ident(),
            7,
            0,
            Request::Discover {
                previous: Some(Ipv4Addr::new(10, 0, 0, 9)),
            },
        )
        .expect("encode");
        let msg = raw(&bytes).expect("decodes");
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Discover));
        assert!(msg.flags().broadcast());
        assert_eq!(
            msg.opts().get(OptionCode::RequestedIpAddress),
            Some(&DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 0, 9)))
        );
        let Some(DhcpOption::ParameterRequestList(p)) =
            msg.opts().get(OptionCode::ParameterRequestList)
        else {
            panic!("no parameter list")
        };
        for code in [
            OptionCode::ClasslessStaticRoute,
            OptionCode::DomainNameServer,
            OptionCode::DomainSearch,
            OptionCode::NtpServers,
            OptionCode::InterfaceMtu,
            OptionCode::Hostname,
        ] {
            assert!(p.contains(&code), "{code:?}");
        }
    }

    #[test]
    fn hostname_is_sent_or_requested_never_both() {
        let mut id = ident();
        id.send_hostname = Some("node-1".into());
        let bytes = build(&id, 1, 0, Request::Discover { previous: None }).expect("encode");
        let msg = raw(&bytes).expect("decodes");
        assert_eq!(
            msg.opts().get(OptionCode::Hostname),
            Some(&DhcpOption::Hostname("node-1".into()))
        );
        let Some(DhcpOption::ParameterRequestList(p)) =
            msg.opts().get(OptionCode::ParameterRequestList)
        else {
            panic!("no parameter list")
        };
        assert!(!p.contains(&OptionCode::Hostname));
    }

    #[test]
    fn renew_is_unicast_with_ciaddr_and_release_names_the_server() {
        let a = Ipv4Addr::new(10, 0, 0, 5);
        let msg =
            raw(&build(&ident(), 1, 0, Request::Extend { address: a }).expect("e")).expect("d");
        assert_eq!(msg.ciaddr(), a);
        assert!(!msg.flags().broadcast());
        assert_eq!(msg.opts().get(OptionCode::ServerIdentifier), None);
        let msg = raw(&build(
            &ident(),
            1,
            0,
            Request::Release {
                address: a,
                server: Ipv4Addr::new(10, 0, 0, 1),
            },
        )
        .expect("e"))
        .expect("d");
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Release));
        assert_eq!(msg.ciaddr(), a);
    }

    #[test]
    fn replies_of_other_transactions_and_clients_are_ignored() {
        let mac = [2, 0, 0, 0, 0, 1];
        let ack = reply(MessageType::Ack, 42, &mac, vec![]);
        assert!(parse_reply(&ack, 42, &mac).is_some());
        assert!(parse_reply(&ack, 43, &mac).is_none());
        assert!(parse_reply(&ack, 42, &[2, 0, 0, 0, 0, 2]).is_none());
        let req = build(&ident(), 42, 0, Request::Discover { previous: None }).expect("e");
        assert!(parse_reply(&req, 42, &ident().mac).is_none(), "a request");
        assert!(parse_reply(&ack[..100], 42, &mac).is_none(), "truncated");
    }

    #[test]
    fn options_are_extracted() {
        let mac = [2, 0, 0, 0, 0, 1];
        let net = |a, l| ipnet::Ipv4Net::new(a, l).expect("prefix");
        let bytes = reply(
            MessageType::Ack,
            1,
            &mac,
            vec![
                DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)),
                DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 0, 1)]),
                DhcpOption::ClasslessStaticRoute(vec![(
                    net(Ipv4Addr::new(192, 168, 0, 0), 16),
                    Ipv4Addr::new(10, 0, 0, 254),
                )]),
                DhcpOption::DomainNameServer(vec![Ipv4Addr::new(10, 0, 0, 53)]),
                DhcpOption::DomainSearch(vec!["corp.example.".parse().expect("name")]),
                DhcpOption::Hostname("node-1\0".into()),
                DhcpOption::DomainName("example.org".into()),
                DhcpOption::NtpServers(vec![Ipv4Addr::new(10, 0, 0, 123)]),
                DhcpOption::InterfaceMtu(1400),
                DhcpOption::AddressLeaseTime(3600),
            ],
        );
        let r = parse_reply(&bytes, 1, &mac).expect("ack");
        assert_eq!(r.kind, MessageType::Ack);
        let o = r.options;
        assert_eq!(
            o.classless_routes,
            [(
                Ipv4Addr::new(192, 168, 0, 0),
                16,
                Ipv4Addr::new(10, 0, 0, 254)
            )]
        );
        assert_eq!(o.search, ["corp.example"]);
        assert_eq!(o.hostname.as_deref(), Some("node-1"));
        assert_eq!(o.domain.as_deref(), Some("example.org"));
        assert_eq!(o.mtu, Some(1400));
        assert_eq!(o.lease_time, Some(3600));
    }

    #[test]
    fn oversized_hlen_is_malformed_not_a_panic() {
        let mac = [2, 0, 0, 0, 0, 1];
        let mut bytes = reply(MessageType::Ack, 1, &mac, vec![]);
        bytes[2] = 200;
        assert!(decode(&bytes).is_none());
        assert!(parse_reply(&bytes, 1, &mac).is_none());
    }
}
