//! The kernel's own view of a network namespace, timed: a thread that enters the namespace,
//! joins the rtnetlink multicast groups of links, IPv4/IPv6 addresses and routes, and records
//! the moment each address and route appeared (or went) and each link came up.
//!
//! Both sides of every comparison are timed by this same observer, so the figures compare like
//! with like: the end of a run is the receive time of the event that completed the expected set,
//! not a poll interval. If the socket overruns (`ENOBUFS`, events lost) the thread re-dumps
//! links, addresses and routes; what it learns that way is stamped with the dump time (later than
//! the truth) and counted in [`State::resyncs`], which the bench reports.

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use nix::sched::CloneFlags;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

/// `RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_IFADDR | RTMGRP_IPV6_ROUTE`.
const GROUPS: u32 = 0x1 | 0x10 | 0x40 | 0x100 | 0x400;

/// An address on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrKey {
    /// Link index.
    pub index: u32,
    /// The local address.
    pub addr: IpAddr,
    /// Prefix length.
    pub len: u8,
}

/// A route, by the kernel's identity of it (less TOS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteKey {
    /// Table.
    pub table: u32,
    /// Destination (`None`: default).
    pub dst: Option<IpAddr>,
    /// Destination prefix length.
    pub len: u8,
    /// Metric.
    pub priority: u32,
}

/// How many events of each kind were received.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// `RTM_NEWADDR`.
    pub new_addr: u64,
    /// `RTM_DELADDR`.
    pub del_addr: u64,
    /// `RTM_NEWROUTE`.
    pub new_route: u64,
    /// `RTM_DELROUTE`.
    pub del_route: u64,
}

/// A link as last reported.
#[derive(Clone, Debug)]
pub struct LinkState {
    /// Its name.
    pub name: String,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// When it last went from down to up while observed.
    pub up_at: Option<Instant>,
}

/// What the observer knows.
#[derive(Debug, Default)]
pub struct State {
    /// Links by index.
    pub links: HashMap<u32, LinkState>,
    /// Present addresses, with the time each appeared.
    pub addrs: HashMap<AddrKey, Instant>,
    /// Addresses that went, with the time of their last deletion.
    pub deleted_addrs: HashMap<AddrKey, Instant>,
    /// Present routes, with the time each appeared.
    pub routes: HashMap<RouteKey, Instant>,
    /// Event counts.
    pub counts: Counts,
    /// Re-dumps after overruns.
    pub resyncs: u64,
    /// Messages that could not be decoded.
    pub undecodable: u64,
    /// Why the observer stopped, if it failed.
    pub error: Option<String>,
}

impl State {
    /// The index of link `name`.
    pub fn link_index(&self, name: &str) -> Option<u32> {
        self.links
            .iter()
            .find(|(_, l)| l.name == name)
            .map(|(i, _)| *i)
    }

    /// When the last of `keys` appeared, if all are present.
    pub fn all_addrs(&self, keys: &[AddrKey]) -> Option<Instant> {
        keys.iter()
            .map(|k| self.addrs.get(k).copied())
            .try_fold(None, |acc: Option<Instant>, t| {
                t.map(|t| Some(acc.map_or(t, |a| a.max(t))))
            })
            .flatten()
    }

    /// When the last of `keys` appeared, if all are present.
    pub fn all_routes(&self, keys: &[RouteKey]) -> Option<Instant> {
        keys.iter()
            .map(|k| self.routes.get(k).copied())
            .try_fold(None, |acc: Option<Instant>, t| {
                t.map(|t| Some(acc.map_or(t, |a| a.max(t))))
            })
            .flatten()
    }

    /// When the first of `keys` appeared, if any is present.
    pub fn first_addr(&self, keys: &[AddrKey]) -> Option<Instant> {
        keys.iter().filter_map(|k| self.addrs.get(k).copied()).min()
    }

    /// When the first of `keys` appeared, if any is present.
    pub fn first_route(&self, keys: &[RouteKey]) -> Option<Instant> {
        keys.iter()
            .filter_map(|k| self.routes.get(k).copied())
            .min()
    }
}

