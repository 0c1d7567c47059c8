//! Links: list (decoded kind data included), create, delete, and change up/MTU/master/address,
//! bond and bridge settings.

use std::net::{Ipv4Addr, Ipv6Addr};

use netlink_packet_route::link::{
    BondAdSelect, BondAllPortActive, BondArpAllTargets, BondArpValidate, BondFailOverMac,
    BondLacpRate, BondMode, BondPrimaryReselect, BondXmitHashPolicy, BridgeStpState, InfoBond,
    InfoBridge, InfoData, InfoKind, InfoPortKind, InfoVlan, InfoVrf, LinkAttribute, LinkFlags,
    LinkInfo, LinkMessage, Prop, VlanProtocol,
};

use super::{collect, request, Error, Netlink};

/// `IFF_UP`.
const IFF_UP: u32 = 0x1;
/// `IFF_MULTICAST`.
const IFF_MULTICAST: u32 = 0x1000;

/// The alternative name that marks a logical link as created by networkd.
pub fn ownership_altname(name: &str) -> String {
    format!("talos-rs-{name}")
}

/// A link as the kernel reports it (`RTM_NEWLINK` of a dump).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Name (`IFLA_IFNAME`).
    pub name: String,
    /// Alias (`IFLA_IFALIAS`).
    pub alias: String,
    /// Alternative names (`IFLA_PROP_LIST`).
    pub alt_names: Vec<String>,
    /// ARPHRD type (ether = 1, loopback = 772, none = 65534).
    pub link_type: u16,
    /// `IFF_*` flags.
    pub flags: u32,
    /// MTU.
    pub mtu: u32,
    /// Master index (`IFLA_MASTER`), 0 for none.
    pub master: u32,
    /// Parent index (`IFLA_LINK`), 0 for none.
    pub parent: u32,
    /// `IF_OPER_*` state.
    pub operstate: u8,
    /// Carrier (`IFLA_CARRIER`).
    pub carrier: bool,
    /// Hardware address.
    pub hardware_addr: Vec<u8>,
    /// Broadcast address.
    pub broadcast_addr: Vec<u8>,
    /// Permanent hardware address (`IFLA_PERM_ADDRESS`, kernels ≥ 5.6).
    pub permanent_addr: Vec<u8>,
    /// Queueing discipline.
    pub queue_disc: String,
    /// `IFLA_INFO_KIND`, empty for a physical link.
    pub kind: String,
    /// `IFLA_INFO_SLAVE_KIND` (`bond`, `bridge` ...), empty if not enslaved.
    pub slave_kind: String,
    /// VLAN data, for kind `vlan`.
    pub vlan: Option<VlanInfo>,
    /// Bridge data, for kind `bridge`.
    pub bridge: Option<BridgeInfo>,
    /// Bond data, for kind `bond`.
    pub bond: Option<BondInfo>,
    /// VRF table, for kind `vrf`.
    pub vrf_table: Option<u32>,
}

impl Link {
    /// Whether `IFF_UP` is set.
    pub fn is_up(&self) -> bool {
        self.flags & IFF_UP != 0
    }

    /// Whether networkd created this link (it carries [`ownership_altname`]).
    pub fn is_owned(&self) -> bool {
        let mark = ownership_altname(&self.name);
        self.alt_names.contains(&mark)
    }

