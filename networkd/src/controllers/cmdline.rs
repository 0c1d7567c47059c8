//! Network settings of the kernel command line (upstream `network/cmdline.go`): `ip=`,
//! `bond=`, `vlan=`, `talos.hostname=`, `talos.network.interface.ignore=`.
//!
//! Parsing is all or nothing: a malformed argument makes the whole command line network
//! configuration void (reported, never fatal), as upstream.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use machinery::resources::network::{vlan_link_name, BondMasterSpec, LinkSpecSpec};

/// One `ip=` argument.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpArg {
    /// Static address (field 0 with the netmask of field 3).
    pub address: Option<IpNet>,
    /// Gateway (field 2).
    pub gateway: Option<IpAddr>,
    /// Hostname (field 4).
    pub hostname: Option<String>,
    /// Device (field 5); `None` picks the first physical link by name.
    pub device: Option<String>,
    /// Autoconfiguration `dhcp` (field 6, or the `<dev>:dhcp` short form).
    pub dhcp: bool,
    /// DNS servers (fields 7 and 8).
    pub dns: Vec<IpAddr>,
    /// NTP server (field 9).
    pub ntp: Vec<String>,
}

/// A `bond=` argument.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BondArg {
    /// Bond name.
    pub name: String,
    /// Members (default `eth0,eth1`).
    pub slaves: Vec<String>,
    /// Options, kernel defaults filled in.
    pub spec: BondMasterSpec,
    /// MTU.
    pub mtu: u32,
}

/// A `vlan=` argument.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VlanArg {
    /// The VLAN link name (upstream `VLANLinkName(parent, vid)`).
    pub link: String,
    /// Parent link.
    pub parent: String,
    /// VLAN ID.
    pub vid: u16,
}

/// The network settings of a kernel command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmdlineNetwork {
    /// `talos.hostname=`.
    pub hostname: Option<String>,
    /// `talos.network.interface.ignore=` (repeatable).
    pub ignore: Vec<String>,
    /// `ip=` arguments in order (the index is the route metric offset).
    pub ips: Vec<IpArg>,
    /// `bond=` arguments.
    pub bonds: Vec<BondArg>,
    /// `vlan=` arguments.
    pub vlans: Vec<VlanArg>,
}

impl CmdlineNetwork {
    /// The hostname from `talos.hostname=`, else from the first `ip=` that has one.
    pub fn effective_hostname(&self) -> Option<&str> {
        self.hostname
            .as_deref()
            .or_else(|| self.ips.iter().find_map(|ip| ip.hostname.as_deref()))
    }

    /// Whether `link` is in `talos.network.interface.ignore=`.
    pub fn is_ignored(&self, link: &str) -> bool {
        self.ignore.iter().any(|i| i == link)
    }

    /// Parses the network arguments of a kernel command line.
    ///
    /// # Errors
    ///
    /// Every malformed network argument, as text.
    pub fn parse(cmdline: &str) -> Result<Self, Vec<String>> {
        let mut out = Self::default();
        let mut errors = Vec::new();
        for arg in cmdline.split_whitespace() {
            let Some((key, value)) = arg.split_once('=') else {
                continue;
            };
            let result = match key {
                "ip" => parse_ip(value).map(|ip| out.ips.extend(ip)),
                "bond" => parse_bond(value).map(|b| out.bonds.push(b)),
                "vlan" => parse_vlan(value).map(|v| out.vlans.push(v)),
                "talos.hostname" if !value.is_empty() => {
                    out.hostname = Some(value.to_string());
                    Ok(())
                }
                "talos.network.interface.ignore" if !value.is_empty() => {
                    out.ignore.push(value.to_string());
                    Ok(())
                }
                _ => Ok(()),
            };
            if let Err(e) = result {
                errors.push(format!("{key}={value}: {e}"));
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors)
        }
    }
}

