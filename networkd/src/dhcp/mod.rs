//! The DHCPv4 client: message codec on `dhcproto` ([`packet`]), leases and their timers
//! ([`lease`]), the exchanges on a link-bound UDP socket ([`client`]) and the per-link state
//! machine that keeps a lease ([`operator`]).
//!
//! DHCPv6 is in [`crate::dhcp6`].

pub mod client;
pub mod lease;
pub mod operator;
pub mod packet;

pub use client::Client;
pub use lease::{Dhcp4Lease, Dhcp4LeaseSpec, Lease};
pub use operator::Operator;
pub use packet::Identity;