    fn from_message(msg: LinkMessage) -> Self {
        let mut link = Link {
            index: msg.header.index,
            link_type: u16::from(msg.header.link_layer_type),
            flags: msg.header.flags.bits(),
            ..Link::default()
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n,
                LinkAttribute::IfAlias(a) => link.alias = a,
                LinkAttribute::PropList(props) => {
                    for p in props {
                        if let Prop::AltIfName(n) = p {
                            link.alt_names.push(n);
                        }
                    }
                }
                LinkAttribute::Mtu(m) => link.mtu = m,
                LinkAttribute::Controller(m) => link.master = m,
                LinkAttribute::Link(p) => link.parent = p,
                LinkAttribute::OperState(s) => link.operstate = u8::from(s),
                LinkAttribute::Carrier(c) => link.carrier = c != 0,
                LinkAttribute::Address(a) => link.hardware_addr = a,
                LinkAttribute::Broadcast(a) => link.broadcast_addr = a,
                LinkAttribute::PermAddress(a) => link.permanent_addr = a,
                LinkAttribute::Qdisc(q) => link.queue_disc = q,
                LinkAttribute::LinkInfo(infos) => link.decode_info(infos),
                _ => {}
            }
        }
        link
    }

    fn decode_info(&mut self, infos: Vec<LinkInfo>) {
        for info in infos {
            match info {
                LinkInfo::Kind(k) => self.kind = k.to_string(),
                LinkInfo::PortKind(k) => {
                    self.slave_kind = match k {
                        InfoPortKind::Bond => "bond".to_string(),
                        InfoPortKind::Other(s) => s,
                        other => format!("{other:?}").to_lowercase(),
                    }
                }
                LinkInfo::Data(InfoData::Vlan(v)) => self.vlan = Some(VlanInfo::decode(&v)),
                LinkInfo::Data(InfoData::Bridge(b)) => self.bridge = Some(BridgeInfo::decode(&b)),
                LinkInfo::Data(InfoData::Bond(b)) => self.bond = Some(BondInfo::decode(&b)),
                LinkInfo::Data(InfoData::Vrf(v)) => {
                    self.vrf_table = v.iter().find_map(|a| match a {
                        InfoVrf::TableId(t) => Some(*t),
                        _ => None,
                    })
                }
                _ => {}
            }
        }
    }
}

/// VLAN settings (`IFLA_VLAN_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VlanInfo {
    /// VLAN ID.
    pub id: u16,
    /// Ethertype: 0x8100 (802.1Q) or 0x88a8 (802.1ad).
    pub protocol: u16,
}

impl VlanInfo {
    fn decode(attrs: &[InfoVlan]) -> Self {
        let mut v = VlanInfo {
            id: 0,
            protocol: 0x8100,
        };
        for a in attrs {
            match a {
                InfoVlan::Id(id) => v.id = *id,
                InfoVlan::Protocol(p) => v.protocol = u16::from(*p),
                _ => {}
            }
        }
        v
    }

    fn encode(&self) -> InfoData {
        InfoData::Vlan(vec![
            InfoVlan::Id(self.id),
            InfoVlan::Protocol(VlanProtocol::from(self.protocol)),
        ])
    }
}

/// The bridge settings networkd manages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BridgeInfo {
    /// STP enabled (`IFLA_BR_STP_STATE` ≠ 0).
    pub stp: bool,
    /// VLAN filtering (`IFLA_BR_VLAN_FILTERING`): `None` when the kernel does not report it
    /// (built without VLAN filtering) or, to create or change a bridge, when it is not to be
    /// sent (such a kernel refuses the attribute).
    pub vlan_filtering: Option<bool>,
}

impl BridgeInfo {
    fn decode(attrs: &[InfoBridge]) -> Self {
        let mut b = BridgeInfo::default();
        for a in attrs {
            match a {
                InfoBridge::StpState(s) => b.stp = u32::from(*s) != 0,
                InfoBridge::VlanFiltering(f) => b.vlan_filtering = Some(*f),
                _ => {}
            }
        }
        b
    }

    fn encode(&self) -> InfoData {
        let mut attrs = vec![InfoBridge::StpState(if self.stp {
            BridgeStpState::KernelStp
        } else {
            BridgeStpState::Disabled
        })];
        if let Some(f) = self.vlan_filtering {
            attrs.push(InfoBridge::VlanFiltering(f));
        }
        InfoData::Bridge(attrs)
    }
}

