//! DHCPv6 messages (RFC 8415): building the client's requests and parsing the server's replies
//! with `dhcproto`'s `v6` codec. Parsing never panics and never trusts a field: the codec only
//! sees a length-checked rebuild of the datagram ([`sanitize`]), runs under `catch_unwind`, and
//! whatever does not decode, belongs to another transaction or client, or lacks what its type
//! requires is `None`.

use std::net::Ipv6Addr;

use dhcproto::v6::{
    DhcpOption, IAAddr, Message, MessageType, OptionCode, Status, StatusCode, IANA, ORO,
};
use dhcproto::{Decodable, Decoder, Encodable};

/// What the client says about itself in every message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The client's DUID (option 1): the configured one, else DUID-LL of the link's MAC.
    pub duid: Vec<u8>,
    /// The IAID of the one IA_NA the client asks for (stable per link).
    pub iaid: u32,
    /// Ask for the client FQDN option (39), the DHCPv6 hostname.
    pub request_hostname: bool,
}

/// DUID-LL (RFC 8415 §11.4) of an Ethernet hardware address; `None` without one.
pub fn duid_ll(mac: &[u8]) -> Option<Vec<u8>> {
    if mac.is_empty() || mac.iter().all(|b| *b == 0) {
        return None;
    }
    // Type 3 (link-layer), hardware type 1 (Ethernet).
    Some([&[0u8, 3, 0, 1][..], mac].concat())
}

/// Whether `duid` is a well-formed DUID (RFC 8415 §11: a known type with its fixed part, at
/// most 130 bytes).
pub fn valid_duid(duid: &[u8]) -> bool {
    let (Some(&hi), Some(&lo)) = (duid.first(), duid.get(1)) else {
        return false;
    };
    let min = match u16::from_be_bytes([hi, lo]) {
        1 => 8,  // DUID-LLT: type, hardware type, time, address
        2 => 7,  // DUID-EN: type, enterprise number, identifier
        3 => 5,  // DUID-LL: type, hardware type, address
        4 => 18, // DUID-UUID: type, 16 bytes
        _ => return false,
    };
    duid.len() >= min && duid.len() <= 130
}

/// The IAID of a link: the last four bytes of its MAC, else a hash of its name (stable across
/// restarts, distinct per link).
pub fn iaid(link: &str, mac: &[u8]) -> u32 {
    if let Some(tail) = mac.len().checked_sub(4).and_then(|s| mac.get(s..)) {
        if let Ok(b) = <[u8; 4]>::try_from(tail) {
            return u32::from_be_bytes(b);
        }
    }
    // FNV-1a.
    link.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The kind of a client message, with what it carries besides the identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// SOLICIT, hinting the address we had before, if any.
    Solicit {
        /// Hinted address.
        previous: Option<Ipv6Addr>,
    },
    /// REQUEST of the advertised `address` from the server `server_id`.
    Request {
        /// Server DUID of the advertisement.
        server_id: Vec<u8>,
        /// Advertised address.
        address: Ipv6Addr,
    },
    /// RENEW of `address` with the server that granted it.
    Renew {
        /// Server DUID of the lease.
        server_id: Vec<u8>,
        /// Leased address.
        address: Ipv6Addr,
    },
    /// REBIND of `address` with any server.
    Rebind {
        /// Leased address.
        address: Ipv6Addr,
    },
    /// RELEASE of `address` to the server that granted it.
    Release {
        /// Server DUID of the lease.
        server_id: Vec<u8>,
        /// Leased address.
        address: Ipv6Addr,
    },
}

impl Request {
    fn message_type(&self) -> MessageType {
        match self {
            Self::Solicit { .. } => MessageType::Solicit,
            Self::Request { .. } => MessageType::Request,
            Self::Renew { .. } => MessageType::Renew,
            Self::Rebind { .. } => MessageType::Rebind,
            Self::Release { .. } => MessageType::Release,
        }
    }
}

