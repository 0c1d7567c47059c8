//! A node's apid published on the host's loopback, as upstream's docker provisioner publishes
//! its containers' ports: nothing is routed into the host and no firewall rule is added. The
//! node's supervisor (on the host) listens on `127.0.0.1:<port>` and relays each connection,
//! byte for byte, to `127.0.0.1:50000` inside the node's network namespace: TLS stays end to
//! end between the client and apid, which verifies the client's certificate itself.
//!
//! Each connection costs two threads (one per direction) and at most [`MAX_CONNECTIONS`] are
//! relayed at once; more are closed at once, so a local user cannot grow the supervisor
//! without bound.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use nix::sched::CloneFlags;

/// apid's port inside the node.
pub const API_PORT: u16 = 50000;
/// Connections relayed at once.
pub const MAX_CONNECTIONS: usize = 128;

/// A free port on the host's 127.0.0.1 now (the kernel's pick).
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot find a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// Binds `127.0.0.1:port` on the host.
pub fn bind(port: u16) -> anyhow::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port))
        .with_context(|| format!("cannot publish the node's API on 127.0.0.1:{port}"))
}

/// Relays every connection of `listener` to `target` as seen from the network namespace at
/// `netns` (`/run/netns/<name>`): a node's own apid (`127.0.0.1:50000` in the node's
/// namespace) or a VM's (`<ip>:50000` from the cluster's), forever (until the process ends).
pub fn relay(listener: TcpListener, netns: PathBuf, target: SocketAddr) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let client = match conn {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("talosctl node-supervise: accept on the published API port: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let netns = netns.clone();
        let open = open.clone();
        let spawned = std::thread::Builder::new()
            .name("api-relay".into())
            .spawn(move || {
                if let Err(e) = relay_one(client, &netns, target) {
                    eprintln!("talosctl node-supervise: API relay: {e:#}");
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // The thread never ran: its slot is free again.
            eprintln!("talosctl node-supervise: cannot start a relay thread");
        }
    }
}

/// One connection: this thread enters the network namespace (threads of the supervisor are
/// their own, so no other thread moves), connects to apid, and the bytes flow both ways until
/// either side closes.
fn relay_one(client: TcpStream, netns: &std::path::Path, addr: SocketAddr) -> anyhow::Result<()> {
    let ns =
        std::fs::File::open(netns).with_context(|| format!("cannot open {}", netns.display()))?;
    nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| anyhow::anyhow!("cannot enter the node's network namespace: {e}"))?;
    drop(ns);
    let server = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("apid does not accept connections on {addr}"))?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    let back = std::thread::Builder::new()
        .name("api-relay-back".into())
        .spawn(move || pipe(s2, c2))
        .context("cannot start a relay thread")?;
    pipe(client, server);
    let _ = back.join();
    Ok(())
}

/// Copies `from` to `to` until `from` ends or fails, then closes both connections both ways:
/// the other direction's thread wakes up, so a peer that stops reading or writing never holds
/// a relay slot once its other side is gone (gRPC needs no TCP half-close).
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
