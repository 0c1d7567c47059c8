//! Small value types shared by the network resources (upstream `pkg/machinery/nethelpers`):
//! families, scopes, flags, link types, bond and route enums. Every enum serializes as
//! upstream's string form, so `talosctl get -o yaml` shows the same words as Talos.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A string that is not one of an enum's names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownValue {
    /// Which enum.
    pub what: &'static str,
    /// The rejected text.
    pub value: String,
}

/// Declares an enum whose serde, `Display` and `FromStr` forms are upstream's strings.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident : $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal $(| $alias:literal)* ),+ $(,)?
        }
        default $default:ident
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// Upstream's string form.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::resources::network::nethelpers::UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text $(| $alias)* => Ok($name::$variant), )+
                    _ => Err($crate::resources::network::nethelpers::UnknownValue { what: $what, value: s.to_string() }),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use string_enum;

string_enum! {
    /// Address family (`AF_INET` = 2, `AF_INET6` = 10).
    Family: "address family" {
        /// No family (unset).
        Unspec = "unspec",
        /// IPv4.
        Inet4 = "inet4",
        /// IPv6.
        Inet6 = "inet6",
    }
    default Unspec
}

impl Family {
    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Family::Inet4,
            IpAddr::V6(_) => Family::Inet6,
        }
    }

    /// The kernel's `AF_*` number.
    pub fn number(self) -> u8 {
        match self {
            Family::Unspec => 0,
            Family::Inet4 => 2,
            Family::Inet6 => 10,
        }
    }
}

string_enum! {
    /// Address and route scope (`RT_SCOPE_*`).
    Scope: "scope" {
        /// `RT_SCOPE_UNIVERSE` (0).
        Global = "global",
        /// `RT_SCOPE_SITE` (200).
        Site = "site",
        /// `RT_SCOPE_LINK` (253).
        Link = "link",
        /// `RT_SCOPE_HOST` (254).
        Host = "host",
        /// `RT_SCOPE_NOWHERE` (255).
        Nowhere = "nowhere",
    }
    default Global
}

impl Scope {
    /// The kernel's `RT_SCOPE_*` number.
    pub fn number(self) -> u8 {
        match self {
            Scope::Global => 0,
            Scope::Site => 200,
            Scope::Link => 253,
            Scope::Host => 254,
            Scope::Nowhere => 255,
        }
    }

    /// The scope of a kernel number; unknown numbers are `None`.
    pub fn from_number(n: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.number() == n)
    }
}

