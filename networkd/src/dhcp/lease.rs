//! A DHCPv4 lease: what the ACK granted, when, and its timers; stored in stated as a
//! `DHCP4Lease` resource so that a restarted networkd renews it instead of starting over.

use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use machinery::resources::network::text;
use serde::{Deserialize, Serialize};

use super::packet::Reply;

/// Lease time assumed when the server sends none (upstream: 30 minutes).
pub const DEFAULT_LEASE_TIME: u32 = 30 * 60;

/// A classless static route of option 121.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClasslessRoute {
    /// Destination network address (host bits zero).
    #[serde(with = "text")]
    pub destination: Ipv4Addr,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Gateway; `0.0.0.0` means on-link.
    #[serde(with = "text")]
    pub gateway: Ipv4Addr,
}

/// A DHCPv4 lease (spec of `DHCP4Leases.net.talos.dev`, ID = operator ID, e.g. `dhcp4/eth0`,
/// namespace `network`). Written only by the operator controller; networkd-private state that
/// `talosctl get dhcp4leases` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dhcp4LeaseSpec {
    /// The link the lease is on.
    pub link_name: String,
    /// The leased address (`yiaddr`).
    #[serde(with = "text")]
    pub address: Ipv4Addr,
    /// Prefix length from option 1 (32 if absent, zero or not contiguous).
    pub prefix_len: u8,
    /// Server identifier (option 54): where RENEW and RELEASE are unicast to.
    #[serde(with = "text")]
    pub server: Ipv4Addr,
    /// Routers (option 3).
    #[serde(default, with = "text::vec")]
    pub routers: Vec<Ipv4Addr>,
    /// Classless static routes (option 121); when present, option 3 is ignored (RFC 3442).
    #[serde(default)]
    pub classless_routes: Vec<ClasslessRoute>,
    /// DNS servers (option 6).
    #[serde(default, with = "text::vec")]
    pub dns: Vec<Ipv4Addr>,
    /// Search domains (option 119).
    #[serde(default)]
    pub search: Vec<String>,
    /// Hostname (option 12).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Domain name (option 15).
    #[serde(default)]
    pub domain: Option<String>,
    /// NTP servers (option 42).
    #[serde(default, with = "text::vec")]
    pub ntp: Vec<Ipv4Addr>,
    /// Interface MTU (option 26).
    #[serde(default)]
    pub mtu: Option<u16>,
    /// Lease time in seconds (option 51).
    pub lease_time: u32,
    /// T1, seconds after acquisition (option 58, default half the lease).
    pub renewal: u32,
    /// T2, seconds after acquisition (option 59, default 7/8 of the lease).
    pub rebinding: u32,
    /// When the ACK arrived, seconds since the Unix epoch (wall clock, so it survives restarts).
    pub acquired: u64,
}

impl ResourceSpec for Dhcp4LeaseSpec {
    const TYPE: &'static str = "DHCP4Leases.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "network";

    fn definition() -> ResourceDefinition {
        // `dhcpl` (the acronym) would name the DHCPv4 and the DHCPv6 leases both.
        ResourceDefinition::new(Self::TYPE, Self::DEFAULT_NAMESPACE)
            .without_aliases(&["dhcpl", "dhcpls"])
            .with_aliases(&["dhcp4lease", "dhcp4leases"])
            .with_columns(&[
                ("Address", "{.address}"),
                ("Server", "{.server}"),
                ("Lease", "{.leaseTime}"),
            ])
    }
}

/// A `DHCP4Lease` resource.
pub type Dhcp4Lease = Resource<Dhcp4LeaseSpec>;

/// The lease in memory is the spec.
pub type Lease = Dhcp4LeaseSpec;

