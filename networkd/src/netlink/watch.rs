//! The kernel event watcher: a dedicated netlink socket that only joins multicast groups and turns
//! every burst of messages into one wake-up, as upstream's `watch.NewRtNetlink`. Most controllers
//! re-list what they need when woken; a status controller of many objects can instead have the
//! messages recorded ([`ChangeLog`]) and update only what changed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket};
use rtnetlink::packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLM_F_APPEND, NLM_F_REPLACE,
};

use super::{Address, Error, Route};

/// `RTMGRP_LINK`.
pub const GROUP_LINK: u32 = 0x1;
/// `RTMGRP_IPV4_IFADDR`.
pub const GROUP_IPV4_IFADDR: u32 = 0x10;
/// `RTMGRP_IPV4_ROUTE`.
pub const GROUP_IPV4_ROUTE: u32 = 0x40;
/// `RTMGRP_IPV6_IFADDR`.
pub const GROUP_IPV6_IFADDR: u32 = 0x100;
/// `RTMGRP_IPV6_ROUTE`.
pub const GROUP_IPV6_ROUTE: u32 = 0x400;
/// Addresses of both families.
pub const GROUPS_ADDRESS: u32 = GROUP_IPV4_IFADDR | GROUP_IPV6_IFADDR;
/// Routes of both families.
pub const GROUPS_ROUTE: u32 = GROUP_IPV4_ROUTE | GROUP_IPV6_ROUTE;

/// The shortest time between two wake-ups: at most 10 reconciles per second, each a full re-list,
/// whatever the event rate (upstream's rate-limited trigger).
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Changes recorded at most between two reads of a [`ChangeLog`]; past that the log says the
/// changes were lost, and the reader re-lists (memory stays bounded whatever the kernel sends).
pub const MAX_RECORDED: usize = 1 << 16;

/// One kernel notification, as far as a status controller cares.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A link appeared, changed or vanished: names, and what hangs off links, may have changed.
    Link,
    /// An address appeared or changed.
    NewAddress(Address),
    /// An address vanished.
    DelAddress(Address),
    /// A route appeared; `replace` if it replaced another (which vanished without a message)
    /// or joined one as a further next hop.
    NewRoute {
        /// The route.
        route: Route,
        /// `NLM_F_REPLACE` or `NLM_F_APPEND` was set.
        replace: bool,
    },
    /// A route vanished.
    DelRoute(Route),
}

/// What a recording watcher received since the last [`take`](ChangeLog::take).
#[derive(Debug, Default)]
pub struct ChangeLog(Mutex<Recorded>);

#[derive(Debug, Default)]
struct Recorded {
    /// Something was not recorded (socket overrun, undecodable message, too many changes).
    lost: bool,
    changes: Vec<Change>,
}

impl ChangeLog {
    /// The changes since the last call, in the kernel's order; `None` if some were lost (the
    /// reader must re-list). Either way the log starts empty again.
    pub fn take(&self) -> Option<Vec<Change>> {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let lost = std::mem::take(&mut r.lost);
        let changes = std::mem::take(&mut r.changes);
        (!lost).then_some(changes)
    }

    /// Records that changes were lost.
    fn lose(&self) {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        r.lost = true;
        r.changes = Vec::new();
    }

    /// Records every message of one datagram.
    fn record(&self, datagram: &[u8]) {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if r.lost {
            return;
        }
        match parse(datagram) {
            Some(changes) if r.changes.len() + changes.len() <= MAX_RECORDED => {
                r.changes.extend(changes);
            }
            _ => {
                r.lost = true;
                r.changes = Vec::new();
            }
        }
    }
}

/// The changes of one datagram (several netlink messages); `None` if one does not decode.
pub fn parse(mut datagram: &[u8]) -> Option<Vec<Change>> {
    let mut out = Vec::new();
    while !datagram.is_empty() {
        let len = NetlinkBuffer::new_checked(datagram).ok()?.length() as usize;
        // Messages are 4-byte aligned; the last one may lack the padding.
        let next = len.checked_add(3)? & !3;
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(datagram.get(..len)?).ok()?;
        let replace = msg.header.flags & (NLM_F_REPLACE | NLM_F_APPEND) != 0;
        if let NetlinkPayload::InnerMessage(m) = msg.payload {
            match m {
                RouteNetlinkMessage::NewLink(_) | RouteNetlinkMessage::DelLink(_) => {
                    out.push(Change::Link);
                }
                RouteNetlinkMessage::NewAddress(a) => {
                    out.extend(Address::from_message(a).map(Change::NewAddress));
                }
                RouteNetlinkMessage::DelAddress(a) => {
                    out.extend(Address::from_message(a).map(Change::DelAddress));
                }
                RouteNetlinkMessage::NewRoute(r) => out.push(Change::NewRoute {
                    route: Route::from_message(r),
                    replace,
                }),
                RouteNetlinkMessage::DelRoute(r) => {
                    out.push(Change::DelRoute(Route::from_message(r)))
                }
                _ => {}
            }
        }
        datagram = datagram.get(next..).unwrap_or_default();
    }
    Some(out)
}

