//! The DHCPv6 exchanges on one link (RFC 8415 §18): SOLICIT → ADVERTISE → REQUEST → REPLY for
//! one IA_NA, RENEW (to the server that granted the lease) and REBIND (to any server), RELEASE.
//!
//! # The socket
//!
//! A plain UDP socket on `[::]:546`, bound to the link with `SO_BINDTODEVICE`. Every message
//! goes to All_DHCP_Relay_Agents_and_Servers (`ff02::1:2`, port 547) out of that link, from the
//! link's link-local address (the kernel picks it for a link-scope destination), and servers
//! answer to that address: no raw socket, no address of our own needed. Hence the link-local
//! address must have passed duplicate address detection first ([`link_local_ready`]), as
//! upstream waits for it.
//!
//! Unlike upstream (nclient6 `RapidSolicit`, a new SOLICIT at half the valid lifetime, never a
//! RELEASE), the client runs the RFC's state machine: the four-message exchange, RENEW at T1,
//! REBIND at T2, RELEASE when the operator is removed.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, SystemTime};

use dhcproto::v6::{MessageType, Status};
use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::lease::Lease;
use super::packet::{self, Identity, Reply, Request};

/// The client port.
pub const CLIENT_PORT: u16 = 546;
/// The server port.
pub const SERVER_PORT: u16 = 547;
/// All_DHCP_Relay_Agents_and_Servers.
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

/// `IFA_F_TENTATIVE`.
const IFA_F_TENTATIVE: u32 = 0x40;
/// `IFA_F_DADFAILED`.
const IFA_F_DADFAILED: u32 = 0x08;