/// Seconds since the epoch of `t` (0 before the epoch).
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Dhcp4LeaseSpec {
    /// The lease granted by an ACK received at `now` on `link`; `None` if the reply is not an ACK
    /// with a server identifier.
    pub fn from_ack(link: &str, ack: &Reply, now: SystemTime) -> Option<Self> {
        let server = ack.server?;
        let o = &ack.options;
        let lease_time = o
            .lease_time
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_LEASE_TIME);
        let (renewal, rebinding) = timers(lease_time, o.renewal, o.rebinding);
        let prefix_len = o
            .subnet_mask
            .map(|m| {
                let bits = u32::from(m);
                let ones = bits.leading_ones();
                if ones > 0 && bits.checked_shl(ones).unwrap_or(0) == 0 {
                    u8::try_from(ones).unwrap_or(32)
                } else {
                    32
                }
            })
            .unwrap_or(32);
        Some(Self {
            link_name: link.to_string(),
            address: ack.address,
            prefix_len,
            server,
            routers: o.routers.clone(),
            classless_routes: o
                .classless_routes
                .iter()
                .map(|(d, l, g)| ClasslessRoute {
                    destination: *d,
                    prefix_len: *l,
                    gateway: *g,
                })
                .collect(),
            dns: o.dns.clone(),
            search: o.search.clone(),
            hostname: o.hostname.clone(),
            domain: o.domain.clone(),
            ntp: o.ntp.clone(),
            mtu: o.mtu,
            lease_time,
            renewal,
            rebinding,
            acquired: unix(now),
        })
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

    /// Time until the lease expires.
    pub fn until_expiry(&self, now: SystemTime) -> Duration {
        self.until(self.lease_time, now)
    }

    /// Whether the lease has expired at `now`.
    pub fn expired(&self, now: SystemTime) -> bool {
        self.until_expiry(now).is_zero()
    }

    /// The same grant: address, prefix, server and options (not the timestamps). A renewal that
    /// returns the same grant changes nothing downstream.
    pub fn same_grant(&self, other: &Self) -> bool {
        let strip = |l: &Self| Self {
            acquired: 0,
            lease_time: 0,
            renewal: 0,
            rebinding: 0,
            ..l.clone()
        };
        strip(self) == strip(other)
    }
}

/// T1 and T2 (RFC 2131 §4.4.5): the server's values if sane (T1 < T2 < lease), else half and
/// seven eighths of the lease.
pub fn timers(lease: u32, t1: Option<u32>, t2: Option<u32>) -> (u32, u32) {
    let d1 = lease / 2;
    let d2 = u32::try_from(u64::from(lease) * 7 / 8).unwrap_or(u32::MAX);
    let t2 = t2.filter(|t| *t > 0 && *t < lease).unwrap_or(d2);
    let t1 = t1.filter(|t| *t > 0 && *t < t2).unwrap_or(d1.min(t2));
    (t1, t2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp::packet::LeaseOptions;
    use dhcproto::v4::MessageType;

    fn ack(opts: LeaseOptions) -> Reply {
        Reply {
            kind: MessageType::Ack,
            address: Ipv4Addr::new(10, 0, 0, 5),
            server: Some(Ipv4Addr::new(10, 0, 0, 1)),
            options: opts,
        }
    }

    #[test]
    fn timers_follow_rfc_defaults_and_reject_nonsense() {
        assert_eq!(timers(3600, None, None), (1800, 3150));
        assert_eq!(timers(3600, Some(100), Some(200)), (100, 200));
        assert_eq!(timers(3600, Some(5000), Some(9000)), (1800, 3150));
        assert_eq!(timers(3600, Some(3200), None), (1800, 3150));
        assert_eq!(timers(u32::MAX, None, None).1, 3_758_096_383);
    }

    #[test]
    fn addresses_are_stored_as_text() {
        let l = Lease::from_ack(
            "eth0",
            &ack(LeaseOptions {
                routers: vec![Ipv4Addr::new(10, 0, 0, 1)],
                ..LeaseOptions::default()
            }),
            UNIX_EPOCH,
        )
        .expect("lease");
        let bytes = cosi::resource::encode_spec(&l).expect("encode");
        let v = cosi::resource::spec_to_value(&bytes).expect("value");
        assert_eq!(v["address"], "10.0.0.5");
        assert_eq!(v["routers"][0], "10.0.0.1");
        assert_eq!(
            cosi::resource::decode_spec::<Lease>(&bytes).expect("decode"),
            l
        );
    }

    #[test]
    fn lease_from_ack() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let l = Lease::from_ack(
            "eth0",
            &ack(LeaseOptions {
                subnet_mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
                lease_time: Some(120),
                ..LeaseOptions::default()
            }),
            now,
        )
        .expect("lease");
        assert_eq!(l.prefix_len, 24);
        assert_eq!((l.renewal, l.rebinding), (60, 105));
        assert_eq!(l.until_renewal(now), Duration::from_secs(60));
        assert!(!l.expired(now + Duration::from_secs(119)));
        assert!(l.expired(now + Duration::from_secs(120)));

        let l = Lease::from_ack(
            "eth0",
            &ack(LeaseOptions {
                subnet_mask: Some(Ipv4Addr::new(255, 0, 255, 0)),
                ..LeaseOptions::default()
            }),
            now,
        )
        .expect("lease");
        assert_eq!(l.prefix_len, 32, "non-contiguous mask");
        assert_eq!(l.lease_time, DEFAULT_LEASE_TIME);
        let mut r = ack(LeaseOptions::default());
        r.server = None;
        assert!(Lease::from_ack("eth0", &r, now).is_none());
    }
}
