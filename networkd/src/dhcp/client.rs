//! The DHCPv4 exchanges on one link: DISCOVER/OFFER/REQUEST/ACK, RENEW (unicast), REBIND
//! (broadcast) and RELEASE.
//!
//! # The socket
//!
//! A plain UDP socket on port 68, bound to the link with `SO_BINDTODEVICE`, `SO_BROADCAST` set.
//! Before the link has an address the kernel cannot deliver a unicast reply to us, so every
//! message sent without an address sets the BOOTP broadcast flag: servers (dnsmasq included)
//! then broadcast OFFER and ACK to 255.255.255.255:68, which the socket receives. Once leased,
//! RENEW is unicast from the leased address to the server and the reply is unicast back.
//!
//! Why not a raw `AF_PACKET` socket, as upstream's nclient4: it needs `CAP_NET_RAW`, a hand-made
//! Ethernet/IP/UDP stack and a socket family the sandbox would rather forbid (`talosctl audit`
//! scores `RestrictAddressFamilies=~AF_PACKET`). The price: with strict or loose reverse-path
//! filtering (`rp_filter` 1 or 2) on a link without any address, the kernel drops the broadcast
//! replies as martians; networkd expects `rp_filter=0` (the kernel default) on DHCP links.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, SystemTime};

use dhcproto::v4::MessageType;
use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::lease::Lease;
use super::packet::{self, Identity, Reply, Request};

/// The client port.
pub const CLIENT_PORT: u16 = 68;
/// The server port.
pub const SERVER_PORT: u16 = 67;

/// Retransmission waits of DISCOVER and REQUEST (RFC 2131 §4.1: 4, 8, 16, 32 s, randomized by
/// up to one second).
pub const RETRANSMIT: [Duration; 4] = [
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(32),
];

