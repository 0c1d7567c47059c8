//! The gratuitous ARP that announces a shared IP where it now lives (upstream's address spec
//! controller after adding an address with `announceWithARP`): one ARP request with sender and
//! target both the IP, from the link's MAC to the broadcast address, so that the neighbours
//! that cached the previous holder's MAC take the new one at once. Ethernet links only.
//! The packet is etherparse's; the link-layer socket is the sandbox crate's.

use std::net::Ipv4Addr;

use etherparse::{ArpHardwareId, ArpOperation, ArpPacket, EtherType};

use crate::netlink::Link;

/// ARPHRD_ETHER.
const ARPHRD_ETHER: u16 = 1;
/// The Ethernet broadcast address.
const BROADCAST: [u8; 6] = [0xff; 6];

/// The gratuitous ARP request announcing `ip` at `mac`.
///
/// # Errors
///
/// A MAC that is not 6 bytes.
pub fn packet(mac: &[u8], ip: Ipv4Addr) -> Result<Vec<u8>, String> {
    if mac.len() != 6 {
        return Err(format!("not an Ethernet address: {} bytes", mac.len()));
    }
    let p = ArpPacket::new(
        ArpHardwareId::ETHERNET,
        EtherType::IPV4,
        ArpOperation::REQUEST,
        mac,
        &ip.octets(),
        &BROADCAST,
        &ip.octets(),
    )
    .map_err(|e| e.to_string())?;
    Ok(p.to_bytes().to_vec())
}

/// Announces `ip` on `link`; a link that is not Ethernet is skipped (`Ok(false)`).
///
/// # Errors
///
/// Why the packet could not be sent.
pub fn announce(link: &Link, ip: Ipv4Addr) -> Result<bool, String> {
    if link.link_type != ARPHRD_ETHER || link.hardware_addr.len() != 6 {
        return Ok(false);
    }
    let bytes = packet(&link.hardware_addr, ip)?;
    sandbox::packet::send_datagram(link.index, EtherType::ARP.0, &BROADCAST, &bytes)
        .map_err(|e| e.to_string())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_announcement_is_a_request_for_itself_to_broadcast() {
        let mac = [0x02, 0, 0, 0, 0, 0x2a];
        let bytes = packet(&mac, Ipv4Addr::new(10, 5, 0, 200)).unwrap();
        // htype 1, ptype 0x0800, hlen 6, plen 4, oper 1 (request).
        assert_eq!(&bytes[..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&bytes[8..14], &mac);
        assert_eq!(&bytes[14..18], &[10, 5, 0, 200]);
        assert_eq!(&bytes[18..24], &BROADCAST);
        assert_eq!(&bytes[24..28], &[10, 5, 0, 200]);
        assert_eq!(bytes.len(), 28);
        assert!(packet(&[1, 2, 3], Ipv4Addr::LOCALHOST).is_err());
    }
}
