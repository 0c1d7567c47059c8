//! Every network resource ID, built in one place, byte for byte as upstream
//! (`pkg/machinery/resources/network/network.go`).

use std::net::IpAddr;

use ipnet::IpNet;

use super::config_layer::ConfigLayer;
use super::nethelpers::{Family, RoutingTable};
use super::operator_spec::Operator;

/// ID of the merged HostnameSpec and of HostnameStatus.
pub const HOSTNAME_ID: &str = "hostname";
/// ID of the merged ResolverSpec and of ResolverStatus.
pub const RESOLVER_ID: &str = "resolvers";
/// ID of the merged TimeServerSpec and of TimeServerStatus.
pub const TIME_SERVER_ID: &str = "timeservers";
/// ID of the network Status.
pub const STATUS_ID: &str = "status";
/// Default route metric (priority) of static, cmdline and DHCP routes.
pub const DEFAULT_ROUTE_METRIC: u32 = 1024;

/// NodeAddress `default`: the sticky first address (`/etc/hosts`, `talos-<ip>` hostname).
pub const NODE_ADDRESS_DEFAULT_ID: &str = "default";
/// NodeAddress `current`: addresses on links that are up.
pub const NODE_ADDRESS_CURRENT_ID: &str = "current";
/// NodeAddress `routed`: `current` without external (platform) addresses.
pub const NODE_ADDRESS_ROUTED_ID: &str = "routed";
/// NodeAddress `accumulative`: every address ever seen; never shrinks.
pub const NODE_ADDRESS_ACCUMULATIVE_ID: &str = "accumulative";
/// NodeAddressFilter that excludes the pod and service networks.
pub const FILTER_NO_K8S: &str = "no-k8s";
/// NodeAddressFilter that keeps only the pod and service networks.
pub const FILTER_ONLY_K8S: &str = "only-k8s";

/// EtcFileSpec of `/etc/hosts`.
pub const ETC_HOSTS_ID: &str = "hosts";
/// EtcFileSpec of `/etc/resolv.conf`.
pub const ETC_RESOLV_CONF_ID: &str = "resolv.conf";
/// EtcFileSpec of `/etc/hostname`.
pub const ETC_HOSTNAME_ID: &str = "hostname";

/// `eth0/10.0.0.2/24`: the ID of an AddressSpec or AddressStatus (upstream `AddressID`).
pub fn address_id(link: &str, address: &IpNet) -> String {
    format!("{link}/{address}")
}

/// The ID of a LinkSpec or LinkStatus: the link name (upstream `LinkID`).
pub fn link_id(name: &str) -> String {
    name.to_string()
}

/// The ID of a RouteSpec or RouteStatus (upstream `RouteID`):
/// `[<table>/ if table != main][<outLink>/ if inet6]<family>/<gateway>/<destination>/<priority>`,
/// an absent gateway or destination (the default route) printing as `""`.
///
/// Examples: `inet4/10.5.0.3//50`, `inet4/10.0.0.34/10.0.0.35/32/1024`,
/// `eth2/inet6/2001:db8::1//1024`, `101/enp0s3/inet6///200`. The out-link is in IPv6 IDs
/// because link-local gateways are unique only per link.
pub fn route_id(
    table: RoutingTable,
    family: Family,
    destination: Option<&IpNet>,
    gateway: Option<&IpAddr>,
    priority: u32,
    out_link: &str,
) -> String {
    let mut id = String::new();
    if table != RoutingTable::MAIN {
        id.push_str(&table.to_string());
        id.push('/');
    }
    if family == Family::Inet6 && !out_link.is_empty() {
        id.push_str(out_link);
        id.push('/');
    }
    let gateway = gateway.map(ToString::to_string).unwrap_or_default();
    let destination = destination.map(ToString::to_string).unwrap_or_default();
    id.push_str(&format!("{family}/{gateway}/{destination}/{priority}"));
    id
}

/// `dhcp4/eth0`, `dhcp6/eth0`: the ID of a DHCP OperatorSpec, and the prefix of the specs the
/// operator writes to `network-config` (upstream `OperatorID` for DHCP).
pub fn operator_id(operator: Operator, link: &str) -> String {
    format!("{operator}/{link}")
}

/// `vip/eth0/10.0.0.100`: the ID of a VIP OperatorSpec.
pub fn vip_operator_id(link: &str, ip: &IpAddr) -> String {
    format!("{}/{link}/{ip}", Operator::Vip)
}

/// `configuration/eth0/10.0.0.2/24`: the ID of a candidate in `network-config` written by a
/// config controller (upstream `LayeredID`).
pub fn layered_id(layer: ConfigLayer, id: &str) -> String {
    format!("{layer}/{id}")
}