/// Declares a bit-flag newtype that serializes as upstream's comma-separated names.
macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        $name:ident($repr:ty) { $( $(#[$fmeta:meta])* $flag:ident = $bit:expr, $text:literal; )+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub $repr);

        impl $name {
            $( $(#[$fmeta])* pub const $flag: $name = $name($bit); )+
            const NAMES: &'static [($repr, &'static str)] = &[$(($bit, $text)),+];

            /// No flag.
            pub const fn empty() -> Self {
                $name(0)
            }

            /// Whether every flag of `other` is set.
            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether no flag is set.
            pub fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl std::ops::BitAnd for $name {
            type Output = $name;
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut rest = self.0;
                let mut first = true;
                for (bit, text) in Self::NAMES {
                    if rest & bit != 0 {
                        if !first {
                            f.write_str(",")?;
                        }
                        f.write_str(text)?;
                        first = false;
                        rest &= !bit;
                    }
                }
                if rest != 0 {
                    if !first {
                        f.write_str(",")?;
                    }
                    write!(f, "0x{rest:x}")?;
                }
                Ok(())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let mut out: $repr = 0;
                for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    if let Some((bit, _)) = Self::NAMES.iter().find(|(_, t)| *t == part) {
                        out |= bit;
                    } else if let Some(hex) = part.strip_prefix("0x") {
                        out |= <$repr>::from_str_radix(hex, 16).map_err(|_| UnknownValue {
                            what: stringify!($name),
                            value: part.to_string(),
                        })?;
                    } else {
                        return Err(UnknownValue { what: stringify!($name), value: part.to_string() });
                    }
                }
                Ok($name(out))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

flag_set! {
    /// Address flags (`IFA_F_*`).
    AddressFlags(u32) {
        /// `IFA_F_SECONDARY` / `IFA_F_TEMPORARY`.
        TEMPORARY = 0x01, "temporary";
        /// `IFA_F_NODAD`.
        NODAD = 0x02, "nodad";
        /// `IFA_F_OPTIMISTIC`.
        OPTIMISTIC = 0x04, "optimistic";
        /// `IFA_F_DADFAILED`.
        DADFAILED = 0x08, "dadfailed";
        /// `IFA_F_HOMEADDRESS`.
        HOMEADDRESS = 0x10, "homeaddress";
        /// `IFA_F_DEPRECATED`.
        DEPRECATED = 0x20, "deprecated";
        /// `IFA_F_TENTATIVE`.
        TENTATIVE = 0x40, "tentative";
        /// `IFA_F_PERMANENT`.
        PERMANENT = 0x80, "permanent";
        /// `IFA_F_MANAGETEMPADDR`.
        MANAGETEMPADDR = 0x100, "mngmtmpaddr";
        /// `IFA_F_NOPREFIXROUTE`.
        NOPREFIXROUTE = 0x200, "noprefixroute";
        /// `IFA_F_MCAUTOJOIN`.
        MCAUTOJOIN = 0x400, "mcautojoin";
        /// `IFA_F_STABLE_PRIVACY`.
        STABLE_PRIVACY = 0x800, "stableprivacy";
    }
}

impl AddressFlags {
    /// The flags a spec may set and the Spec controller compares; everything else is the
    /// kernel's (secondary, tentative, deprecated, dadfailed ...) and is never enforced
    /// (upstream issue #13932).
    pub const MANAGED: AddressFlags = AddressFlags(0x80 | 0x02 | 0x10 | 0x100 | 0x200 | 0x400);

    /// Only the managed flags.
    pub fn managed(self) -> AddressFlags {
        self & Self::MANAGED
    }
}

flag_set! {
    /// Link flags (`IFF_*`), as upstream prints them.
    LinkFlags(u32) {
        /// `IFF_UP`.
        UP = 0x1, "UP";
        /// `IFF_BROADCAST`.
        BROADCAST = 0x2, "BROADCAST";
        /// `IFF_DEBUG`.
        DEBUG = 0x4, "DEBUG";
        /// `IFF_LOOPBACK`.
        LOOPBACK = 0x8, "LOOPBACK";
        /// `IFF_POINTOPOINT`.
        POINTOPOINT = 0x10, "POINTOPOINT";
        /// `IFF_NOTRAILERS`.
        NOTRAILERS = 0x20, "NOTRAILERS";
        /// `IFF_RUNNING`.
        RUNNING = 0x40, "RUNNING";
        /// `IFF_NOARP`.
        NOARP = 0x80, "NOARP";
        /// `IFF_PROMISC`.
        PROMISC = 0x100, "PROMISC";
        /// `IFF_ALLMULTI`.
        ALLMULTI = 0x200, "ALLMULTI";
        /// `IFF_MASTER`.
        MASTER = 0x400, "MASTER";
        /// `IFF_SLAVE`.
        SLAVE = 0x800, "SLAVE";
        /// `IFF_MULTICAST`.
        MULTICAST = 0x1000, "MULTICAST";
        /// `IFF_PORTSEL`.
        PORTSEL = 0x2000, "PORTSEL";
        /// `IFF_AUTOMEDIA`.
        AUTOMEDIA = 0x4000, "AUTOMEDIA";
        /// `IFF_DYNAMIC`.
        DYNAMIC = 0x8000, "DYNAMIC";
        /// `IFF_LOWER_UP`.
        LOWER_UP = 0x10000, "LOWER_UP";
        /// `IFF_DORMANT`.
        DORMANT = 0x20000, "DORMANT";
        /// `IFF_ECHO`.
        ECHO = 0x40000, "ECHO";
    }
}

flag_set! {
    /// Route flags (`RTM_F_*` in the header).
    RouteFlags(u32) {
        /// `RTNH_F_DEAD`.
        DEAD = 0x1, "dead";
        /// `RTNH_F_PERVASIVE`.
        PERVASIVE = 0x2, "pervasive";
        /// `RTNH_F_ONLINK`.
        ONLINK = 0x4, "onlink";
        /// `RTNH_F_OFFLOAD`.
        OFFLOAD = 0x8, "offload";
        /// `RTNH_F_LINKDOWN`.
        LINKDOWN = 0x10, "linkdown";
        /// `RTNH_F_UNRESOLVED`.
        UNRESOLVED = 0x20, "unresolved";
        /// `RTNH_F_TRAP`.
        TRAP = 0x40, "trap";
        /// `RTM_F_NOTIFY`.
        NOTIFY = 0x100, "notify";
        /// `RTM_F_CLONED`.
        CLONED = 0x200, "cloned";
        /// `RTM_F_EQUALIZE`.
        EQUALIZE = 0x400, "equalize";
        /// `RTM_F_PREFIX`.
        PREFIX = 0x800, "prefix";
        /// `RTM_F_LOOKUP_TABLE`.
        LOOKUP_TABLE = 0x1000, "lookuptable";
        /// `RTM_F_FIB_MATCH`.
        FIB_MATCH = 0x2000, "fibmatch";
        /// `RTM_F_OFFLOAD`.
        RTM_OFFLOAD = 0x4000, "rtmoffload";
        /// `RTM_F_TRAP`.
        RTM_TRAP = 0x8000, "rtmtrap";
    }
}

/// A link type (`ARPHRD_*`), serialized as upstream's name (`ether`, `loopback`, `none` ...),
/// or the number for types without a name here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkType(pub u16);

impl LinkType {
    /// `ARPHRD_NETROM` (0): what an unset type reads as.
    pub const NETROM: LinkType = LinkType(0);
    /// `ARPHRD_ETHER`: Ethernet, also bonds, bridges, VLANs, dummies and veths.
    pub const ETHER: LinkType = LinkType(1);
    /// `ARPHRD_LOOPBACK`.
    pub const LOOPBACK: LinkType = LinkType(772);
    /// `ARPHRD_SIT`.
    pub const SIT: LinkType = LinkType(776);
    /// `ARPHRD_IPGRE`.
    pub const IPGRE: LinkType = LinkType(778);
    /// `ARPHRD_TUNNEL6`.
    pub const TUNNEL6: LinkType = LinkType(769);
    /// `ARPHRD_TUNNEL`.
    pub const TUNNEL: LinkType = LinkType(768);
    /// `ARPHRD_INFINIBAND`.
    pub const INFINIBAND: LinkType = LinkType(32);
    /// `ARPHRD_IEEE80211`.
    pub const IEEE80211: LinkType = LinkType(801);
    /// `ARPHRD_VOID`.
    pub const VOID: LinkType = LinkType(0xffff);
    /// `ARPHRD_NONE`: WireGuard and other layer-3 devices.
    pub const NONE: LinkType = LinkType(0xfffe);

    const NAMES: &'static [(u16, &'static str)] = &[
        (0, "netrom"),
        (1, "ether"),
        (2, "eether"),
        (3, "ax25"),
        (4, "pronet"),
        (5, "chaos"),
        (6, "ieee802"),
        (7, "arcnet"),
        (8, "appletlk"),
        (15, "dlci"),
        (19, "atm"),
        (23, "metricom"),
        (24, "ieee1394"),
        (27, "eui64"),
        (32, "infiniband"),
        (512, "slip"),
        (768, "tunnel"),
        (769, "tunnel6"),
        (772, "loopback"),
        (776, "sit"),
        (778, "ipgre"),
        (801, "ieee80211"),
        (0xffff, "void"),
        (0xfffe, "none"),
    ];
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Self::NAMES.iter().find(|(n, _)| *n == self.0) {
            Some((_, name)) => f.write_str(name),
            None => write!(f, "{}", self.0),
        }
    }
}

impl FromStr for LinkType {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some((n, _)) = Self::NAMES.iter().find(|(_, name)| *name == s) {
            return Ok(LinkType(*n));
        }
        s.parse::<u16>().map(LinkType).map_err(|_| UnknownValue {
            what: "link type",
            value: s.to_string(),
        })
    }
}