/// Bond settings (`IFLA_BOND_*`), with the kernel's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BondInfo {
    /// Mode (0 balance-rr … 6 balance-alb).
    pub mode: u8,
    /// Transmit hash policy.
    pub xmit_hash_policy: u8,
    /// LACP rate.
    pub lacp_rate: u8,
    /// ARP validation.
    pub arp_validate: u32,
    /// ARP all targets.
    pub arp_all_targets: u32,
    /// Primary slave index, if any.
    pub primary: Option<u32>,
    /// Primary reselection policy.
    pub primary_reselect: u8,
    /// Fail-over MAC policy.
    pub fail_over_mac: u8,
    /// 802.3ad aggregator selection.
    pub ad_select: u8,
    /// MII monitoring interval (ms).
    pub miimon: u32,
    /// Up delay (ms).
    pub updelay: u32,
    /// Down delay (ms).
    pub downdelay: u32,
    /// ARP monitoring interval (ms).
    pub arp_interval: u32,
    /// IGMP reports to resend after a fail-over.
    pub resend_igmp: u32,
    /// Minimum number of links up for the bond to be up.
    pub min_links: u32,
    /// Learning packet interval (s).
    pub lp_interval: u32,
    /// Packets per slave (balance-rr).
    pub packets_per_slave: u32,
    /// Peer notifications after a fail-over.
    pub num_peer_notif: u8,
    /// Dynamic load balancing (tlb/alb).
    pub tlb_dynamic_lb: u8,
    /// Deliver frames received on inactive slaves.
    pub all_slaves_active: u8,
    /// Use the carrier state for MII monitoring.
    pub use_carrier: bool,
    /// 802.3ad actor system priority.
    pub ad_actor_sys_prio: u16,
    /// 802.3ad user port key.
    pub ad_user_port_key: u16,
    /// Peer notification delay (ms).
    pub peer_notify_delay: u32,
    /// Send LACPDUs periodically (802.3ad); `None` leaves the kernel's default.
    pub ad_lacp_active: Option<bool>,
    /// Missed ARP replies before a slave is down.
    pub missed_max: u8,
    /// ARP monitoring targets.
    pub arp_ip_targets: Vec<Ipv4Addr>,
    /// IPv6 NS monitoring targets.
    pub ns_ip6_targets: Vec<Ipv6Addr>,
}

/// 802.3ad.
const BOND_MODE_8023AD: u8 = 4;
/// balance-tlb.
const BOND_MODE_TLB: u8 = 5;
/// balance-alb.
const BOND_MODE_ALB: u8 = 6;
/// active-backup.
const BOND_MODE_ACTIVE_BACKUP: u8 = 1;
/// balance-rr.
const BOND_MODE_RR: u8 = 0;

impl BondInfo {
    /// Whether the mode is 802.3ad, balance-tlb or balance-alb (the modes without ARP monitoring).
    pub fn is_lacp_or_tlb(&self) -> bool {
        matches!(self.mode, BOND_MODE_8023AD | BOND_MODE_TLB | BOND_MODE_ALB)
    }