/// `dhcp4/eth0/eth0/10.0.0.5/24`: the ID of a candidate in `network-config` written by an
/// operator, under the operator's prefix (`dhcp4/eth0`, `vip/eth0`); operator specs do not
/// use [`layered_id`], though their layer is `operator`.
pub fn operator_prefixed_id(prefix: &str, id: &str) -> String {
    format!("{prefix}/{id}")
}

/// `routed-no-k8s`: the ID of a filtered NodeAddress (upstream `FilteredNodeAddressID`).
pub fn filtered_node_address_id(kind: &str, filter: &str) -> String {
    format!("{kind}-{filter}")
}

/// The name of a VLAN link on `base` (upstream `VLANLinkName`): `<base>.<vid>` if it fits the
/// kernel's 15-byte limit, otherwise `<first 4 bytes of base><hex of sha256(base)>.<vid>` cut
/// to fit.
pub fn vlan_link_name(base: &str, vid: u16) -> String {
    const MAX: usize = 15;
    let plain = format!("{base}.{vid}");
    if plain.len() <= MAX {
        return plain;
    }
    let suffix = format!(".{vid}");
    let head: String = base.chars().take(4).collect();
    let room = MAX.saturating_sub(head.len() + suffix.len());
    let hash: String = hex(&sha256(base.as_bytes())).chars().take(room).collect();
    format!("{head}{hash}{suffix}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (FIPS 180-4), small and dependency-free; used only for VLAN link names.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for chunk in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in chunk.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, v) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(v);
        }
    }
    let mut out = [0u8; 32];
    for (i, v) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("prefix")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn ids_as_upstream() {
        assert_eq!(
            address_id("eth0", &net("192.168.1.10/24")),
            "eth0/192.168.1.10/24"
        );
        assert_eq!(
            route_id(
                RoutingTable::MAIN,
                Family::Inet4,
                None,
                Some(&ip("10.5.0.3")),
                50,
                "eth0"
            ),
            "inet4/10.5.0.3//50"
        );
        assert_eq!(
            route_id(
                RoutingTable::MAIN,
                Family::Inet4,
                Some(&net("10.0.0.35/32")),
                Some(&ip("10.0.0.34")),
                1024,
                "eth0"
            ),
            "inet4/10.0.0.34/10.0.0.35/32/1024"
        );
        assert_eq!(
            route_id(
                RoutingTable::MAIN,
                Family::Inet6,
                None,
                Some(&ip("2001:db8::1")),
                1024,
                "eth2"
            ),
            "eth2/inet6/2001:db8::1//1024"
        );
        assert_eq!(
            route_id(RoutingTable(101), Family::Inet6, None, None, 200, "enp0s3"),
            "101/enp0s3/inet6///200"
        );
        assert_eq!(operator_id(Operator::Dhcp4, "eth0"), "dhcp4/eth0");
        assert_eq!(
            vip_operator_id("eth0", &ip("10.0.0.100")),
            "vip/eth0/10.0.0.100"
        );
        assert_eq!(
            layered_id(
                ConfigLayer::Configuration,
                &address_id("eth0", &net("10.0.0.2/24"))
            ),
            "configuration/eth0/10.0.0.2/24"
        );
        assert_eq!(layered_id(ConfigLayer::Default, "lo"), "default/lo");
        assert_eq!(
            layered_id(ConfigLayer::Cmdline, HOSTNAME_ID),
            "cmdline/hostname"
        );
        assert_eq!(
            layered_id(ConfigLayer::Default, &operator_id(Operator::Dhcp4, "eth1")),
            "default/dhcp4/eth1"
        );
        assert_eq!(
            operator_prefixed_id(
                &operator_id(Operator::Dhcp4, "eth0"),
                &address_id("eth0", &net("10.0.0.5/24"))
            ),
            "dhcp4/eth0/eth0/10.0.0.5/24"
        );
        assert_eq!(
            filtered_node_address_id(NODE_ADDRESS_ROUTED_ID, FILTER_NO_K8S),
            "routed-no-k8s"
        );
    }

    #[test]
    fn sha256_known_answers() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn vlan_names_fit_the_kernel_limit() {
        assert_eq!(vlan_link_name("eth0", 10), "eth0.10");
        let long = vlan_link_name("enp0s31f6abcdef", 4094);
        assert_eq!(long.len(), 15);
        assert!(long.starts_with("enp0"));
        assert!(long.ends_with(".4094"));
        assert_eq!(long, vlan_link_name("enp0s31f6abcdef", 4094), "stable");
    }
}