impl Serialize for LinkType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LinkType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A hardware (MAC) address, serialized as `aa:bb:cc:dd:ee:ff` (any length).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HardwareAddr(pub Vec<u8>);

impl HardwareAddr {
    /// Whether the address has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for HardwareAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for HardwareAddr {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Ok(HardwareAddr::default());
        }
        s.split([':', '-'])
            .map(|p| {
                if p.len() == 2 {
                    u8::from_str_radix(p, 16).ok()
                } else {
                    None
                }
            })
            .collect::<Option<Vec<u8>>>()
            .map(HardwareAddr)
            .ok_or_else(|| UnknownValue {
                what: "hardware address",
                value: s.to_string(),
            })
    }
}

impl Serialize for HardwareAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HardwareAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

string_enum! {
    /// Operational state of a link (`IF_OPER_*`).
    OperationalState: "operational state" {
        /// `IF_OPER_UNKNOWN` (loopback, dummies, many virtual links).
        Unknown = "unknown",
        /// `IF_OPER_NOTPRESENT`.
        NotPresent = "notPresent",
        /// `IF_OPER_DOWN`.
        Down = "down",
        /// `IF_OPER_LOWERLAYERDOWN`.
        LowerLayerDown = "lowerLayerDown",
        /// `IF_OPER_TESTING`.
        Testing = "testing",
        /// `IF_OPER_DORMANT`.
        Dormant = "dormant",
        /// `IF_OPER_UP`.
        Up = "up",
    }
    default Unknown
}