    fn decode(attrs: &[InfoBond]) -> Self {
        let mut b = BondInfo::default();
        for a in attrs {
            match a {
                InfoBond::Mode(m) => b.mode = u8::from(*m),
                InfoBond::XmitHashPolicy(p) => b.xmit_hash_policy = u8::from(*p),
                InfoBond::AdLacpRate(r) => b.lacp_rate = u8::from(*r),
                InfoBond::ArpValidate(v) => b.arp_validate = u32::from(*v),
                InfoBond::ArpAllTargets(v) => b.arp_all_targets = u32::from(*v),
                InfoBond::Primary(p) => b.primary = Some(*p),
                InfoBond::PrimaryReselect(p) => b.primary_reselect = u8::from(*p),
                InfoBond::FailOverMac(f) => b.fail_over_mac = u8::from(*f),
                InfoBond::AdSelect(s) => b.ad_select = u8::from(*s),
                InfoBond::MiiMon(v) => b.miimon = *v,
                InfoBond::UpDelay(v) => b.updelay = *v,
                InfoBond::DownDelay(v) => b.downdelay = *v,
                InfoBond::ArpInterval(v) => b.arp_interval = *v,
                InfoBond::ResendIgmp(v) => b.resend_igmp = *v,
                InfoBond::MinLinks(v) => b.min_links = *v,
                InfoBond::LpInterval(v) => b.lp_interval = *v,
                InfoBond::PacketsPerPort(v) => b.packets_per_slave = *v,
                InfoBond::NumPeerNotif(v) => b.num_peer_notif = *v,
                InfoBond::TlbDynamicLb(v) => b.tlb_dynamic_lb = u8::from(*v),
                InfoBond::AllPortsActive(v) => b.all_slaves_active = u8::from(*v),
                InfoBond::UseCarrier(v) => b.use_carrier = *v,
                InfoBond::AdActorSysPrio(v) => b.ad_actor_sys_prio = *v,
                InfoBond::AdUserPortKey(v) => b.ad_user_port_key = *v,
                InfoBond::PeerNotifDelay(v) => b.peer_notify_delay = *v,
                InfoBond::AdLacpActive(v) => b.ad_lacp_active = Some(*v),
                InfoBond::MissedMax(v) => b.missed_max = *v,
                InfoBond::ArpIpTarget(t) => b.arp_ip_targets.clone_from(t),
                InfoBond::NsIp6Target(t) => b.ns_ip6_targets.clone_from(t),
                _ => {}
            }
        }
        b
    }

    /// The attributes to send, by upstream's encode rules (networking.md §3.4): some always,
    /// some per mode, the delays only with MII monitoring.
    fn encode(&self) -> InfoData {
        let mut a = vec![
            InfoBond::Mode(BondMode::from(self.mode)),
            InfoBond::XmitHashPolicy(BondXmitHashPolicy::from(self.xmit_hash_policy)),
            InfoBond::ArpAllTargets(BondArpAllTargets::from(self.arp_all_targets)),
            InfoBond::PrimaryReselect(BondPrimaryReselect::from(self.primary_reselect)),
            InfoBond::FailOverMac(BondFailOverMac::from(self.fail_over_mac)),
            InfoBond::AdSelect(BondAdSelect::from(self.ad_select)),
            InfoBond::MiiMon(self.miimon),
            InfoBond::ResendIgmp(self.resend_igmp),
            InfoBond::MinLinks(self.min_links),
            InfoBond::LpInterval(self.lp_interval),
            InfoBond::NumPeerNotif(self.num_peer_notif),
            InfoBond::AllPortsActive(BondAllPortActive::from(self.all_slaves_active)),
            InfoBond::UseCarrier(self.use_carrier),
        ];
        if self.mode == BOND_MODE_8023AD {
            a.push(InfoBond::AdLacpRate(BondLacpRate::from(self.lacp_rate)));
            if let Some(active) = self.ad_lacp_active {
                a.push(InfoBond::AdLacpActive(active));
            }
            a.push(InfoBond::AdActorSysPrio(self.ad_actor_sys_prio));
            a.push(InfoBond::AdUserPortKey(self.ad_user_port_key));
        }
        if !self.is_lacp_or_tlb() {
            a.push(InfoBond::ArpValidate(BondArpValidate::from(
                self.arp_validate,
            )));
            a.push(InfoBond::ArpInterval(self.arp_interval));
            if !self.arp_ip_targets.is_empty() {
                a.push(InfoBond::ArpIpTarget(self.arp_ip_targets.clone()));
            }
            if !self.ns_ip6_targets.is_empty() {
                a.push(InfoBond::NsIp6Target(self.ns_ip6_targets.clone()));
            }
        }
        if matches!(
            self.mode,
            BOND_MODE_ACTIVE_BACKUP | BOND_MODE_TLB | BOND_MODE_ALB
        ) {
            if let Some(p) = self.primary {
                a.push(InfoBond::Primary(p));
            }
        }
        if self.miimon != 0 {
            a.push(InfoBond::UpDelay(self.updelay));
            a.push(InfoBond::DownDelay(self.downdelay));
            a.push(InfoBond::PeerNotifDelay(self.peer_notify_delay));
        }
        if self.mode == BOND_MODE_RR {
            a.push(InfoBond::PacketsPerPort(self.packets_per_slave));
        }
        if matches!(self.mode, BOND_MODE_TLB | BOND_MODE_ALB) {
            a.push(InfoBond::TlbDynamicLb(self.tlb_dynamic_lb != 0));
        }
        if self.missed_max != 0 {
            a.push(InfoBond::MissedMax(self.missed_max));
        }
        InfoData::Bond(a)
    }
}