/// The transaction ID (24 bits) of `xid`.
fn xid_bytes(xid: u32) -> [u8; 3] {
    let [_, a, b, c] = xid.to_be_bytes();
    [a, b, c]
}

/// Encodes a client message of transaction `xid` (low 24 bits), `elapsed` hundredths of a
/// second after the exchange began (option 8).
///
/// # Errors
///
/// A `dhcproto` encoding error.
pub fn build(
    identity: &Identity,
    xid: u32,
    elapsed: u16,
    request: &Request,
) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    let mut msg = Message::new_with_id(request.message_type(), xid_bytes(xid));
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::ClientId(identity.duid.clone()));
    opts.insert(DhcpOption::ElapsedTime(elapsed));
    let (server_id, address) = match request {
        Request::Solicit { previous } => (None, *previous),
        Request::Request { server_id, address }
        | Request::Renew { server_id, address }
        | Request::Release { server_id, address } => (Some(server_id), Some(*address)),
        Request::Rebind { address } => (None, Some(*address)),
    };
    if let Some(id) = server_id {
        opts.insert(DhcpOption::ServerId(id.clone()));
    }
    // One IA_NA; T1, T2 and the lifetimes are left to the server (RFC 8415 §18.2: zero).
    let mut ia = IANA {
        id: identity.iaid,
        t1: 0,
        t2: 0,
        opts: Default::default(),
    };
    if let Some(addr) = address {
        ia.opts.insert(DhcpOption::IAAddr(IAAddr {
            addr,
            preferred_life: 0,
            valid_life: 0,
            opts: Default::default(),
        }));
    }
    opts.insert(DhcpOption::IANA(ia));
    if !matches!(request, Request::Release { .. }) {
        let mut oro = vec![
            OptionCode::DomainNameServers,
            OptionCode::DomainSearchList,
            OptionCode::NtpServer,
        ];
        if identity.request_hostname {
            oro.push(OptionCode::ClientFqdn);
        }
        opts.insert(DhcpOption::ORO(ORO { opts: oro }));
    }
    msg.to_vec()
}

/// One address of an IA_NA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IaAddress {
    /// The address.
    pub address: Ipv6Addr,
    /// Preferred lifetime (seconds; `u32::MAX` is infinity).
    pub preferred: u32,
    /// Valid lifetime (seconds; `u32::MAX` is infinity).
    pub valid: u32,
}

/// The IA_NA of a reply (the one with our IAID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IaNa {
    /// T1 (seconds; 0: the client chooses).
    pub t1: u32,
    /// T2 (seconds; 0: the client chooses).
    pub t2: u32,
    /// The IA's status code, if any (absent means success).
    pub status: Option<Status>,
    /// Its addresses with a status other than success dropped.
    pub addresses: Vec<IaAddress>,
}

/// The options of a reply that a lease uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Option 23.
    pub dns: Vec<Ipv6Addr>,
    /// Option 24, trailing dots trimmed.
    pub search: Vec<String>,
    /// Option 56, server addresses (suboption 1).
    pub ntp: Vec<Ipv6Addr>,
    /// Option 39, the domain name, trailing dot trimmed.
    pub fqdn: Option<String>,
}

/// A server reply of our transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// ADVERTISE or REPLY.
    pub kind: MessageType,
    /// The server's DUID (option 2, required).
    pub server_id: Vec<u8>,
    /// Option 7 (0 if absent).
    pub preference: u8,
    /// The message's status code (option 13 at the top level), if any.
    pub status: Option<Status>,
    /// Our IA_NA, if the server sent it.
    pub ia: Option<IaNa>,
    /// The options that matter to the lease.
    pub options: LeaseOptions,
}