string_enum! {
    /// VLAN protocol.
    VlanProtocol: "VLAN protocol" {
        /// 802.1Q (0x8100).
        Ieee8021q = "802.1q",
        /// 802.1ad, QinQ (0x88a8).
        Ieee8021ad = "802.1ad",
    }
    default Ieee8021q
}

impl VlanProtocol {
    /// The ethertype.
    pub fn ethertype(self) -> u16 {
        match self {
            VlanProtocol::Ieee8021q => 0x8100,
            VlanProtocol::Ieee8021ad => 0x88a8,
        }
    }
}

string_enum! {
    /// Bonding mode (`IFLA_BOND_MODE`).
    BondMode: "bond mode" {
        /// 0.
        RoundRobin = "balance-rr",
        /// 1.
        ActiveBackup = "active-backup",
        /// 2.
        Xor = "balance-xor",
        /// 3.
        Broadcast = "broadcast",
        /// 4.
        Lacp = "802.3ad",
        /// 5.
        Tlb = "balance-tlb",
        /// 6.
        Alb = "balance-alb",
    }
    default RoundRobin
}

impl BondMode {
    /// The kernel's number.
    pub fn number(self) -> u8 {
        match self {
            BondMode::RoundRobin => 0,
            BondMode::ActiveBackup => 1,
            BondMode::Xor => 2,
            BondMode::Broadcast => 3,
            BondMode::Lacp => 4,
            BondMode::Tlb => 5,
            BondMode::Alb => 6,
        }
    }
}

string_enum! {
    /// Bond transmit hash policy (`IFLA_BOND_XMIT_HASH_POLICY`).
    BondXmitHashPolicy: "bond transmit hash policy" {
        /// 0.
        Layer2 = "layer2",
        /// 1.
        Layer34 = "layer3+4",
        /// 2.
        Layer23 = "layer2+3",
        /// 3.
        Encap23 = "encap2+3",
        /// 4.
        Encap34 = "encap3+4",
        /// 5.
        VlanSrcMac = "vlan+srcmac",
    }
    default Layer2
}

string_enum! {
    /// LACP rate (`IFLA_BOND_AD_LACP_RATE`).
    LacpRate: "LACP rate" {
        /// 0.
        Slow = "slow",
        /// 1.
        Fast = "fast",
    }
    default Slow
}

string_enum! {
    /// ARP validation (`IFLA_BOND_ARP_VALIDATE`).
    ArpValidate: "ARP validate" {
        /// 0.
        None = "none",
        /// 1.
        Active = "active",
        /// 2.
        Backup = "backup",
        /// 3.
        All = "all",
        /// 4.
        Filter = "filter",
        /// 5.
        FilterActive = "filter-active" | "filter_active",
        /// 6.
        FilterBackup = "filter-backup" | "filter_backup",
    }
    default None
}

string_enum! {
    /// ARP all targets (`IFLA_BOND_ARP_ALL_TARGETS`).
    ArpAllTargets: "ARP all targets" {
        /// 0.
        Any = "any",
        /// 1.
        All = "all",
    }
    default Any
}

string_enum! {
    /// Primary reselection (`IFLA_BOND_PRIMARY_RESELECT`).
    PrimaryReselect: "primary reselect" {
        /// 0.
        Always = "always",
        /// 1.
        Better = "better",
        /// 2.
        Failure = "failure",
    }
    default Always
}

