//! The kernel event watcher: a dedicated netlink socket that only joins multicast groups and turns
//! every burst of messages into one wake-up, as upstream's `watch.NewRtNetlink`. The messages are
//! never parsed: the woken controller re-lists what it needs.

use std::time::Duration;

use netlink_sys::{protocols::NETLINK_ROUTE, AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket};

use super::Error;

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
                    Ok(()) => {}
                    // ENOBUFS: we lost events; anything else is retried after the interval.
                    Err(e) => tracing::debug!(error = %e, "netlink watch receive error"),
                }
                // Drain what else is queued (the socket is non-blocking): it is covered by this
                // wake-up.
                loop {
                    buf.clear();
                    if socket.socket_ref().recv(&mut buf, 0).is_err() {
                        break;
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
