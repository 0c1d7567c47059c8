//! A DHCPv6 lease: the IA_NA address a REPLY granted, the server and the options, when, and
//! its timers; stored in stated as a `DHCP6Lease` resource so that a restarted networkd renews
//! it instead of soliciting again.

use std::net::Ipv6Addr;
use std::time::{Duration, SystemTime};

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use machinery::resources::network::text;
use serde::{Deserialize, Serialize};

use super::packet::{Identity, Reply};
use crate::dhcp::lease::unix;

/// A DHCPv6 lease (spec of `DHCP6Leases.net.talos.dev`, ID = operator ID, e.g. `dhcp6/eth0`,
/// namespace `network`). Written only by the operator controller; `talosctl get dhcp6leases`
/// shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dhcp6LeaseSpec {
    /// The link the lease is on.
    pub link_name: String,
    /// The leased address (IA_NA, applied as a `/128`).
    #[serde(with = "text")]
    pub address: Ipv6Addr,
    /// The IAID of the IA_NA.
    pub iaid: u32,
    /// Our DUID the lease was granted to (hex).
    pub client_id: String,
    /// The server's DUID (hex): RENEW and RELEASE name it.
    pub server_id: String,
    /// DNS servers (option 23).
    #[serde(default, with = "text::vec")]
    pub dns: Vec<Ipv6Addr>,
    /// Search domains (option 24).
    #[serde(default)]
    pub search: Vec<String>,
    /// NTP server addresses (option 56).
    #[serde(default, with = "text::vec")]
    pub ntp: Vec<Ipv6Addr>,
    /// The FQDN (option 39), if the server sent one.
    #[serde(default)]
    pub fqdn: Option<String>,
    /// Preferred lifetime of the address, seconds.
    pub preferred_lifetime: u32,
    /// Valid lifetime of the address, seconds (the lease time; `u32::MAX` is infinity).
    pub valid_lifetime: u32,
    /// T1, seconds after acquisition: RENEW.
    pub renewal: u32,
    /// T2, seconds after acquisition: REBIND.
    pub rebinding: u32,
    /// When the REPLY arrived, seconds since the Unix epoch (wall clock, so it survives
    /// restarts).
    pub acquired: u64,
}

impl ResourceSpec for Dhcp6LeaseSpec {
    const TYPE: &'static str = "DHCP6Leases.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "network";

    fn definition() -> ResourceDefinition {
        // `dhcpl` (the acronym) would name the DHCPv4 and the DHCPv6 leases both.
        ResourceDefinition::new(Self::TYPE, Self::DEFAULT_NAMESPACE)
            .without_aliases(&["dhcpl", "dhcpls"])
            .with_aliases(&["dhcp6lease", "dhcp6leases"])
            .with_columns(&[
                ("Address", "{.address}"),
                ("Server", "{.serverId}"),
                ("Valid", "{.validLifetime}"),
            ])
    }
}

/// A `DHCP6Lease` resource.
pub type Dhcp6Lease = Resource<Dhcp6LeaseSpec>;

/// The lease in memory is the spec.
pub type Lease = Dhcp6LeaseSpec;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of hex text (`:` and `-` separators allowed); `None` if it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let s: Vec<u8> = s.bytes().filter(|c| *c != b':' && *c != b'-').collect();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|t| u8::from_str_radix(t, 16).ok())
        })
        .collect()
}

/// T1 and T2 (RFC 8415 §21.4): the server's values if sane, else 0.5 and 0.8 times the
/// preferred lifetime; never past the valid lifetime, T1 ≤ T2.
pub fn timers(t1: u32, t2: u32, preferred: u32, valid: u32) -> (u32, u32) {
    let part =
        |num: u64, den: u64| u32::try_from(u64::from(preferred) * num / den).unwrap_or(u32::MAX);
    let sane = t1 != 0 && t2 != 0 && t1 <= t2;
    let (t1, t2) = if sane {
        (t1, t2)
    } else {
        (part(1, 2), part(4, 5))
    };
    let t2 = t2.min(valid);
    (t1.min(t2), t2)
}