string_enum! {
    /// Fail-over MAC policy (`IFLA_BOND_FAIL_OVER_MAC`).
    FailOverMac: "fail over MAC" {
        /// 0.
        None = "none",
        /// 1.
        Active = "active",
        /// 2.
        Follow = "follow",
    }
    default None
}

string_enum! {
    /// 802.3ad aggregator selection (`IFLA_BOND_AD_SELECT`).
    AdSelect: "AD select" {
        /// 0.
        Stable = "stable",
        /// 1.
        Bandwidth = "bandwidth",
        /// 2.
        Count = "count",
    }
    default Stable
}

string_enum! {
    /// LACP active mode (`IFLA_BOND_AD_LACP_ACTIVE`).
    AdLacpActive: "AD LACP active" {
        /// 0.
        Off = "off",
        /// 1.
        On = "on",
    }
    default On
}

/// A routing table (`RT_TABLE_*` or 1..=252), serialized as its name (`main`, `local`, `default`,
/// `unspec`) or number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoutingTable(pub u32);

impl RoutingTable {
    /// `RT_TABLE_UNSPEC`.
    pub const UNSPEC: RoutingTable = RoutingTable(0);
    /// `RT_TABLE_DEFAULT`.
    pub const DEFAULT: RoutingTable = RoutingTable(253);
    /// `RT_TABLE_MAIN`.
    pub const MAIN: RoutingTable = RoutingTable(254);
    /// `RT_TABLE_LOCAL`.
    pub const LOCAL: RoutingTable = RoutingTable(255);
}

impl Default for RoutingTable {
    fn default() -> Self {
        RoutingTable::MAIN
    }
}

impl fmt::Display for RoutingTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("unspec"),
            253 => f.write_str("default"),
            254 => f.write_str("main"),
            255 => f.write_str("local"),
            n => write!(f, "{n}"),
        }
    }
}

impl FromStr for RoutingTable {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(RoutingTable(match s {
            "unspec" => 0,
            "default" => 253,
            "main" => 254,
            "local" => 255,
            n => n.parse().map_err(|_| UnknownValue {
                what: "routing table",
                value: s.to_string(),
            })?,
        }))
    }
}

impl Serialize for RoutingTable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RoutingTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

string_enum! {
    /// Route type (`RTN_*`).
    RouteType: "route type" {
        /// 0.
        Unspec = "unspec",
        /// 1: a gateway or direct route.
        Unicast = "unicast",
        /// 2.
        Local = "local",
        /// 3.
        Broadcast = "broadcast",
        /// 4.
        Anycast = "anycast",
        /// 5.
        Multicast = "multicast",
        /// 6.
        Blackhole = "blackhole",
        /// 7.
        Unreachable = "unreachable",
        /// 8.
        Prohibit = "prohibit",
        /// 9.
        Throw = "throw",
        /// 10.
        Nat = "nat",
        /// 11.
        XResolve = "xresolve",
    }
    default Unicast
}

impl RouteType {
    /// The kernel's number.
    pub fn number(self) -> u8 {
        // The declaration order is the kernel's numbering.
        Self::ALL
            .iter()
            .position(|t| *t == self)
            .and_then(|p| u8::try_from(p).ok())
            .unwrap_or(0)
    }

    /// The type of a kernel number; unknown numbers are `None`.
    pub fn from_number(n: u8) -> Option<Self> {
        Self::ALL.get(usize::from(n)).copied()
    }
}

/// Who installed a route (`RTPROT_*`), serialized as upstream's name or the number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteProtocol(pub u8);

impl RouteProtocol {
    /// `RTPROT_UNSPEC`.
    pub const UNSPEC: RouteProtocol = RouteProtocol(0);
    /// `RTPROT_REDIRECT`.
    pub const REDIRECT: RouteProtocol = RouteProtocol(1);
    /// `RTPROT_KERNEL`.
    pub const KERNEL: RouteProtocol = RouteProtocol(2);
    /// `RTPROT_BOOT`: cmdline and DHCP routes.
    pub const BOOT: RouteProtocol = RouteProtocol(3);
    /// `RTPROT_STATIC`: machine configuration routes.
    pub const STATIC: RouteProtocol = RouteProtocol(4);
    /// `RTPROT_RA`.
    pub const RA: RouteProtocol = RouteProtocol(9);
    /// `RTPROT_DHCP`.
    pub const DHCP: RouteProtocol = RouteProtocol(16);
    /// `RTPROT_BGP`.
    pub const BGP: RouteProtocol = RouteProtocol(186);