impl Reply {
    /// The first address of the IA that is valid (preferred ≤ valid, valid > 0), if the reply
    /// and the IA succeeded.
    pub fn address(&self) -> Option<&IaAddress> {
        if self.status.is_some_and(|s| s != Status::Success) {
            return None;
        }
        let ia = self.ia.as_ref()?;
        if ia.status.is_some_and(|s| s != Status::Success) {
            return None;
        }
        ia.addresses
            .iter()
            .find(|a| a.valid > 0 && a.preferred <= a.valid && usable(&a.address))
    }

    /// The status that says why there is no address: the top-level one, else the IA's.
    pub fn failure(&self) -> Option<Status> {
        let failed = |s: &Option<Status>| s.filter(|s| *s != Status::Success);
        failed(&self.status).or_else(|| self.ia.as_ref().and_then(|ia| failed(&ia.status)))
    }
}

/// An address a server may lease: unicast, not loopback, link-local or unspecified.
fn usable(a: &Ipv6Addr) -> bool {
    !(a.is_unspecified() || a.is_loopback() || a.is_multicast() || a.is_unicast_link_local())
}

/// Option codes.
const CLIENT_ID: u16 = 1;
const SERVER_ID: u16 = 2;
const IA_NA: u16 = 3;
const IA_ADDR: u16 = 5;
const PREFERENCE: u16 = 7;
const STATUS_CODE: u16 = 13;
const DNS_SERVERS: u16 = 23;
const DOMAIN_LIST: u16 = 24;
const CLIENT_FQDN: u16 = 39;
const NTP_SERVER: u16 = 56;
/// NTP suboption: server address.
const NTP_SUBOPTION_SRV_ADDR: u16 = 1;

/// Splits `bytes` into (code, value) options; `None` if one runs past the end.
fn options(mut bytes: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let code = u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]);
        let len = usize::from(u16::from_be_bytes([*bytes.get(2)?, *bytes.get(3)?]));
        let value = bytes.get(4..4 + len)?;
        out.push((code, value));
        bytes = bytes.get(4 + len..)?;
    }
    Some(out)
}

fn push(out: &mut Vec<u8>, code: u16, value: &[u8]) -> Option<()> {
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&u16::try_from(value.len()).ok()?.to_be_bytes());
    out.extend_from_slice(value);
    Some(())
}

/// A status code option kept as its code alone, with its message only if it is UTF-8 (the
/// codec fails on anything else and would silently drop the options after it).
fn status_code(value: &[u8]) -> Option<Vec<u8>> {
    let (code, text) = (value.get(..2)?, value.get(2..)?);
    let mut v = code.to_vec();
    if std::str::from_utf8(text).is_ok() {
        v.extend_from_slice(text);
    }
    Some(v)
}

/// Keeps the status code of an IA or IA address's own options, drops everything else.
fn nested(value: &[u8], fixed: usize, keep_addresses: bool) -> Option<Vec<u8>> {
    let (head, rest) = (value.get(..fixed)?, value.get(fixed..)?);
    let mut out = head.to_vec();
    let mut seen_status = false;
    for (code, v) in options(rest)? {
        match code {
            STATUS_CODE if !seen_status => {
                seen_status = true;
                push(&mut out, code, &status_code(v)?)?;
            }
            IA_ADDR if keep_addresses => {
                if let Some(a) = nested(v, 24, false) {
                    push(&mut out, code, &a)?;
                }
            }
            _ => {}
        }
    }
    Some(out)
}