/// The kind of a logical link to create, with its kind data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// `dummy`.
    Dummy,
    /// `vlan` on the parent link.
    Vlan(VlanInfo),
    /// `bond`.
    Bond(BondInfo),
    /// `bridge`.
    Bridge(BridgeInfo),
    /// `vrf` with its routing table.
    Vrf(u32),
}

impl LinkKind {
    /// The `IFLA_INFO_KIND` string.
    pub fn name(&self) -> &'static str {
        match self {
            LinkKind::Dummy => "dummy",
            LinkKind::Vlan(_) => "vlan",
            LinkKind::Bond(_) => "bond",
            LinkKind::Bridge(_) => "bridge",
            LinkKind::Vrf(_) => "vrf",
        }
    }

    fn info(&self) -> Vec<LinkInfo> {
        let (kind, data) = match self {
            LinkKind::Dummy => (InfoKind::Dummy, None),
            LinkKind::Vlan(v) => (InfoKind::Vlan, Some(v.encode())),
            LinkKind::Bond(b) => (InfoKind::Bond, Some(b.encode())),
            LinkKind::Bridge(b) => (InfoKind::Bridge, Some(b.encode())),
            LinkKind::Vrf(t) => (
                InfoKind::Vrf,
                Some(InfoData::Vrf(vec![InfoVrf::TableId(*t)])),
            ),
        };
        let mut info = vec![LinkInfo::Kind(kind)];
        info.extend(data.map(LinkInfo::Data));
        info
    }
}

/// A logical link to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkCreate {
    /// Name.
    pub name: String,
    /// Kind and kind data.
    pub kind: LinkKind,
    /// Parent index (`IFLA_LINK`, VLANs).
    pub parent: Option<u32>,
    /// Hardware address.
    pub hardware_addr: Option<Vec<u8>>,
    /// Master index at creation (VRF slaves).
    pub master: Option<u32>,
}

/// Changes to an existing link; `None` leaves a setting alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// Set or clear `IFF_UP`.
    pub up: Option<bool>,
    /// Set the MTU.
    pub mtu: Option<u32>,
    /// Set the master (0 releases the link from its master).
    pub master: Option<u32>,
    /// Set the hardware address.
    pub hardware_addr: Option<Vec<u8>>,
    /// Set or clear `IFF_MULTICAST`.
    pub multicast: Option<bool>,
}

impl Netlink {
    /// Every link of the namespace.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the dump fails.
    pub async fn links(&self) -> Result<Vec<Link>, Error> {
        let msgs = collect("list links", self.handle().link().get().execute()).await?;
        Ok(msgs.into_iter().map(Link::from_message).collect())
    }