    const NAMES: &'static [(u8, &'static str)] = &[
        (0, "unspec"),
        (1, "redirect"),
        (2, "kernel"),
        (3, "boot"),
        (4, "static"),
        (8, "gated"),
        (9, "ra"),
        (10, "mrt"),
        (11, "zebra"),
        (12, "bird"),
        (13, "dnrouted"),
        (14, "xorp"),
        (15, "ntk"),
        (16, "dhcp"),
        (17, "mrouted"),
        (42, "babel"),
        (186, "bgp"),
        (187, "isis"),
        (188, "ospf"),
        (189, "rip"),
        (192, "eigrp"),
    ];
}

impl fmt::Display for RouteProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Self::NAMES.iter().find(|(n, _)| *n == self.0) {
            Some((_, name)) => f.write_str(name),
            None => write!(f, "{}", self.0),
        }
    }
}

impl FromStr for RouteProtocol {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some((n, _)) = Self::NAMES.iter().find(|(_, name)| *name == s) {
            return Ok(RouteProtocol(*n));
        }
        s.parse::<u8>()
            .map(RouteProtocol)
            .map_err(|_| UnknownValue {
                what: "route protocol",
                value: s.to_string(),
            })
    }
}

impl Serialize for RouteProtocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RouteProtocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

string_enum! {
    /// DHCP client identifier (option 61) kind.
    ClientIdentifier: "client identifier" {
        /// Option 61 omitted (legacy v1alpha1 devices).
        None = "none",
        /// `0x01` + MAC (default-layer operators).
        Mac = "mac",
        /// A DUID given as hex.
        Duid = "duid",
    }
    default None
}

string_enum! {
    /// How node addresses are sorted.
    NodeAddressSortAlgorithm: "node address sort algorithm" {
        /// By address, then prefix length (legacy).
        V1 = "v1",
        /// IPv4 first, longer and more specific prefixes first.
        V2 = "v2",
    }
    default V1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_use_upstream_strings() {
        assert_eq!(Family::Inet6.to_string(), "inet6");
        assert_eq!("802.3ad".parse::<BondMode>(), Ok(BondMode::Lacp));
        assert_eq!(
            "filter_active".parse::<ArpValidate>(),
            Ok(ArpValidate::FilterActive)
        );
        assert!("bogus".parse::<BondMode>().is_err());
        assert_eq!(RouteType::Unicast.number(), 1);
        assert_eq!(RouteType::from_number(6), Some(RouteType::Blackhole));
        assert_eq!(Scope::from_number(253), Some(Scope::Link));
        assert_eq!(RoutingTable::MAIN.to_string(), "main");
        assert_eq!("101".parse::<RoutingTable>(), Ok(RoutingTable(101)));
        assert_eq!(RouteProtocol::BOOT.to_string(), "boot");
        assert_eq!(LinkType::ETHER.to_string(), "ether");
        assert_eq!("none".parse::<LinkType>(), Ok(LinkType::NONE));
        assert_eq!("12345".parse::<LinkType>(), Ok(LinkType(12345)));
    }

    #[test]
    fn flags_round_trip_and_managed_mask() {
        let f = AddressFlags::PERMANENT | AddressFlags::TEMPORARY | AddressFlags::NODAD;
        assert_eq!(f.to_string(), "temporary,nodad,permanent");
        assert_eq!(f.to_string().parse::<AddressFlags>(), Ok(f));
        assert_eq!(f.managed(), AddressFlags::PERMANENT | AddressFlags::NODAD);
        assert_eq!(AddressFlags(0x1_0000).to_string(), "0x10000");
        assert_eq!(
            "0x10000".parse::<AddressFlags>(),
            Ok(AddressFlags(0x1_0000))
        );
        assert_eq!(
            (LinkFlags::UP | LinkFlags::LOWER_UP).to_string(),
            "UP,LOWER_UP"
        );
    }

    #[test]
    fn hardware_addr() {
        let mac: HardwareAddr = "0C:C4:7a:00:01:02".parse().expect("mac");
        assert_eq!(mac.to_string(), "0c:c4:7a:00:01:02");
        assert!("0c:c4:7".parse::<HardwareAddr>().is_err());
        assert!("".parse::<HardwareAddr>().expect("empty").is_empty());
    }
}