/// A DHCPv6 failure on a link.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be opened or bound to the link.
    #[error("cannot open the DHCPv6 socket on link {link}")]
    Socket {
        /// The link.
        link: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A message could not be sent.
    #[error("cannot send a DHCPv6 message on link {link}")]
    Send {
        /// The link.
        link: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A message could not be encoded.
    #[error("cannot encode a DHCPv6 message for link {link}")]
    Encode {
        /// The link.
        link: String,
        /// The cause.
        #[source]
        source: dhcproto::error::EncodeError,
    },
    /// No server answered in time.
    #[error("no DHCPv6 server answered on link {link}")]
    Timeout {
        /// The link.
        link: String,
    },
    /// The server answered with a failure status (no addresses, not on link, no binding...).
    #[error("the DHCPv6 server refused the request on link {link}: {status:?}")]
    Refused {
        /// The link.
        link: String,
        /// The status code.
        status: Status,
    },
}

impl Error {
    /// Whether the server says the lease is gone (the binding is unknown, or the address is not
    /// on this link): start over.
    pub fn lease_lost(&self) -> bool {
        matches!(
            self,
            Self::Refused {
                status: Status::NoBinding | Status::NotOnLink | Status::NoAddrsAvail,
                ..
            }
        )
    }
}

/// Retransmission parameters (RFC 8415 §7.6, §15).
#[derive(Clone, Copy, Debug)]
pub struct Retransmit {
    /// Initial retransmission time.
    pub initial: Duration,
    /// Maximum retransmission time.
    pub max: Duration,
    /// Maximum number of transmissions.
    pub count: usize,
}

/// SOLICIT: SOL_TIMEOUT 1 s, SOL_MAX_RT capped at 32 s here, six transmissions (about a
/// minute; the operator then backs off and solicits again).
pub const SOLICIT: Retransmit = Retransmit {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(32),
    count: 6,
};
/// REQUEST: REQ_TIMEOUT 1 s, REQ_MAX_RT 30 s, REQ_MAX_RC 10.
pub const REQUEST: Retransmit = Retransmit {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(30),
    count: 10,
};
/// RENEW and REBIND: REN_TIMEOUT / REB_TIMEOUT 10 s, REN_MAX_RT / REB_MAX_RT 600 s; their
/// duration is bounded by T2 (RENEW) or the valid lifetime (REBIND).
pub const EXTEND: Retransmit = Retransmit {
    initial: Duration::from_secs(10),
    max: Duration::from_secs(600),
    count: usize::MAX,
};
/// RELEASE: REL_TIMEOUT 1 s, two transmissions here (REL_MAX_RC is 4; the operator is being
/// removed and should not hold up its controller).
pub const RELEASE: Retransmit = Retransmit {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(2),
    count: 2,
};

/// The waits after each transmission: RT starts at `initial` ±10 %, doubles ±10 %, is capped
/// at `max` ±10 %, at most `count` of them, and all of them within `total`.
pub fn schedule(p: Retransmit, total: Duration) -> Vec<Duration> {
    let jitter = |d: Duration| {
        let f = 1.0 + (rand::random::<f64>() - 0.5) / 5.0;
        d.mul_f64(f)
    };
    let mut out = Vec::new();
    let mut rt = jitter(p.initial);
    let mut left = total;
    while out.len() < p.count && !left.is_zero() {
        let wait = rt.min(left);
        out.push(wait);
        left = left.saturating_sub(wait);
        rt = jitter(rt * 2);
        if rt > p.max {
            rt = jitter(p.max);
        }
    }
    out
}

/// Whether `link` has a link-local IPv6 address that passed duplicate address detection
/// (`IFA_F_TENTATIVE` clear); a failed DAD is logged and counts as ready, as upstream.
pub async fn link_local_ready(nl: &crate::netlink::Netlink, link: &str) -> bool {
    let Ok(Some(l)) = nl.link_by_name(link).await else {
        return false;
    };
    let Ok(addresses) = nl.addresses().await else {
        return false;
    };
    addresses.iter().any(|a| {
        let ll = matches!(a.address, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local());
        let ready = a.index == l.index && ll && a.flags & IFA_F_TENTATIVE == 0;
        if ready && a.flags & IFA_F_DADFAILED != 0 {
            tracing::warn!(link, address = %a.address, "DAD failed for the link-local address, using it anyway");
        }
        ready
    })
}

/// The DHCPv6 client of one link.
#[derive(Debug)]
pub struct Client {
    link: String,
    identity: Identity,
    socket: UdpSocket,
}

impl Client {
    /// Opens the socket on `link` (see the module docs).
    ///
    /// # Errors
    ///
    /// [`Error::Socket`] if the link does not exist or the port cannot be bound.
    pub fn open(link: &str, identity: Identity) -> Result<Self, Error> {
        let err = |source| Error::Socket {
            link: link.to_string(),
            source,
        };
        let s = socket2::Socket::new(
            socket2::Domain::IPV6,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .map_err(err)?;
        s.set_only_v6(true).map_err(err)?;
        s.set_reuse_address(true).map_err(err)?;
        s.bind_device(Some(link.as_bytes())).map_err(err)?;
        s.set_nonblocking(true).map_err(err)?;
        s.bind(&SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, CLIENT_PORT, 0, 0).into())
            .map_err(err)?;
        let socket = UdpSocket::from_std(s.into()).map_err(err)?;
        Ok(Self {
            link: link.to_string(),
            identity,
            socket,
        })
    }

    /// The link.
    pub fn link(&self) -> &str {
        &self.link
    }

    async fn send(&self, xid: u32, started: Instant, request: &Request) -> Result<(), Error> {
        // Option 8: hundredths of a second since the exchange began, saturating.
        let elapsed = u16::try_from(started.elapsed().as_millis() / 10).unwrap_or(u16::MAX);
        let bytes = packet::build(&self.identity, xid, elapsed, request).map_err(|source| {
            Error::Encode {
                link: self.link.clone(),
                source,
            }
        })?;
        self.socket
            .send_to(&bytes, SocketAddrV6::new(ALL_SERVERS, SERVER_PORT, 0, 0))
            .await
            .map_err(|source| Error::Send {
                link: self.link.clone(),
                source,
            })?;
        Ok(())
    }

    /// Waits until `deadline` for replies of transaction `xid`, handing each to `take` until it
    /// returns `true`; everything else (malformed packets included) is ignored.
    async fn receive(&self, xid: u32, deadline: Instant, take: &mut impl FnMut(Reply) -> bool) {
        let mut buf = vec![0u8; 4096];
        loop {
            let recv = tokio::time::timeout_at(deadline, self.socket.recv_from(&mut buf)).await;
            let n = match recv {
                Err(_) => return,
                Ok(Ok((n, _))) => n,
                Ok(Err(e)) => {
                    tracing::debug!(link = %self.link, error = %e, "DHCPv6 receive error");
                    // Do not spin on a persistent error.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(bytes) = buf.get(..n) else { continue };
            if let Some(r) = packet::parse_reply(bytes, xid, &self.identity) {
                if take(r) {
                    return;
                }
            }
        }
    }

    /// Sends `request` and waits for a reply that `accept` takes, retransmitting after each of
    /// `waits`.
    async fn exchange(
        &self,
        request: &Request,
        waits: &[Duration],
        accept: impl Fn(&Reply) -> bool,
    ) -> Result<Reply, Error> {
        let xid: u32 = rand::random::<u32>() & 0x00ff_ffff;
        let started = Instant::now();
        for wait in waits {
            self.send(xid, started, request).await?;
            let mut got = None;
            self.receive(xid, Instant::now() + *wait, &mut |r| {
                if accept(&r) {
                    got = Some(r);
                    true
                } else {
                    tracing::debug!(link = %self.link, kind = ?r.kind, status = ?r.failure(), "DHCPv6 reply ignored");
                    false
                }
            })
            .await;
            if let Some(r) = got {
                return Ok(r);
            }
        }
        Err(Error::Timeout {
            link: self.link.clone(),
        })
    }

    /// SOLICIT → ADVERTISE (the most preferred one that offers an address, collected during the
    /// first retransmission time unless one has preference 255) → REQUEST → REPLY, hinting
    /// `previous` (the address of an earlier lease).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if no server advertises or replies after the retransmissions,
    /// [`Error::Refused`] if the REPLY carries a failure status; socket errors.
    pub async fn acquire(&self, previous: Option<Ipv6Addr>) -> Result<Lease, Error> {
        let advertise = self.solicit(previous).await?;
        let address = advertise
            .address()
            .map_or(Ipv6Addr::UNSPECIFIED, |a| a.address);
        tracing::debug!(link = %self.link, %address, preference = advertise.preference,
            "DHCPv6 advertise");
        let server_id = advertise.server_id;
        let request = Request::Request {
            server_id: server_id.clone(),
            address,
        };
        let waits = schedule(REQUEST, Duration::MAX);
        let reply = self
            .exchange(&request, &waits, |r| {
                r.kind == MessageType::Reply && r.server_id == server_id
            })
            .await?;
        self.lease_of(&reply)
    }

    async fn solicit(&self, previous: Option<Ipv6Addr>) -> Result<Reply, Error> {
        let request = Request::Solicit { previous };
        let xid: u32 = rand::random::<u32>() & 0x00ff_ffff;
        let started = Instant::now();
        let waits = schedule(SOLICIT, Duration::MAX);
        let offers = |r: &Reply| r.kind == MessageType::Advertise && r.address().is_some();
        for (i, wait) in waits.iter().enumerate() {
            self.send(xid, started, &request).await?;
            let mut best: Option<Reply> = None;
            let first_round = i == 0;
            self.receive(xid, Instant::now() + *wait, &mut |r| {
                if !offers(&r) {
                    tracing::debug!(link = %self.link, kind = ?r.kind, status = ?r.failure(),
                        "DHCPv6 advertise without an address ignored");
                    return false;
                }
                let top = r.preference == u8::MAX;
                if best.as_ref().is_none_or(|b| r.preference > b.preference) {
                    best = Some(r);
                }
                // After the first RT, the first advertisement is taken (RFC 8415 §18.2.1).
                top || !first_round
            })
            .await;
            if let Some(b) = best {
                return Ok(b);
            }
        }
        Err(Error::Timeout {
            link: self.link.clone(),
        })
    }

    fn lease_of(&self, reply: &Reply) -> Result<Lease, Error> {
        Lease::from_reply(&self.link, &self.identity, reply, SystemTime::now()).ok_or_else(|| {
            Error::Refused {
                link: self.link.clone(),
                status: reply.failure().unwrap_or(Status::NoAddrsAvail),
            }
        })
    }

    /// RENEW (to the lease's server) or REBIND (to any server) of `lease`, retransmitting for
    /// at most `within`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] without an answer, [`Error::Refused`] if the server refuses (see
    /// [`Error::lease_lost`]); socket errors.
    pub async fn extend(
        &self,
        lease: &Lease,
        rebind: bool,
        within: Duration,
    ) -> Result<Lease, Error> {
        let server_id = lease.server_duid();
        let request = if rebind {
            Request::Rebind {
                address: lease.address,
            }
        } else {
            Request::Renew {
                server_id: server_id.clone(),
                address: lease.address,
            }
        };
        let waits = schedule(EXTEND, within.max(Duration::from_secs(1)));
        let reply = self
            .exchange(&request, &waits, |r| {
                r.kind == MessageType::Reply && (rebind || r.server_id == server_id)
            })
            .await?;
        self.lease_of(&reply)
    }

    /// RELEASE of `lease`; returns whether the server acknowledged it.
    ///
    /// # Errors
    ///
    /// Socket and encoding errors.
    pub async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        let server_id = lease.server_duid();
        let request = Request::Release {
            server_id: server_id.clone(),
            address: lease.address,
        };
        let waits = schedule(RELEASE, Duration::MAX);
        match self
            .exchange(&request, &waits, |r| {
                r.kind == MessageType::Reply && r.server_id == server_id
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(Error::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retransmissions_double_with_jitter_up_to_the_cap_and_the_total() {
        let w = schedule(SOLICIT, Duration::MAX);
        assert_eq!(w.len(), 6);
        assert!(w[0] >= Duration::from_millis(900) && w[0] <= Duration::from_millis(1100));
        assert!(w[1] >= Duration::from_millis(1600) && w[1] <= Duration::from_millis(2500));
        assert!(w.iter().all(|d| *d <= Duration::from_secs(36)));
        let w = schedule(EXTEND, Duration::from_secs(45));
        assert_eq!(w.iter().sum::<Duration>(), Duration::from_secs(45));
        assert!(w[0] >= Duration::from_secs(9));
        assert!(schedule(EXTEND, Duration::ZERO).is_empty());
    }

    #[test]
    fn lost_leases() {
        let refused = |status| Error::Refused {
            link: "eth0".into(),
            status,
        };
        assert!(refused(Status::NoBinding).lease_lost());
        assert!(refused(Status::NotOnLink).lease_lost());
        assert!(!refused(Status::UnspecFail).lease_lost());
        assert!(!Error::Timeout {
            link: "eth0".into()
        }
        .lease_lost());
    }
}