/// The observer of one namespace; stopped (and its thread joined) on drop.
pub struct KernelWatch {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KernelWatch {
    /// Starts observing the namespace `netns` (an `ip netns` name); returns once the initial
    /// dump is in and the groups are joined, so nothing that happens afterwards is missed.
    pub fn start(netns: &str) -> Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let path = format!("/run/netns/{netns}");
        let thread = {
            let state = state.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("watch-{netns}"))
                .spawn(move || {
                    let setup = Observer::open(&path);
                    let mut observer = match setup {
                        Ok(o) => o,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    if let Err(e) = observer.resync(&state, false) {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    let _ = ready_tx.send(Ok(()));
                    if let Err(e) = observer.run(&state, &stop) {
                        lock(&state).error = Some(format!("{e:#}"));
                    }
                })
                .context("spawn the netlink observer")?
        };
        let watch = Self {
            state,
            stop,
            thread: Some(thread),
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| anyhow!("the netlink observer did not start"))??;
        Ok(watch)
    }

    /// The state, locked.
    pub fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Polls `f` on the state every 2 ms until it returns `Some`, failing after `timeout`.
    pub async fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&State) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let s = self.state();
                if let Some(e) = &s.error {
                    bail!("netlink observer failed while waiting for {what}: {e}");
                }
                if let Some(v) = f(&s) {
                    return Ok(v);
                }
            }
            if Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for KernelWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The thread's sockets, both opened inside the namespace.
struct Observer {
    events: Socket,
    dump: Socket,
    seq: u32,
}

impl Observer {
    fn open(netns_path: &str) -> Result<Self> {
        let ns = File::open(netns_path).with_context(|| format!("open {netns_path}"))?;
        // Only this thread moves; sockets keep the namespace they were created in.
        nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).context("setns into the namespace")?;
        let mut events = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
        events
            .bind(&SocketAddr::new(0, GROUPS))
            .context("join the rtnetlink groups")?;
        // 32 MiB, past rmem_max (we are root), so that thousands of events in a burst fit; an
        // overrun is survived anyway (resync).
        if setsockopt(&events, sockopt::RcvBufForce, &(32 << 20)).is_err() {
            let _ = events.set_rx_buf_sz(32 << 20);
        }
        setsockopt(&events, sockopt::ReceiveTimeout, &TimeVal::new(0, 20_000))
            .context("SO_RCVTIMEO")?;
        let mut dump = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
        dump.bind_auto().context("bind the dump socket")?;
        dump.connect(&SocketAddr::new(0, 0))
            .context("connect the dump socket")?;
        Ok(Self {
            events,
            dump,
            seq: 0,
        })
    }

    fn run(&mut self, state: &Mutex<State>, stop: &AtomicBool) -> Result<()> {
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
        while !stop.load(Ordering::SeqCst) {
            buf.clear();
            match self.events.recv(&mut buf, 0) {
                Ok(_) => {
                    let now = Instant::now();
                    let mut s = lock(state);
                    for msg in messages(&buf, &mut s.undecodable) {
                        if let NetlinkPayload::InnerMessage(m) = msg.payload {
                            apply(&mut s, m, now);
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                    self.resync(state, true)?;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e).context("receive rtnetlink events"),
            }
        }
        Ok(())
    }

    /// Dumps links, addresses and routes and replaces the state's view with them; objects not
    /// known before are stamped now.
    fn resync(&mut self, state: &Mutex<State>, overrun: bool) -> Result<()> {
        let links = self.dump_all(RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
        let addrs = self.dump_all(RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        let routes = self.dump_all(RouteNetlinkMessage::GetRoute(RouteMessage::default()))?;
        let now = Instant::now();
        let mut s = lock(state);
        if overrun {
            s.resyncs += 1;
        }
        for m in links {
            if let RouteNetlinkMessage::NewLink(l) = m {
                apply_link(&mut s, &l, now);
            }
        }
        let mut present = HashMap::new();
        for m in addrs {
            if let RouteNetlinkMessage::NewAddress(a) = m {
                if let Some(k) = addr_key(&a) {
                    let t = s.addrs.get(&k).copied().unwrap_or(now);
                    present.insert(k, t);
                }
            }
        }
        let gone: Vec<AddrKey> = s
            .addrs
            .keys()
            .filter(|k| !present.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            s.deleted_addrs.insert(k, now);
        }
        s.addrs = present;
        let mut present = HashMap::new();
        for m in routes {
            if let RouteNetlinkMessage::NewRoute(r) = m {
                if let Some(k) = route_key(&r) {
                    let t = s.routes.get(&k).copied().unwrap_or(now);
                    present.insert(k, t);
                }
            }
        }
        s.routes = present;
        Ok(())
    }

    /// One dump request, answered to the end.
    fn dump_all(&mut self, request: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq += 1;
        let mut msg = NetlinkMessage::from(request);
        msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        msg.header.sequence_number = self.seq;
        msg.finalize();
        let mut out = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut out);
        self.dump.send(&out, 0).context("send a dump request")?;
        let mut replies = Vec::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
        let mut undecodable = 0;
        loop {
            buf.clear();
            self.dump.recv(&mut buf, 0).context("receive a dump")?;
            for m in messages(&buf, &mut undecodable) {
                if m.header.sequence_number != self.seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::Error(e) => bail!("dump refused: {e:?}"),
                    NetlinkPayload::InnerMessage(r) => replies.push(r),
                    _ => {}
                }
            }
        }
    }
}

/// The messages of one datagram; undecodable ones are counted and skipped.
fn messages(buf: &[u8], undecodable: &mut u64) -> Vec<NetlinkMessage<RouteNetlinkMessage>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < buf.len() {
        let Some(rest) = buf.get(off..) else { break };
        let Ok(header) = NetlinkBuffer::new_checked(rest) else {
            *undecodable += 1;
            break;
        };
        let len = header.length() as usize;
        if len == 0 {
            break;
        }
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest) {
            Ok(m) => out.push(m),
            Err(_) => *undecodable += 1,
        }
        off += (len + 3) & !3;
    }
    out
}