/// Rebuilds a received datagram with the header and only the options the client reads, each
/// checked for its length (nested IA_NA and IA address options too); `None` if it is not an
/// ADVERTISE or REPLY, or an option runs past the end.
///
/// The codec is only ever shown this canonical subset: options it would mis-decode (a status
/// code shorter than two bytes underflows its length; relay, vendor, authentication options)
/// never reach it.
pub fn sanitize(bytes: &[u8]) -> Option<Vec<u8>> {
    let header = bytes.get(..4)?;
    if !matches!(header[0], 2 | 7) {
        return None;
    }
    let mut out = header.to_vec();
    let mut seen = std::collections::BTreeSet::new();
    for (code, value) in options(bytes.get(4..)?)? {
        let len = value.len();
        let first = seen.insert(code);
        match code {
            CLIENT_ID | SERVER_ID if first && (1..=130).contains(&len) => {
                push(&mut out, code, value)?;
            }
            // Every IA_NA: the one with our IAID is picked later.
            IA_NA => {
                if let Some(ia) = nested(value, 12, true) {
                    push(&mut out, code, &ia)?;
                }
            }
            PREFERENCE if first && len == 1 => push(&mut out, code, value)?,
            STATUS_CODE if first && len >= 2 => push(&mut out, code, &status_code(value)?)?,
            DNS_SERVERS if first && len > 0 && len % 16 == 0 => push(&mut out, code, value)?,
            DOMAIN_LIST | CLIENT_FQDN if first && len > 0 && len <= 1024 => {
                push(&mut out, code, value)?;
            }
            NTP_SERVER if first => {
                // Only server addresses (suboption 1, 16 bytes); multicast and FQDN
                // suboptions are not used.
                let mut kept = Vec::new();
                for (sub, v) in options(value)? {
                    if sub == NTP_SUBOPTION_SRV_ADDR && v.len() == 16 {
                        push(&mut kept, sub, v)?;
                    }
                }
                if !kept.is_empty() {
                    push(&mut out, code, &kept)?;
                }
            }
            _ => {}
        }
    }
    Some(out)
}

/// Decodes bytes into a DHCPv6 message. Never panics, whatever the bytes: the codec sees only
/// the [`sanitize`]d subset, and a panic inside it (a bug there) would still be caught and
/// count as malformed.
pub fn decode(bytes: &[u8]) -> Option<Message> {
    let clean = sanitize(bytes)?;
    std::panic::catch_unwind(|| Message::decode(&mut Decoder::new(&clean)).ok())
        .ok()
        .flatten()
}

/// Parses a server reply to transaction `xid` of the client `identity`; `None` for anything
/// else (malformed, a request, another transaction's or client's, no server identifier).
pub fn parse_reply(bytes: &[u8], xid: u32, identity: &Identity) -> Option<Reply> {
    let msg = decode(bytes)?;
    let kind = msg.msg_type();
    if !matches!(kind, MessageType::Advertise | MessageType::Reply) || msg.xid() != xid_bytes(xid) {
        return None;
    }
    let opts = msg.opts();
    match opts.get(OptionCode::ClientId) {
        Some(DhcpOption::ClientId(id)) if *id == identity.duid => {}
        _ => return None,
    }
    let server_id = match opts.get(OptionCode::ServerId) {
        Some(DhcpOption::ServerId(id)) => id.clone(),
        _ => return None,
    };
    let preference = match opts.get(OptionCode::Preference) {
        Some(DhcpOption::Preference(p)) => *p,
        _ => 0,
    };
    let status = match opts.get(OptionCode::StatusCode) {
        Some(DhcpOption::StatusCode(StatusCode { status, .. })) => Some(*status),
        _ => None,
    };
    let ia = opts
        .get_all(OptionCode::IANA)
        .unwrap_or_default()
        .iter()
        .find_map(|o| match o {
            DhcpOption::IANA(ia) if ia.id == identity.iaid => Some(ia_na(ia)),
            _ => None,
        });
    Some(Reply {
        kind,
        server_id,
        preference,
        status,
        ia,
        options: lease_options(&msg),
    })
}

