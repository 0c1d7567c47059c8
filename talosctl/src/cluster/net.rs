//! The cluster's network, made with iproute2's `ip` (always with `-n <netns>`: the host's own
//! namespace is never changed) and a real dnsmasq as DHCP server:
//!
//! ```text
//!  netns <cluster>-net                    netns <node>            (one per node)
//!  ┌──────────────────────────────┐      ┌──────────────────┐
//!  │ br0 10.5.0.1/24  dnsmasq     │      │ eth0  (DHCP by   │
//!  │  ├─ veth-c1 ──────────────────┼──────┼─ networkd)       │
//!  │  └─ veth-w1 ─── …            │      └──────────────────┘
//!  └──────────────────────────────┘
//! ```
//!
//! `ip` rather than rtnetlink from here: named namespaces are `ip netns`'s convention (a bind
//! mount under `/run/netns`), the same tool shows and removes them by hand, and these few calls
//! are not on a hot path.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context as _;

/// Where `ip netns` keeps named network namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Runs `ip` with `args`; fails with its error output.
pub fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run `ip` (apt-get install iproute2)")?;
    if !out.status.success() {
        anyhow::bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a named network namespace exists.
pub fn netns_exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

/// Creates a named network namespace with its loopback up.
pub fn netns_add(name: &str) -> anyhow::Result<()> {
    ip(&["netns", "add", name])?;
    ip(&["-n", name, "link", "set", "lo", "up"])?;
    Ok(())
}

/// Kills what still runs in a named network namespace, then deletes it (its links go with it).
/// A namespace that is not there is fine.
pub fn netns_del(name: &str) -> anyhow::Result<()> {
    if !netns_exists(name) {
        return Ok(());
    }
    if let Ok(pids) = ip(&["netns", "pids", name]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    ip(&["netns", "del", name]).map(drop)
}

/// Deletes a link in a namespace; a missing namespace or link is fine.
pub fn link_del(netns: &str, link: &str) -> anyhow::Result<()> {
    if !netns_exists(netns) {
        return Ok(());
    }
    match ip(&["-n", netns, "link", "del", link]) {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("Cannot find device") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates the bridge with the gateway address, up.
pub fn bridge_add(netns: &str, bridge: &str, gateway: Ipv4Addr, prefix: u8) -> anyhow::Result<()> {
    ip(&["-n", netns, "link", "add", bridge, "type", "bridge"])?;
    ip(&[
        "-n",
        netns,
        "addr",
        "add",
        &format!("{gateway}/{prefix}"),
        "dev",
        bridge,
    ])?;
    ip(&["-n", netns, "link", "set", bridge, "up"])?;
    Ok(())
}

/// Creates a veth pair: `host_side` in the cluster's namespace, enslaved to the bridge and up;
/// `eth0` with `mac` in the node's namespace, down (networkd brings it up).
pub fn veth_add(
    cluster_netns: &str,
    bridge: &str,
    host_side: &str,
    node_netns: &str,
    mac: &str,
) -> anyhow::Result<()> {
    ip(&[
        "-n",
        cluster_netns,
        "link",
        "add",
        host_side,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "address",
        mac,
        "netns",
        node_netns,
    ])?;
    ip(&[
        "-n",
        cluster_netns,
        "link",
        "set",
        host_side,
        "master",
        bridge,
        "up",
    ])?;
    Ok(())
}

/// Adds a tap `name` for a VM into `bridge` of the cluster's namespace, up (qemu opens it by
/// name).
pub fn tap_add(cluster_netns: &str, bridge: &str, name: &str) -> anyhow::Result<()> {
    ip(&["-n", cluster_netns, "tuntap", "add", name, "mode", "tap"])?;
    ip(&[
        "-n",
        cluster_netns,
        "link",
        "set",
        name,
        "master",
        bridge,
        "up",
    ])?;
    Ok(())
}

/// The IPv4 network of a CIDR: (network address, prefix length).
pub fn parse_cidr(cidr: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let (addr, prefix) = cidr
        .split_once('/')
        .with_context(|| format!("--cidr {cidr:?}: expected an IPv4 network like 10.5.0.0/24"))?;
    let addr: Ipv4Addr = addr
        .parse()
        .with_context(|| format!("--cidr {cidr:?}: {addr:?} is not an IPv4 address"))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (8..=29).contains(p))
        .with_context(|| format!("--cidr {cidr:?}: the prefix length must be 8 to 29"))?;
    let mask = u32::MAX << (32 - prefix);
    if u32::from(addr) & !mask != 0 {
        anyhow::bail!(
            "--cidr {cidr:?}: host bits are set; the network is {}/{prefix}",
            Ipv4Addr::from(u32::from(addr) & mask)
        );
    }
    Ok((addr, prefix))
}

/// The `n`-th address of a network (1: the gateway, 2…: the nodes), if it is a host address.
pub fn host(network: Ipv4Addr, prefix: u8, n: u32) -> Option<Ipv4Addr> {
    let size = 1u64 << (32 - prefix);
    (u64::from(n) < size - 1).then(|| Ipv4Addr::from(u32::from(network) + n))
}

/// The dotted netmask of a prefix length.
pub fn netmask(prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::MAX << (32 - prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_are_checked() {
        assert_eq!(
            parse_cidr("10.5.0.0/24").unwrap(),
            ("10.5.0.0".parse().unwrap(), 24)
        );
        assert!(parse_cidr("10.5.0.1/24").is_err());
        assert!(parse_cidr("10.5.0.0/30").is_err());
        assert!(parse_cidr("10.5.0.0").is_err());
        assert!(parse_cidr("fd00::/64").is_err());
    }

    #[test]
    fn hosts_stop_before_the_broadcast_address() {
        let net: Ipv4Addr = "10.5.0.0".parse().unwrap();
        assert_eq!(host(net, 24, 1), Some("10.5.0.1".parse().unwrap()));
        assert_eq!(host(net, 24, 254), Some("10.5.0.254".parse().unwrap()));
        assert_eq!(host(net, 24, 255), None);
        assert_eq!(netmask(24).to_string(), "255.255.255.0");
    }
}
