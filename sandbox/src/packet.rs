//! One link-layer datagram out of a link (`AF_PACKET`, `SOCK_DGRAM`: the kernel writes the
//! Ethernet header from the destination and protocol given): networkd's gratuitous ARP for a
//! shared IP. The socket is opened with protocol 0, so it never receives anything, and closed
//! after the send. Needs `CAP_NET_RAW`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Sends `payload` out of link `ifindex` to link-layer address `destination`, as protocol
/// `protocol` (an EtherType, host order).
///
/// # Errors
///
/// The socket's or the send's error; `InvalidInput` for a destination longer than 8 bytes.
pub fn send_datagram(
    ifindex: u32,
    protocol: u16,
    destination: &[u8],
    payload: &[u8],
) -> io::Result<()> {
    // SAFETY: zeroed `sockaddr_ll` is a valid value of this plain C struct.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    if destination.len() > sll.sll_addr.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "link-layer address longer than 8 bytes",
        ));
    }
    let ifindex = i32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "link index out of range"))?;
    // SAFETY: socket(2) with constant arguments; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor socket(2) just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    sll.sll_family = libc::AF_PACKET as libc::c_ushort;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex;
    // The length was checked against the 8-byte array above.
    sll.sll_halen = destination.len() as u8;
    sll.sll_addr[..destination.len()].copy_from_slice(destination);
    // SAFETY: `payload` is a valid buffer of its length; `sll` a valid `sockaddr_ll` of the
    // size passed; `fd` lives until the end of this function.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            payload.as_ptr().cast(),
            payload.len(),
            0,
            std::ptr::addr_of!(sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_longer_than_eight_bytes_is_refused_before_any_socket() {
        let e = send_datagram(1, 0x0806, &[0xff; 9], &[0; 28]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
