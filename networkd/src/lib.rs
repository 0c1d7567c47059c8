//! networkd: the network daemon of a talos-rs node.
//!
//! Controllers turn the machine config, the kernel command line and operators (DHCP) into
//! per-layer specs (`network-config`), merge them (`network`), apply them to the kernel over
//! rtnetlink and observe the kernel back into statuses, node addresses and the network status.
//!
//! - [`controllers`]: every controller, registered by [`controllers::registry`];
//! - [`netlink`]: the only code that speaks rtnetlink;
//! - [`dhcp`]: the DHCPv4 client;
//! - [`dhcp6`]: the DHCPv6 client;
//! - [`run`]: the daemon (connect, define the types, run the controllers until shutdown).
#![forbid(unsafe_code)]

pub mod arp;
pub mod controllers;
pub mod dhcp;
pub mod dhcp6;
pub mod netlink;
pub mod run;
