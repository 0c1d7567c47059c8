//! The DHCPv6 client (RFC 8415, stateful, one IA_NA per link): message codec on `dhcproto`'s
//! `v6` module ([`packet`]), leases and their timers ([`lease`]), the exchanges on a link-bound
//! UDP socket ([`client`]) and the per-link state machine that keeps a lease ([`operator`]).
//! The operator controller turns its leases into operator-layer specs as upstream's DHCP6
//! operator does: the address as a `/128`, resolvers (options 23 and 24), time servers
//! (option 56) and the hostname (option 39); no routes (those come from router advertisements,
//! left to the kernel).

pub mod client;
pub mod lease;
pub mod operator;
pub mod packet;

pub use client::Client;
pub use lease::{Dhcp6Lease, Dhcp6LeaseSpec, Lease};
pub use operator::Operator;
pub use packet::Identity;