fn apply(s: &mut State, m: RouteNetlinkMessage, now: Instant) {
    match m {
        RouteNetlinkMessage::NewLink(l) => apply_link(s, &l, now),
        RouteNetlinkMessage::DelLink(l) => {
            s.links.remove(&l.header.index);
        }
        RouteNetlinkMessage::NewAddress(a) => {
            s.counts.new_addr += 1;
            if let Some(k) = addr_key(&a) {
                s.addrs.entry(k).or_insert(now);
            }
        }
        RouteNetlinkMessage::DelAddress(a) => {
            s.counts.del_addr += 1;
            if let Some(k) = addr_key(&a) {
                s.addrs.remove(&k);
                s.deleted_addrs.insert(k, now);
            }
        }
        RouteNetlinkMessage::NewRoute(r) => {
            s.counts.new_route += 1;
            if let Some(k) = route_key(&r) {
                s.routes.entry(k).or_insert(now);
            }
        }
        RouteNetlinkMessage::DelRoute(r) => {
            s.counts.del_route += 1;
            if let Some(k) = route_key(&r) {
                s.routes.remove(&k);
            }
        }
        _ => {}
    }
}

fn apply_link(s: &mut State, l: &LinkMessage, now: Instant) {
    let up = l.header.flags.contains(LinkFlags::Up);
    let name = l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    });
    let entry = s.links.entry(l.header.index).or_insert_with(|| LinkState {
        name: String::new(),
        up: false,
        up_at: None,
    });
    if let Some(n) = name {
        entry.name = n;
    }
    if up && !entry.up {
        entry.up_at = Some(now);
    }
    entry.up = up;
}

fn addr_key(a: &AddressMessage) -> Option<AddrKey> {
    let mut address = None;
    let mut local = None;
    for attr in &a.attributes {
        match attr {
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Local(ip) => local = Some(*ip),
            _ => {}
        }
    }
    Some(AddrKey {
        index: a.header.index,
        addr: local.or(address)?,
        len: a.header.prefix_len,
    })
}

fn route_key(r: &RouteMessage) -> Option<RouteKey> {
    let mut table = u32::from(r.header.table);
    let mut dst = None;
    let mut priority = 0;
    for attr in &r.attributes {
        match attr {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    Some(RouteKey {
        table,
        dst,
        len: r.header.destination_prefix_length,
        priority,
    })
}