fn ia_na(ia: &IANA) -> IaNa {
    let status_of = |o: &dhcproto::v6::DhcpOptions| match o.get(OptionCode::StatusCode) {
        Some(DhcpOption::StatusCode(s)) => Some(s.status),
        _ => None,
    };
    let addresses = ia
        .opts
        .get_all(OptionCode::IAAddr)
        .unwrap_or_default()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IAAddr(a) if status_of(&a.opts).is_none_or(|s| s == Status::Success) => {
                Some(IaAddress {
                    address: a.addr,
                    preferred: a.preferred_life,
                    valid: a.valid_life,
                })
            }
            _ => None,
        })
        .collect();
    IaNa {
        t1: ia.t1,
        t2: ia.t2,
        status: status_of(&ia.opts),
        addresses,
    }
}

fn lease_options(msg: &Message) -> LeaseOptions {
    let mut o = LeaseOptions::default();
    for opt in msg.opts().iter() {
        match opt {
            DhcpOption::DomainNameServers(d) => {
                o.dns = d.iter().copied().filter(|a| !a.is_unspecified()).collect();
            }
            DhcpOption::DomainSearchList(names) => {
                o.search = names
                    .iter()
                    .map(|n| n.to_utf8().trim_end_matches('.').to_string())
                    .filter(|n| valid_name(n))
                    .collect();
            }
            DhcpOption::NtpServer(subs) => {
                o.ntp = subs
                    .iter()
                    .filter_map(|s| match s {
                        dhcproto::v6::NtpSuboption::ServerAddress(a) => Some(*a),
                        _ => None,
                    })
                    .collect();
            }
            DhcpOption::Unknown(u) if u.code() == OptionCode::ClientFqdn => {
                o.fqdn = fqdn(u.data());
            }
            _ => {}
        }
    }
    o
}

/// The domain name of a client FQDN option (RFC 4704: a flags byte, then a name in DNS wire
/// format without compression; a partial name has no terminating zero label).
fn fqdn(data: &[u8]) -> Option<String> {
    let mut rest = data.get(1..)?;
    let mut labels = Vec::new();
    while let Some((&len, tail)) = rest.split_first() {
        if len == 0 {
            break;
        }
        let label = tail.get(..usize::from(len))?;
        labels.push(std::str::from_utf8(label).ok()?.to_string());
        rest = tail.get(usize::from(len)..)?;
    }
    let name = labels.join(".");
    valid_name(&name).then_some(name)
}

/// A DNS name of letters, digits, `-`, `_` and dots, at most 253 characters.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| !l.is_empty() && l.len() <= 63)
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

#[cfg(feature = "fuzzing")]
/// Transaction ID of the client that [`fuzz_reply`] receives replies for.
pub const FUZZ_XID: u32 = 0x00ab_cdef;
#[cfg(feature = "fuzzing")]
/// Hardware address of that client (its DUID is the DUID-LL of it).
pub const FUZZ_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
#[cfg(feature = "fuzzing")]
/// IAID of that client's IA_NA.
pub const FUZZ_IAID: u32 = 7;