/// A running watcher; dropping it stops the watch.
#[derive(Debug)]
pub struct Watcher {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watcher {
    /// Joins the multicast `groups` (`GROUP_*` bits) on a new socket and calls `wake` after every
    /// burst of kernel messages, at most once per [`MIN_INTERVAL`]. The watch ends when `wake`
    /// returns `false` (nobody listens any more) or the watcher is dropped.
    ///
    /// An overrun of the socket buffer (`ENOBUFS`: events were lost) is a wake-up too, since the
    /// woken side re-lists everything anyway.
    ///
    /// # Errors
    ///
    /// [`Error::Socket`] if the socket cannot be opened or bound.
    pub fn start(groups: u32, wake: impl Fn() -> bool + Send + 'static) -> Result<Self, Error> {
        Self::start_recording(groups, None, wake)
    }

    /// [`start`](Self::start), recording every message into `log` (if any) before the wake-up.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_recording(
        groups: u32,
        log: Option<Arc<ChangeLog>>,
        wake: impl Fn() -> bool + Send + 'static,
    ) -> Result<Self, Error> {
        let mut socket = TokioSocket::new(NETLINK_ROUTE).map_err(Error::Socket)?;
        socket
            .socket_mut()
            .bind(&SocketAddr::new(0, groups))
            .map_err(Error::Socket)?;
        // A large buffer makes overruns rare; they are harmless anyway.
        let _ = socket.socket_ref().set_rx_buf_sz(1 << 20);
        let task = tokio::spawn(async move {
            let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
            loop {
                buf.clear();
                match socket.recv(&mut buf).await {
                    Ok(()) => {
                        if let Some(log) = &log {
                            log.record(&buf);
                        }
                    }
                    // ENOBUFS: we lost events; anything else is retried after the interval.
                    Err(e) => {
                        tracing::debug!(error = %e, "netlink watch receive error");
                        if let Some(log) = &log {
                            log.lose();
                        }
                    }
                }
                // Drain what else is queued (the socket is non-blocking): it is covered by this
                // wake-up.
                loop {
                    buf.clear();
                    match socket.socket_ref().recv(&mut buf, 0) {
                        Ok(_) => {
                            if let Some(log) = &log {
                                log.record(&buf);
                            }
                        }
                        Err(e) => {
                            // Only "nothing more queued" ends the drain quietly.
                            if e.kind() != std::io::ErrorKind::WouldBlock {
                                if let Some(log) = &log {
                                    log.lose();
                                }
                            }
                            break;
                        }
                    }
                }
                if !wake() {
                    return;
                }
                tokio::time::sleep(MIN_INTERVAL).await;
            }
        });
        Ok(Self { task })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::address::{AddressAttribute, AddressMessage};
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    use netlink_packet_route::AddressFamily;
    use rtnetlink::packet_core::NetlinkHeader;

    fn bytes(payload: RouteNetlinkMessage, flags: u16) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    fn route() -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.destination_prefix_length = 24;
        r.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(
                "10.9.0.0".parse().expect("ip"),
            )));
        r
    }

    fn address() -> AddressMessage {
        let mut a = AddressMessage::default();
        a.header.family = AddressFamily::Inet;
        a.header.prefix_len = 24;
        a.header.index = 3;
        a.attributes
            .push(AddressAttribute::Address("10.9.0.1".parse().expect("ip")));
        a
    }

    #[test]
    fn a_datagram_of_several_messages_parses_in_order() {
        let mut datagram = bytes(RouteNetlinkMessage::NewRoute(route()), NLM_F_REPLACE);
        datagram.extend(bytes(RouteNetlinkMessage::DelAddress(address()), 0));
        datagram.extend(bytes(RouteNetlinkMessage::NewRoute(route()), 0));
        let changes = parse(&datagram).expect("parses");
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(matches!(
            &changes[0],
            Change::NewRoute { route, replace: true } if route.dst_len == 24
        ));
        assert!(matches!(&changes[1], Change::DelAddress(a) if a.index == 3 && a.prefix_len == 24));
        assert!(matches!(
            &changes[2],
            Change::NewRoute { replace: false, .. }
        ));
    }

    #[test]
    fn a_cut_datagram_is_lost_and_the_log_says_so() {
        let mut datagram = bytes(RouteNetlinkMessage::NewRoute(route()), 0);
        datagram.extend(bytes(RouteNetlinkMessage::NewRoute(route()), 0));
        datagram.truncate(datagram.len() - 5);
        assert_eq!(parse(&datagram), None);
        let log = ChangeLog::default();
        log.record(&bytes(RouteNetlinkMessage::NewRoute(route()), 0));
        assert_eq!(log.take().map(|c| c.len()), Some(1));
        log.record(&datagram);
        log.record(&bytes(RouteNetlinkMessage::NewRoute(route()), 0));
        assert_eq!(log.take(), None, "lost until read");
        assert_eq!(log.take(), Some(vec![]), "then empty again");
    }

    #[test]
    fn the_log_is_bounded() {
        let log = ChangeLog::default();
        let one = bytes(RouteNetlinkMessage::NewRoute(route()), 0);
        for _ in 0..MAX_RECORDED {
            log.record(&one);
        }
        assert_eq!(log.take().map(|c| c.len()), Some(MAX_RECORDED));
        for _ in 0..=MAX_RECORDED {
            log.record(&one);
        }
        assert_eq!(
            log.take(),
            None,
            "one more than the bound is lost, not kept"
        );
    }
}