/// A DHCP failure on a link.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be opened or bound to the link.
    #[error("cannot open the DHCP socket on link {link}")]
    Socket {
        /// The link.
        link: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A message could not be sent.
    #[error("cannot send a DHCP message on link {link}")]
    Send {
        /// The link.
        link: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A message could not be encoded.
    #[error("cannot encode a DHCP message for link {link}")]
    Encode {
        /// The link.
        link: String,
        /// The cause.
        #[source]
        source: dhcproto::error::EncodeError,
    },
    /// No server answered in time.
    #[error("no DHCP server answered on link {link}")]
    Timeout {
        /// The link.
        link: String,
    },
    /// The server refused the request (DHCPNAK).
    #[error("the DHCP server refused the request on link {link}")]
    Nak {
        /// The link.
        link: String,
    },
}

/// The DHCP client of one link.
#[derive(Debug)]
pub struct Client {
    link: String,
    identity: Identity,
    socket: UdpSocket,
}

/// Where a message goes.
#[derive(Clone, Copy, Debug)]
enum Dest {
    Broadcast,
    Unicast(Ipv4Addr),
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
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .map_err(err)?;
        s.set_reuse_address(true).map_err(err)?;
        s.set_broadcast(true).map_err(err)?;
        s.bind_device(Some(link.as_bytes())).map_err(err)?;
        s.set_nonblocking(true).map_err(err)?;
        s.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, CLIENT_PORT).into())
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

    async fn send(&self, xid: u32, secs: u16, request: Request, dest: Dest) -> Result<(), Error> {
        let bytes =
            packet::build(&self.identity, xid, secs, request).map_err(|source| Error::Encode {
                link: self.link.clone(),
                source,
            })?;
        let to = match dest {
            Dest::Broadcast => SocketAddrV4::new(Ipv4Addr::BROADCAST, SERVER_PORT),
            Dest::Unicast(server) => SocketAddrV4::new(server, SERVER_PORT),
        };
        self.socket
            .send_to(&bytes, to)
            .await
            .map_err(|source| Error::Send {
                link: self.link.clone(),
                source,
            })?;
        Ok(())
    }

    /// Waits until `deadline` for a reply of transaction `xid` that `accept` takes; everything
    /// else (malformed packets included) is ignored.
    async fn receive(
        &self,
        xid: u32,
        deadline: Instant,
        accept: &impl Fn(&Reply) -> bool,
    ) -> Option<Reply> {
        let mut buf = vec![0u8; 4096];
        loop {
            let recv = tokio::time::timeout_at(deadline, self.socket.recv_from(&mut buf)).await;
            let n = match recv {
                Err(_) => return None,
                Ok(Ok((n, _))) => n,
                Ok(Err(e)) => {
                    tracing::debug!(link = %self.link, error = %e, "DHCP receive error");
                    // Do not spin on a persistent error.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(bytes) = buf.get(..n) else { continue };
            match packet::parse_reply(bytes, xid, &self.identity.mac) {
                Some(r) if accept(&r) => return Some(r),
                Some(r) => tracing::debug!(link = %self.link, kind = ?r.kind, "DHCP reply ignored"),
                None => {}
            }
        }
    }

    /// Sends `request` and waits for an accepted reply, retransmitting after each of `waits`.
    async fn exchange(
        &self,
        xid: u32,
        started: Instant,
        request: Request,
        dest: Dest,
        waits: &[Duration],
        accept: impl Fn(&Reply) -> bool,
    ) -> Result<Reply, Error> {
        for wait in waits {
            let secs = u16::try_from(started.elapsed().as_secs()).unwrap_or(u16::MAX);
            self.send(xid, secs, request, dest).await?;
            let jitter = Duration::from_millis(rand::random_range(0..1000));
            let deadline = Instant::now() + *wait + jitter;
            if let Some(reply) = self.receive(xid, deadline, &accept).await {
                return Ok(reply);
            }
        }
        Err(Error::Timeout {
            link: self.link.clone(),
        })
    }

    /// DISCOVER → OFFER → REQUEST → ACK, asking for `previous` (the address of an earlier lease)
    /// first.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if no server offers or acknowledges after the retransmissions,
    /// [`Error::Nak`] if the server refuses the request; socket errors.
    pub async fn acquire(&self, previous: Option<Ipv4Addr>) -> Result<Lease, Error> {
        let xid: u32 = rand::random();
        let started = Instant::now();
        let offer = self
            .exchange(
                xid,
                started,
                Request::Discover { previous },
                Dest::Broadcast,
                &RETRANSMIT,
                |r| r.kind == MessageType::Offer,
            )
            .await?;
        let server = offer.server.unwrap_or(Ipv4Addr::UNSPECIFIED);
        tracing::debug!(link = %self.link, address = %offer.address, %server, "DHCP offer");
        let ack = self
            .exchange(
                xid,
                started,
                Request::Select {
                    address: offer.address,
                    server,
                },
                Dest::Broadcast,
                &RETRANSMIT,
                |r| {
                    r.server == Some(server)
                        && (r.kind == MessageType::Nak
                            || (r.kind == MessageType::Ack && r.address == offer.address))
                },
            )
            .await?;
        self.lease_of(&ack)
    }

    fn lease_of(&self, reply: &Reply) -> Result<Lease, Error> {
        if reply.kind == MessageType::Nak {
            return Err(Error::Nak {
                link: self.link.clone(),
            });
        }
        Lease::from_ack(&self.link, reply, SystemTime::now()).ok_or_else(|| Error::Nak {
            link: self.link.clone(),
        })
    }

    /// One RENEW (unicast to the lease's server, RENEWING state) or REBIND (broadcast,
    /// REBINDING state) of `lease`, waiting `wait` for the answer.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] without an answer, [`Error::Nak`] if the lease is refused; socket
    /// errors.
    pub async fn extend(
        &self,
        lease: &Lease,
        rebind: bool,
        wait: Duration,
    ) -> Result<Lease, Error> {
        let xid: u32 = rand::random();
        let dest = if rebind {
            Dest::Broadcast
        } else {
            Dest::Unicast(lease.server)
        };
        let expected_server = (!rebind).then_some(lease.server);
        let reply = self
            .exchange(
                xid,
                Instant::now(),
                Request::Extend {
                    address: lease.address,
                },
                dest,
                &[wait],
                |r| {
                    expected_server.is_none_or(|s| r.server == Some(s))
                        && (r.kind == MessageType::Nak
                            || (r.kind == MessageType::Ack && r.address == lease.address))
                },
            )
            .await?;
        self.lease_of(&reply)
    }

    /// Sends DHCPRELEASE of `lease` to its server (no answer is expected).
    ///
    /// # Errors
    ///
    /// Socket and encoding errors.
    pub async fn release(&self, lease: &Lease) -> Result<(), Error> {
        self.send(
            rand::random(),
            0,
            Request::Release {
                address: lease.address,
                server: lease.server,
            },
            Dest::Unicast(lease.server),
        )
        .await
    }
}