#[cfg(feature = "fuzzing")]
/// The fuzzing entry of the DHCPv6 client's receive path: `bytes`, a datagram as the client's
/// socket receives it, goes through [`decode`] and [`parse_reply`] for transaction
/// [`FUZZ_XID`] of the client with the DUID-LL of [`FUZZ_MAC`] and IAID [`FUZZ_IAID`], then
/// through the lease it grants (stored as a resource and read back) and the specs networkd
/// makes of that lease. Returns the lease, `None` if the datagram is ignored or grants none.
///
/// Whatever the bytes, nothing panics, not even inside the codec (a fuzzer counts a panic that
/// [`decode`]'s guard catches); this panics (a fuzzer finding) if a reply of another
/// transaction or client is accepted or a lease has impossible lifetimes.
pub fn fuzz_reply(bytes: &[u8]) -> Option<crate::dhcp6::Lease> {
    use crate::dhcp6::Lease;
    let identity = Identity {
        duid: duid_ll(&FUZZ_MAC)?,
        iaid: FUZZ_IAID,
        request_hostname: true,
    };
    let _ = decode(bytes);
    let reply = parse_reply(bytes, FUZZ_XID, &identity)?;
    let msg = decode(bytes).expect("a parsed reply decodes");
    assert!(
        msg.xid_num() == FUZZ_XID
            && matches!(
                msg.opts().get(OptionCode::ClientId),
                Some(DhcpOption::ClientId(d)) if *d == identity.duid
            ),
        "a reply of another transaction or client was accepted"
    );
    let _ = reply.failure();
    if let Some(a) = reply.address() {
        assert!(a.valid > 0 && a.preferred <= a.valid, "lifetimes {a:?}");
        assert!(!a.address.is_unspecified() && !a.address.is_multicast());
    }
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let lease = Lease::from_reply("eth0", &identity, &reply, now)?;
    assert!(
        lease.renewal <= lease.rebinding && lease.rebinding <= lease.valid_lifetime,
        "timers {} {} {}",
        lease.renewal,
        lease.rebinding,
        lease.valid_lifetime
    );
    assert!(lease.belongs_to("eth0", &identity));
    let _ = (lease.until_renewal(now), lease.until_expiry(now));
    let stored = cosi::resource::encode_spec(&lease).expect("a lease encodes");
    let back: Lease = cosi::resource::decode_spec(&stored).expect("a stored lease decodes");
    assert_eq!(back, lease, "a lease reads back as stored");
    let operator = machinery::resources::network::OperatorSpecSpec {
        link_name: "eth0".into(),
        ..Default::default()
    };
    let _ = crate::controllers::operator_spec::lease6_specs(&operator, &lease, true);
    Some(lease)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dhcproto::v6::NtpSuboption;

    pub(crate) fn ident() -> Identity {
        Identity {
            duid: duid_ll(&[2, 0, 0, 0, 0, 1]).expect("duid"),
            iaid: 0x0000_0001,
            request_hostname: true,
        }
    }

    pub(crate) const ADDR: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x213, 0, 0, 0, 0, 0, 0x150);

    /// A server reply as dnsmasq would send it.
    pub(crate) fn reply(kind: MessageType, xid: u32, extra: Vec<DhcpOption>) -> Vec<u8> {
        let mut msg = Message::new_with_id(kind, xid_bytes(xid));
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::ClientId(ident().duid));
        opts.insert(DhcpOption::ServerId(vec![
            0, 1, 0, 1, 1, 2, 3, 4, 2, 0, 0, 0, 0, 2,
        ]));
        let mut ia = IANA {
            id: ident().iaid,
            t1: 60,
            t2: 105,
            opts: Default::default(),
        };
        ia.opts.insert(DhcpOption::IAAddr(IAAddr {
            addr: ADDR,
            preferred_life: 120,
            valid_life: 120,
            opts: Default::default(),
        }));
        opts.insert(DhcpOption::IANA(ia));
        for o in extra {
            opts.insert(o);
        }
        msg.to_vec().expect("encode")
    }

    fn raw(bytes: &[u8]) -> Message {
        Message::decode(&mut Decoder::new(bytes)).expect("decodes")
    }

    #[test]
    fn solicit_carries_client_id_ia_na_hint_and_oro() {
        let bytes = build(
            &ident(),
            0x00ab_cdef,
            0,
            &Request::Solicit {
                previous: Some(ADDR),
            },
        )
        .expect("encode");
        let msg = raw(&bytes);
        assert_eq!(msg.msg_type(), MessageType::Solicit);
        assert_eq!(msg.xid(), [0xab, 0xcd, 0xef]);
        assert_eq!(
            msg.opts().get(OptionCode::ClientId),
            Some(&DhcpOption::ClientId(ident().duid))
        );
        assert!(msg.opts().get(OptionCode::ServerId).is_none());
        let Some(DhcpOption::IANA(ia)) = msg.opts().get(OptionCode::IANA) else {
            panic!("no IA_NA")
        };
        assert_eq!((ia.id, ia.t1, ia.t2), (1, 0, 0));
        let Some(DhcpOption::IAAddr(a)) = ia.opts.get(OptionCode::IAAddr) else {
            panic!("no hint")
        };
        assert_eq!(a.addr, ADDR);
        let Some(DhcpOption::ORO(oro)) = msg.opts().get(OptionCode::ORO) else {
            panic!("no ORO")
        };
        for code in [
            OptionCode::DomainNameServers,
            OptionCode::DomainSearchList,
            OptionCode::NtpServer,
            OptionCode::ClientFqdn,
        ] {
            assert!(oro.opts.contains(&code), "{code:?}");
        }
        assert!(msg.opts().get(OptionCode::ElapsedTime).is_some());
    }

    #[test]
    fn request_renew_and_release_name_the_server_rebind_does_not() {
        let server_id = vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 2];
        for (req, ty, with_server) in [
            (
                Request::Request {
                    server_id: server_id.clone(),
                    address: ADDR,
                },
                MessageType::Request,
                true,
            ),
            (
                Request::Renew {
                    server_id: server_id.clone(),
                    address: ADDR,
                },
                MessageType::Renew,
                true,
            ),
            (
                Request::Rebind { address: ADDR },
                MessageType::Rebind,
                false,
            ),
            (
                Request::Release {
                    server_id: server_id.clone(),
                    address: ADDR,
                },
                MessageType::Release,
                true,
            ),
        ] {
            let msg = raw(&build(&ident(), 1, 100, &req).expect("encode"));
            assert_eq!(msg.msg_type(), ty);
            assert_eq!(
                msg.opts().get(OptionCode::ServerId).is_some(),
                with_server,
                "{ty:?}"
            );
            let Some(DhcpOption::IANA(ia)) = msg.opts().get(OptionCode::IANA) else {
                panic!("no IA_NA")
            };
            assert!(ia.opts.get(OptionCode::IAAddr).is_some(), "{ty:?}");
            assert_eq!(
                msg.opts().get(OptionCode::ORO).is_none(),
                ty == MessageType::Release
            );
        }
    }

    #[test]
    fn reply_options_are_extracted() {
        let mut fqdn_data = vec![0u8];
        for l in ["node-6", "example", "org"] {
            fqdn_data.push(u8::try_from(l.len()).expect("len"));
            fqdn_data.extend_from_slice(l.as_bytes());
        }
        fqdn_data.push(0);
        let bytes = reply(
            MessageType::Reply,
            7,
            vec![
                DhcpOption::DomainNameServers(vec!["fd00:213::53".parse().expect("ip")]),
                DhcpOption::DomainSearchList(vec!["corp6.example.".parse().expect("name")]),
                DhcpOption::NtpServer(vec![NtpSuboption::ServerAddress(
                    "fd00:213::123".parse().expect("ip"),
                )]),
                DhcpOption::Unknown(dhcproto::v6::UnknownOption::new(
                    OptionCode::ClientFqdn,
                    fqdn_data,
                )),
                DhcpOption::Preference(10),
            ],
        );
        let r = parse_reply(&bytes, 7, &ident()).expect("reply");
        assert_eq!(r.kind, MessageType::Reply);
        assert_eq!(r.preference, 10);
        let a = r.address().expect("address");
        assert_eq!((a.address, a.preferred, a.valid), (ADDR, 120, 120));
        let ia = r.ia.as_ref().expect("ia");
        assert_eq!((ia.t1, ia.t2), (60, 105));
        assert_eq!(
            r.options.dns,
            ["fd00:213::53".parse::<Ipv6Addr>().expect("ip")]
        );
        assert_eq!(r.options.search, ["corp6.example"]);
        assert_eq!(
            r.options.ntp,
            ["fd00:213::123".parse::<Ipv6Addr>().expect("ip")]
        );
        assert_eq!(r.options.fqdn.as_deref(), Some("node-6.example.org"));
    }

    #[test]
    fn replies_of_other_transactions_clients_and_requests_are_ignored() {
        let bytes = reply(MessageType::Reply, 42, vec![]);
        assert!(parse_reply(&bytes, 42, &ident()).is_some());
        assert!(parse_reply(&bytes, 43, &ident()).is_none(), "other xid");
        let mut other = ident();
        other.duid = duid_ll(&[2, 0, 0, 0, 0, 9]).expect("duid");
        assert!(parse_reply(&bytes, 42, &other).is_none(), "other client");
        let mut other_ia = ident();
        other_ia.iaid = 9;
        let r = parse_reply(&bytes, 42, &other_ia).expect("reply");
        assert!(r.address().is_none(), "another IA");
        let req = build(&ident(), 42, 0, &Request::Solicit { previous: None }).expect("e");
        assert!(parse_reply(&req, 42, &ident()).is_none(), "a request");
        assert!(
            parse_reply(&bytes[..bytes.len() - 3], 42, &ident()).is_none(),
            "truncated"
        );
    }

    #[test]
    fn status_codes_withdraw_the_address() {
        let no_addrs = reply(
            MessageType::Advertise,
            1,
            vec![DhcpOption::StatusCode(StatusCode {
                status: Status::NoAddrsAvail,
                msg: "none".into(),
            })],
        );
        let r = parse_reply(&no_addrs, 1, &ident()).expect("reply");
        assert!(r.address().is_none());
        assert_eq!(r.failure(), Some(Status::NoAddrsAvail));
    }

    #[test]
    fn a_short_status_code_is_malformed_not_a_panic() {
        // Option 13 with length 1 at the top level and inside the IA: the codec would
        // underflow `len - 2`.
        let mut bytes = reply(MessageType::Reply, 1, vec![]);
        bytes.extend_from_slice(&[0, 13, 0, 1, 0]);
        let r = parse_reply(&bytes, 1, &ident()).expect("the rest still parses");
        assert_eq!(r.status, None);
        assert!(r.address().is_some());
        // A status message that is not UTF-8 is dropped, the rest kept.
        let mut bytes = reply(MessageType::Reply, 1, vec![]);
        bytes.extend_from_slice(&[0, 13, 0, 4, 0, 2, 0xff, 0xfe]);
        bytes.extend_from_slice(&[0, 23, 0, 16]);
        bytes.extend_from_slice(&"fd00::53".parse::<Ipv6Addr>().expect("ip").octets());
        let r = parse_reply(&bytes, 1, &ident()).expect("parses");
        assert_eq!(r.status, Some(Status::NoAddrsAvail));
        assert_eq!(r.options.dns.len(), 1);
    }

    #[test]
    fn duids_and_iaids() {
        assert_eq!(
            duid_ll(&[2, 0, 0, 0, 0, 1]),
            Some(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1])
        );
        assert_eq!(duid_ll(&[]), None);
        assert!(valid_duid(&[0, 3, 0, 1, 2, 0, 0, 0, 0, 1]));
        assert!(valid_duid(&[0, 1, 0, 1, 0x12, 0x34, 0x56, 0x78, 2]));
        assert!(!valid_duid(&[0, 9, 1, 2, 3, 4, 5, 6]));
        assert!(!valid_duid(&[0]));
        assert_eq!(iaid("eth0", &[2, 0, 0xaa, 0xbb, 0xcc, 0xdd]), 0xaabb_ccdd);
        assert_ne!(iaid("wg0", &[]), iaid("wg1", &[]));
    }

    #[test]
    fn fqdn_labels() {
        assert_eq!(fqdn(&[0, 1, b'a', 1, b'b', 0]).as_deref(), Some("a.b"));
        assert_eq!(fqdn(&[0, 1, b'a', 5, b'b']), None, "label past the end");
        assert_eq!(fqdn(&[0, 0]), None, "empty");
        assert_eq!(fqdn(&[]), None);
    }
}
