//! The DHCPv4 client.