    /// Creates a logical link and marks it as networkd's ([`ownership_altname`]); returns it as
    /// the kernel reports it after creation.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses (EEXIST if the name is taken).
    pub async fn create_link(&self, spec: &LinkCreate) -> Result<Link, Error> {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::IfName(spec.name.clone()));
        if let Some(hw) = &spec.hardware_addr {
            msg.attributes.push(LinkAttribute::Address(hw.clone()));
        }
        if let Some(parent) = spec.parent {
            msg.attributes.push(LinkAttribute::Link(parent));
        }
        if let Some(master) = spec.master {
            msg.attributes.push(LinkAttribute::Controller(master));
        }
        msg.attributes
            .push(LinkAttribute::LinkInfo(spec.kind.info()));
        request(self.handle().link().add(msg).execute().await, || {
            format!("create {} link {}", spec.kind.name(), spec.name)
        })?;
        let link = self
            .link_by_name(&spec.name)
            .await?
            .ok_or_else(|| Error::Request {
                op: format!("find link {} after creating it", spec.name),
                source: rtnetlink::Error::RequestFailed,
            })?;
        let mark = ownership_altname(&spec.name);
        request(
            self.handle()
                .link()
                .property_add(link.index)
                .alt_ifname(&[mark.as_str()])
                .execute()
                .await,
            || format!("mark link {} as networkd's", spec.name),
        )?;
        Ok(link)
    }

    /// The link named `name` (exact name), if any.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the dump fails.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, Error> {
        Ok(self.links().await?.into_iter().find(|l| l.name == name))
    }

    /// Deletes a link by index.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses.
    pub async fn delete_link(&self, index: u32) -> Result<(), Error> {
        request(self.handle().link().del(index).execute().await, || {
            format!("delete link {index}")
        })
    }

    /// Applies `change` to the link `index` in one `RTM_SETLINK`.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses.
    pub async fn change_link(&self, index: u32, change: &LinkChange) -> Result<(), Error> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let mut flags = 0;
        let mut mask = 0;
        if let Some(up) = change.up {
            mask |= IFF_UP;
            if up {
                flags |= IFF_UP;
            }
        }
        if let Some(m) = change.multicast {
            mask |= IFF_MULTICAST;
            if m {
                flags |= IFF_MULTICAST;
            }
        }
        msg.header.flags = LinkFlags::from_bits_retain(flags);
        msg.header.change_mask = LinkFlags::from_bits_retain(mask);
        if let Some(mtu) = change.mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(master) = change.master {
            msg.attributes.push(LinkAttribute::Controller(master));
        }
        if let Some(hw) = &change.hardware_addr {
            msg.attributes.push(LinkAttribute::Address(hw.clone()));
        }
        request(self.handle().link().set(msg).execute().await, || {
            format!("change link {index}: {change:?}")
        })
    }

    /// Changes the kind data of an existing link (bond or bridge settings): `RTM_NEWLINK` on the
    /// existing index, the only message whose `IFLA_LINKINFO` the kernel applies to a live link.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses.
    pub async fn change_link_kind(&self, index: u32, kind: &LinkKind) -> Result<(), Error> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::LinkInfo(kind.info()));
        request(self.handle().link().change(msg).execute().await, || {
            format!("change {} settings of link {index}", kind.name())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bond_encoding_follows_mode_rules() {
        let b = BondInfo {
            mode: BOND_MODE_8023AD,
            miimon: 0,
            ..BondInfo::default()
        };
        let InfoData::Bond(attrs) = b.encode() else {
            panic!("bond data")
        };
        assert!(attrs
            .iter()
            .any(|a| matches!(a, InfoBond::AdActorSysPrio(_))));
        assert!(!attrs.iter().any(|a| matches!(a, InfoBond::ArpInterval(_))));
        assert!(!attrs.iter().any(|a| matches!(a, InfoBond::UpDelay(_))));

        let b = BondInfo {
            mode: BOND_MODE_ACTIVE_BACKUP,
            miimon: 100,
            primary: Some(7),
            ..BondInfo::default()
        };
        let InfoData::Bond(attrs) = b.encode() else {
            panic!("bond data")
        };
        assert!(attrs.contains(&InfoBond::Primary(7)));
        assert!(attrs.contains(&InfoBond::UpDelay(0)));
        assert!(attrs.iter().any(|a| matches!(a, InfoBond::ArpValidate(_))));
        assert!(!attrs.iter().any(|a| matches!(a, InfoBond::AdLacpRate(_))));
        // What the kernel reports back decodes to the same settings.
        assert_eq!(BondInfo::decode(&attrs), b);
    }

    #[test]
    fn ownership_mark() {
        let mut l = Link {
            name: "bond0".into(),
            ..Link::default()
        };
        assert!(!l.is_owned());
        l.alt_names.push("talos-rs-bond0".into());
        assert!(l.is_owned());
    }
}