/// Splits at `:` outside `[...]`, and strips the brackets.
fn split_fields(value: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut depth = 0u32;
    for c in value.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ':' if depth == 0 => fields.push(String::new()),
            c => {
                if let Some(last) = fields.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    fields
}

fn parse_ip(value: &str) -> Result<Option<IpArg>, String> {
    let fields = split_fields(value);
    let field = |i: usize| fields.get(i).map(String::as_str).unwrap_or("");
    // `ip=dhcp` (and the other bare autoconf words): default DHCP covers it.
    if fields.len() == 1 {
        return match value {
            "dhcp" | "on" | "any" | "dhcp6" | "auto6" | "off" | "none" | "" => Ok(None),
            _ => Err("expected <client-ip>:<server-ip>:<gw-ip>:<netmask>:<hostname>:<device>:<autoconf>...".into()),
        };
    }
    // `ip=<dev>:dhcp`.
    if fields.len() == 2 && field(1) == "dhcp" {
        return Ok(Some(IpArg {
            device: Some(field(0).to_string()).filter(|d| !d.is_empty()),
            dhcp: true,
            ..Default::default()
        }));
    }
    let mut arg = IpArg::default();
    let addr: Option<IpAddr> = match field(0) {
        "" => None,
        s => Some(
            s.parse()
                .map_err(|_| format!("invalid client address {s:?}"))?,
        ),
    };
    arg.gateway = match field(2) {
        "" => None,
        s => Some(s.parse().map_err(|_| format!("invalid gateway {s:?}"))?),
    };
    if let Some(addr) = addr {
        let bits = match field(3) {
            "" => match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
            s => netmask_bits(s).ok_or_else(|| format!("invalid netmask {s:?}"))?,
        };
        arg.address =
            Some(IpNet::new(addr, bits).map_err(|_| format!("invalid prefix length {bits}"))?);
    }
    arg.hostname = Some(field(4).to_string()).filter(|h| !h.is_empty());
    arg.device = Some(field(5).to_string()).filter(|d| !d.is_empty());
    arg.dhcp = matches!(field(6), "dhcp" | "on" | "any");
    for i in [7, 8] {
        if !field(i).is_empty() {
            arg.dns.push(
                field(i)
                    .parse()
                    .map_err(|_| format!("invalid DNS server {:?}", field(i)))?,
            );
        }
    }
    if !field(9).is_empty() {
        arg.ntp.push(field(9).to_string());
    }
    Ok(Some(arg))
}

/// A netmask as a dotted IPv4 mask or a prefix length.
fn netmask_bits(s: &str) -> Option<u8> {
    if let Ok(bits) = s.parse::<u8>() {
        return (bits <= 128).then_some(bits);
    }
    let mask: Ipv4Addr = s.parse().ok()?;
    let m = u32::from(mask);
    // A valid mask is ones then zeros.
    (m.leading_ones() + m.trailing_zeros() == 32)
        .then(|| u8::try_from(m.leading_ones()).ok())
        .flatten()
}

fn parse_bond(value: &str) -> Result<BondArg, String> {
    let fields: Vec<&str> = value.splitn(4, ':').collect();
    let name = fields.first().copied().unwrap_or_default();
    if name.is_empty() {
        return Err("bond name is required".into());
    }
    let slaves: Vec<String> = match fields.get(1).copied().unwrap_or_default() {
        "" => vec!["eth0".into(), "eth1".into()],
        s => s.split(',').map(str::to_string).collect(),
    };
    let mut spec = BondMasterSpec::default();
    for opt in fields
        .get(2)
        .copied()
        .unwrap_or_default()
        .split(',')
        .filter(|o| !o.is_empty())
    {
        let (k, v) = opt
            .split_once('=')
            .ok_or_else(|| format!("bond option {opt:?} is not key=value"))?;
        let bad = |_| format!("invalid value {v:?} for bond option {k}");
        let num = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("invalid number {v:?} for bond option {k}"))
        };
        let small = |v: &str| {
            v.parse::<u8>()
                .map_err(|_| format!("invalid number {v:?} for bond option {k}"))
        };
        match k {
            "mode" => spec.mode = v.parse().map_err(bad)?,
            "xmit_hash_policy" => spec.xmit_hash_policy = v.parse().map_err(bad)?,
            "lacp_rate" => spec.lacp_rate = v.parse().map_err(bad)?,
            "arp_validate" => spec.arp_validate = v.parse().map_err(bad)?,
            "arp_all_targets" => spec.arp_all_targets = v.parse().map_err(bad)?,
            "primary" => spec.primary = v.to_string(),
            "primary_reselect" => spec.primary_reselect = v.parse().map_err(bad)?,
            "fail_over_mac" => spec.fail_over_mac = v.parse().map_err(bad)?,
            "ad_select" => spec.ad_select = v.parse().map_err(bad)?,
            "miimon" => spec.miimon = num(v)?,
            "updelay" => spec.updelay = num(v)?,
            "downdelay" => spec.downdelay = num(v)?,
            "arp_interval" => spec.arp_interval = num(v)?,
            "resend_igmp" => spec.resend_igmp = num(v)?,
            "min_links" => spec.min_links = num(v)?,
            "lp_interval" => spec.lp_interval = num(v)?,
            "packets_per_slave" => spec.packets_per_slave = num(v)?,
            "num_grat_arp" | "num_unsol_na" => spec.num_peer_notif = small(v)?,
            "all_slaves_active" => spec.all_slaves_active = small(v)?,
            "use_carrier" => spec.use_carrier = num(v)? != 0,
            "arp_ip_target" => {
                for t in v.split(';').filter(|t| !t.is_empty()) {
                    spec.arp_ip_targets.push(
                        t.parse()
                            .map_err(|_| format!("invalid arp_ip_target {t:?}"))?,
                    );
                }
            }
            other => return Err(format!("unknown bond option {other:?}")),
        }
    }
    spec.fill_defaults();
    let mtu = match fields.get(3).copied().unwrap_or_default() {
        "" => 0,
        s => s.parse().map_err(|_| format!("invalid MTU {s:?}"))?,
    };
    Ok(BondArg {
        name: name.to_string(),
        slaves,
        spec,
        mtu,
    })
}

