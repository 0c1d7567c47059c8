//! Addresses: list, add (marked with [`OWN_PROTOCOL`]), delete.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol,
    AddressScope,
};
use netlink_packet_route::AddressFamily;

use super::{collect, request, Error, Netlink, OWN_PROTOCOL};

/// An address as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// Link index.
    pub index: u32,
    /// `IFA_ADDRESS` (the peer on point-to-point links, else the local address).
    pub address: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
    /// `IFA_LOCAL`, if reported.
    pub local: Option<IpAddr>,
    /// `IFA_BROADCAST`, if reported.
    pub broadcast: Option<Ipv4Addr>,
    /// `IFA_ANYCAST`, if reported.
    pub anycast: Option<Ipv6Addr>,
    /// `IFA_MULTICAST`, if reported.
    pub multicast: Option<Ipv6Addr>,
    /// Scope (`RT_SCOPE_*`).
    pub scope: u8,
    /// `IFA_F_*` flags: the header's 8 bits or-ed with `IFA_FLAGS`.
    pub flags: u32,
    /// `IFA_RT_PRIORITY` (metric of the prefix route), 0 if absent.
    pub priority: u32,
    /// `IFA_PROTO`, 0 if absent.
    pub protocol: u8,
}

impl Address {
    /// Whether networkd added this address ([`OWN_PROTOCOL`]).
    pub fn is_owned(&self) -> bool {
        self.protocol == OWN_PROTOCOL
    }

    pub(crate) fn from_message(msg: AddressMessage) -> Option<Self> {
        let mut address = None;
        let mut a = Address {
            index: msg.header.index,
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            prefix_len: msg.header.prefix_len,
            local: None,
            broadcast: None,
            anycast: None,
            multicast: None,
            scope: u8::from(msg.header.scope),
            flags: u32::from(msg.header.flags.bits()),
            priority: 0,
            protocol: 0,
        };
        for attr in msg.attributes {
            match attr {
                AddressAttribute::Address(ip) => address = Some(ip),
                AddressAttribute::Local(ip) => a.local = Some(ip),
                AddressAttribute::Broadcast(b) => a.broadcast = Some(b),
                AddressAttribute::Anycast(x) => a.anycast = Some(x),
                AddressAttribute::Multicast(m) => a.multicast = Some(m),
                AddressAttribute::Flags(f) => a.flags |= f.bits(),
                AddressAttribute::RoutePriority(p) => a.priority = p,
                AddressAttribute::Protocol(p) => a.protocol = u8::from(p),
                _ => {}
            }
        }
        // An address without IFA_ADDRESS has only IFA_LOCAL (rare); a message with neither is
        // malformed and skipped.
        a.address = address.or(a.local)?;
        Some(a)
    }
}

/// An address to add.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressAdd {
    /// Link index.
    pub index: u32,
    /// The address.
    pub address: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
    /// Scope (`RT_SCOPE_*`).
    pub scope: u8,
    /// `IFA_F_*` flags to set (the managed ones).
    pub flags: u32,
    /// `IFA_RT_PRIORITY`, 0 for none.
    pub priority: u32,
}

/// The IPv4 broadcast address of `addr/prefix_len`, for prefixes shorter than /31.
fn broadcast(addr: Ipv4Addr, prefix_len: u8) -> Option<Ipv4Addr> {
    if prefix_len >= 31 {
        return None;
    }
    let host_bits = 32 - u32::from(prefix_len);
    let mask = u32::MAX.checked_shl(host_bits).unwrap_or(0);
    Some(Ipv4Addr::from(u32::from(addr) | !mask))
}

impl Netlink {
    /// Every address of the namespace (both families).
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the dump fails.
    pub async fn addresses(&self) -> Result<Vec<Address>, Error> {
        let msgs = collect("list addresses", self.handle().address().get().execute()).await?;
        Ok(msgs.into_iter().filter_map(Address::from_message).collect())
    }

    /// Adds an address marked with [`OWN_PROTOCOL`]; `IFA_LOCAL` = `IFA_ADDRESS`, the IPv4
    /// broadcast computed, flags in both the header and `IFA_FLAGS`, as upstream.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses (EEXIST if present).
    pub async fn add_address(&self, a: &AddressAdd) -> Result<(), Error> {
        let mut req = self
            .handle()
            .address()
            .add(a.index, a.address, a.prefix_len);
        let msg = req.message_mut();
        msg.header.scope = AddressScope::from(a.scope);
        msg.header.flags = AddressHeaderFlags::from_bits_truncate((a.flags & 0xff) as u8);
        // The builder may have set a broadcast; recompute ours so the rule is one place.
        msg.attributes
            .retain(|x| !matches!(x, AddressAttribute::Broadcast(_)));
        if let IpAddr::V4(v4) = a.address {
            if let Some(b) = broadcast(v4, a.prefix_len) {
                msg.attributes.push(AddressAttribute::Broadcast(b));
            }
        }
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::from_bits_retain(
                a.flags,
            )));
        if a.priority != 0 {
            msg.attributes
                .push(AddressAttribute::RoutePriority(a.priority));
        }
        msg.attributes
            .push(AddressAttribute::Protocol(AddressProtocol::from(
                OWN_PROTOCOL,
            )));
        request(req.execute().await, || {
            format!(
                "add address {}/{} to link {}",
                a.address, a.prefix_len, a.index
            )
        })
    }

    /// Deletes an address (by link, address and prefix length).
    ///
    /// # Errors
    ///
    /// [`Error::Request`] if the kernel refuses (EADDRNOTAVAIL if absent).
    pub async fn delete_address(&self, a: &Address) -> Result<(), Error> {
        let mut msg = AddressMessage::default();
        msg.header.family = match a.address {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.header.prefix_len = a.prefix_len;
        msg.header.index = a.index;
        msg.attributes.push(AddressAttribute::Address(a.address));
        if let Some(local) = a.local {
            msg.attributes.push(AddressAttribute::Local(local));
        }
        request(self.handle().address().del(msg).execute().await, || {
            format!(
                "delete address {}/{} from link {}",
                a.address, a.prefix_len, a.index
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_addresses() {
        let a = |s: &str| s.parse::<Ipv4Addr>().expect("ip");
        assert_eq!(broadcast(a("10.0.0.5"), 24), Some(a("10.0.0.255")));
        assert_eq!(broadcast(a("10.1.2.3"), 8), Some(a("10.255.255.255")));
        assert_eq!(broadcast(a("10.1.2.3"), 0), Some(a("255.255.255.255")));
        assert_eq!(broadcast(a("10.0.0.5"), 31), None);
        assert_eq!(broadcast(a("10.0.0.5"), 32), None);
    }
}