impl Dhcp6LeaseSpec {
    /// The lease granted by a REPLY received at `now` on `link` for the client `identity`;
    /// `None` if the reply grants no valid address.
    pub fn from_reply(
        link: &str,
        identity: &Identity,
        reply: &Reply,
        now: SystemTime,
    ) -> Option<Self> {
        let a = reply.address()?;
        let ia = reply.ia.as_ref()?;
        let (renewal, rebinding) = timers(ia.t1, ia.t2, a.preferred, a.valid);
        let o = &reply.options;
        Some(Self {
            link_name: link.to_string(),
            address: a.address,
            iaid: identity.iaid,
            client_id: hex(&identity.duid),
            server_id: hex(&reply.server_id),
            dns: o.dns.clone(),
            search: o.search.clone(),
            ntp: o.ntp.clone(),
            fqdn: o.fqdn.clone(),
            preferred_lifetime: a.preferred,
            valid_lifetime: a.valid,
            renewal,
            rebinding,
            acquired: unix(now),
        })
    }

    /// The server's DUID.
    pub fn server_duid(&self) -> Vec<u8> {
        unhex(&self.server_id).unwrap_or_default()
    }

    /// Whether this lease was granted to `identity` (same DUID and IAID on `link`): only then
    /// can it be renewed.
    pub fn belongs_to(&self, link: &str, identity: &Identity) -> bool {
        self.link_name == link
            && self.iaid == identity.iaid
            && self.client_id == hex(&identity.duid)
    }

    /// Time left until `offset` seconds after acquisition, from `now` (zero if past).
    fn until(&self, offset: u32, now: SystemTime) -> Duration {
        let at = self.acquired.saturating_add(u64::from(offset));
        Duration::from_secs(at.saturating_sub(unix(now)))
    }

    /// Time until T1 (renew).
    pub fn until_renewal(&self, now: SystemTime) -> Duration {
        self.until(self.renewal, now)
    }

    /// Time until T2 (rebind).
    pub fn until_rebinding(&self, now: SystemTime) -> Duration {
        self.until(self.rebinding, now)
    }

    /// Time until the address's valid lifetime ends.
    pub fn until_expiry(&self, now: SystemTime) -> Duration {
        self.until(self.valid_lifetime, now)
    }

    /// Whether the lease has expired at `now`.
    pub fn expired(&self, now: SystemTime) -> bool {
        self.until_expiry(now).is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp6::packet::parse_reply;
    use crate::dhcp6::packet::tests::{ident, reply, ADDR};
    use dhcproto::v6::MessageType;
    use std::time::UNIX_EPOCH;

    #[test]
    fn timers_follow_the_server_or_rfc_defaults() {
        assert_eq!(timers(60, 105, 120, 120), (60, 105));
        assert_eq!(timers(0, 0, 100, 120), (50, 80));
        assert_eq!(timers(90, 60, 100, 120), (50, 80), "T1 > T2");
        assert_eq!(
            timers(60, 500, 120, 120),
            (60, 120),
            "T2 past the valid lifetime"
        );
        assert_eq!(timers(0, 0, u32::MAX, u32::MAX).1, 3_435_973_836);
    }

    #[test]
    fn lease_from_reply_is_stored_as_text_and_times_out() {
        let bytes = reply(MessageType::Reply, 1, vec![]);
        let r = parse_reply(&bytes, 1, &ident()).expect("reply");
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let l = Lease::from_reply("eth0", &ident(), &r, now).expect("lease");
        assert_eq!(l.address, ADDR);
        assert_eq!((l.renewal, l.rebinding), (60, 105));
        assert!(l.belongs_to("eth0", &ident()));
        assert!(!l.belongs_to("eth1", &ident()));
        assert_eq!(l.server_duid(), r.server_id);
        assert_eq!(l.until_renewal(now), Duration::from_secs(60));
        assert!(!l.expired(now + Duration::from_secs(119)));
        assert!(l.expired(now + Duration::from_secs(120)));
        let bytes = cosi::resource::encode_spec(&l).expect("encode");
        let v = cosi::resource::spec_to_value(&bytes).expect("value");
        assert_eq!(v["address"], "fd00:213::150");
        assert_eq!(v["clientId"], "00030001020000000001");
        assert_eq!(
            cosi::resource::decode_spec::<Lease>(&bytes).expect("decode"),
            l
        );
    }

    #[test]
    fn hex_round_trip() {
        assert_eq!(hex(&[0, 1, 0xab]), "0001ab");
        assert_eq!(unhex("00:01:ab"), Some(vec![0, 1, 0xab]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }
}