fn parse_vlan(value: &str) -> Result<VlanArg, String> {
    let (name, parent) = value
        .split_once(':')
        .ok_or("expected vlan=<name>:<parent>")?;
    if parent.is_empty() {
        return Err("parent link is required".into());
    }
    let vid_text = name
        .rsplit_once('.')
        .map(|(_, v)| v)
        .or_else(|| name.strip_prefix("vlan"))
        .ok_or_else(|| format!("VLAN name {name:?} is neither <link>.<id> nor vlan<id>"))?;
    let vid: u16 = vid_text
        .parse()
        .ok()
        .filter(|v| (1..=4095).contains(v))
        .ok_or_else(|| format!("invalid VLAN ID {vid_text:?}"))?;
    Ok(VlanArg {
        link: vlan_link_name(parent, vid),
        parent: parent.to_string(),
        vid,
    })
}

/// A LinkSpec candidate for a bond created from the command line; kept here so the parser
/// and the spec agree on the kind.
pub fn bond_link(b: &BondArg) -> LinkSpecSpec {
    use machinery::resources::network::{ConfigLayer, LinkType, KIND_BOND};
    LinkSpecSpec {
        name: b.name.clone(),
        logical: true,
        up: true,
        mtu: b.mtu,
        kind: KIND_BOND.into(),
        r#type: LinkType::ETHER,
        bond_master: b.spec.clone(),
        layer: ConfigLayer::Cmdline,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::network::BondMode;

    #[test]
    fn full_ip_form() {
        let c = CmdlineNetwork::parse(
            "console=ttyS0 ip=172.20.0.2::172.20.0.1:255.255.255.0:master-1:eth1::10.0.0.53:1.1.1.1:pool.ntp.org talos.hostname=node-x",
        )
        .expect("valid");
        let ip = &c.ips[0];
        assert_eq!(ip.address, Some("172.20.0.2/24".parse().expect("net")));
        assert_eq!(ip.gateway, Some("172.20.0.1".parse().expect("ip")));
        assert_eq!(ip.device.as_deref(), Some("eth1"));
        assert_eq!(ip.dns.len(), 2);
        assert_eq!(ip.ntp, ["pool.ntp.org"]);
        assert_eq!(c.effective_hostname(), Some("node-x"));
    }

    #[test]
    fn short_forms_brackets_and_prefix_lengths() {
        let c =
            CmdlineNetwork::parse("ip=dhcp ip=eth2:dhcp ip=[2001:db8::2]::[2001:db8::1]:64::eth3")
                .expect("valid");
        assert_eq!(c.ips.len(), 2);
        assert!(c.ips[0].dhcp);
        assert_eq!(c.ips[0].device.as_deref(), Some("eth2"));
        assert_eq!(
            c.ips[1].address,
            Some("2001:db8::2/64".parse().expect("net"))
        );
        assert_eq!(c.ips[1].gateway, Some("2001:db8::1".parse().expect("ip")));
        assert_eq!(c.effective_hostname(), None);
    }

    #[test]
    fn bonds_and_vlans() {
        let c = CmdlineNetwork::parse(
            "bond=bond1:eth3,eth4:mode=802.3ad,lacp_rate=fast,arp_ip_target=10.0.0.1;10.0.0.2:9000 vlan=eth0.100:eth0 vlan=vlan5:eth1 talos.network.interface.ignore=eth9",
        )
        .expect("valid");
        let b = &c.bonds[0];
        assert_eq!(b.slaves, ["eth3", "eth4"]);
        assert_eq!(b.spec.mode, BondMode::Lacp);
        assert_eq!(b.spec.arp_ip_targets.len(), 2);
        assert_eq!(b.mtu, 9000);
        assert_eq!(c.vlans[0].link, "eth0.100");
        assert_eq!(c.vlans[1].vid, 5);
        assert!(c.is_ignored("eth9"));
        assert_eq!(
            CmdlineNetwork::parse("bond=bond0").expect("valid").bonds[0].slaves,
            ["eth0", "eth1"]
        );
    }

    #[test]
    fn errors_void_everything() {
        let errors =
            CmdlineNetwork::parse("ip=1.2.3.4::x:24 bond=b0:eth0:speed=fast vlan=eth0.9999:eth0")
                .expect_err("invalid");
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(CmdlineNetwork::parse("ip=1.2.3.4::1.2.3.1:255.0.255.0").is_err());
    }
}
