//! The only code of networkd that speaks rtnetlink (style §5.2): links, addresses, routes, the
//! multicast watcher, and the reading of the kernel's hostname.
//!
//! Requests go over one [`Netlink`] connection (rtnetlink, request/response); kernel events are
//! received on a separate, dedicated socket ([`watch::Watcher`]) that only joins multicast groups,
//! because notifications and request/response traffic cannot share a socket (networking.md §0).
//!
//! Everything here is plain kernel data ([`Link`], [`Address`], [`Route`]) with numeric kernel
//! values; the controllers map resources to and from it.
//!
//! # Ownership marks
//!
//! networkd never deletes a kernel object it did not create. What it created carries a mark the
//! kernel keeps for the object's lifetime, so the mark survives restarts of networkd and stated:
//!
//! - addresses: `IFA_PROTO` = [`OWN_PROTOCOL`];
//! - routes: `rtm_protocol` = [`OWN_PROTOCOL`] (the spec's protocol field is informational);
//! - logical links: the alternative name [`ownership_altname`] (`talos-rs-<name>`).
//!
//! An object that satisfies a spec but carries no mark (the kernel's `127.0.0.1/8` on `lo`, a
//! prefix route, a bridge an administrator made) is left as it is and never deleted.

mod address;
mod link;
mod route;
pub mod watch;

use std::num::NonZeroI32;

use futures::StreamExt;

pub use address::{Address, AddressAdd};
pub use link::{
    ownership_altname, BondInfo, BridgeInfo, Link, LinkChange, LinkCreate, LinkKind, VlanInfo,
};
pub use route::{NextHop, Route, AF_INET, AF_INET6};

/// The protocol number networkd marks its addresses (`IFA_PROTO`) and routes (`rtm_protocol`)
/// with: unassigned in `/etc/iproute2/rt_protos` and `rt_addrprotos` (`ip` prints `proto 84`).
pub const OWN_PROTOCOL: u8 = 84;

/// `errno` values the controllers branch on.
pub mod errno {
    /// No such object (`ENOENT`).
    pub const ENOENT: i32 = 2;
    /// No such process (`ESRCH`): the kernel's answer to deleting a missing route.
    pub const ESRCH: i32 = 3;
    /// Exists already (`EEXIST`).
    pub const EEXIST: i32 = 17;
    /// No such device (`ENODEV`).
    pub const ENODEV: i32 = 19;
    /// Cannot assign requested address (`EADDRNOTAVAIL`): deleting a missing address.
    pub const EADDRNOTAVAIL: i32 = 99;
    /// Network is unreachable (`ENETUNREACH`): a gateway outside every connected subnet.
    pub const ENETUNREACH: i32 = 101;
}

/// A netlink failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket")]
    Socket(#[source] std::io::Error),
    /// The kernel refused a request, or the connection failed.
    #[error("netlink: {op}")]
    Request {
        /// What was asked, e.g. `add address 10.0.0.2/24 to link 3`.
        op: String,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// A `/proc/sys/kernel` file could not be read.
    #[error("cannot {op} the {what}")]
    Hostname {
        /// `get` (networkd only reads them: init sets the hostname).
        op: &'static str,
        /// `hostname` or `domainname`.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The kernel's errno (positive) if the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Request {
                source: rtnetlink::Error::NetlinkError(e),
                ..
            } => e.code.map(|c: NonZeroI32| -c.get()),
            _ => None,
        }
    }

    /// Whether the kernel said the object exists already.
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(errno::EEXIST)
    }

    /// Whether the kernel said the object (or its device) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(errno::ENOENT | errno::ESRCH | errno::ENODEV | errno::EADDRNOTAVAIL)
        )
    }
}

/// A request/response rtnetlink connection. Cheap to clone; the connection task ends when the
/// last clone is dropped.
#[derive(Clone, Debug)]
pub struct Netlink {
    handle: rtnetlink::Handle,
    _conn: std::sync::Arc<AbortOnDrop>,
}

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Netlink {
    /// Opens a connection in the current network namespace (must run inside a tokio runtime).
    ///
    /// # Errors
    ///
    /// [`Error::Socket`] if the socket cannot be opened.
    pub fn connect() -> Result<Self, Error> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(Error::Socket)?;
        let task = tokio::spawn(conn);
        Ok(Self {
            handle,
            _conn: std::sync::Arc::new(AbortOnDrop(task)),
        })
    }

    /// The underlying rtnetlink handle.
    pub(crate) fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }
}

/// Collects a dump stream, skipping nothing: a message the library cannot decode fails the dump
/// (the caller retries the pass), it never panics.
async fn collect<T>(
    op: &str,
    stream: impl futures::Stream<Item = Result<T, rtnetlink::Error>>,
) -> Result<Vec<T>, Error> {
    let mut stream = std::pin::pin!(stream);
    let mut out = Vec::new();
    while let Some(item) = stream.next().await {
        out.push(item.map_err(|source| Error::Request {
            op: op.to_string(),
            source,
        })?);
    }
    Ok(out)
}

/// Maps a request result to [`Error::Request`] with a lazily built description.
fn request<T>(
    result: Result<T, rtnetlink::Error>,
    op: impl FnOnce() -> String,
) -> Result<T, Error> {
    result.map_err(|source| Error::Request { op: op(), source })
}

/// The kernel's hostname and domain name (of the UTS namespace networkd runs in).
///
/// # Errors
///
/// [`Error::Hostname`] if `/proc/sys/kernel/{hostname,domainname}` cannot be read.
pub fn hostname() -> Result<(String, String), Error> {
    let read = |what: &'static str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{what}"))
            .map(|s| s.trim_end_matches('\n').to_string())
            .map_err(|source| Error::Hostname {
                op: "get",
                what,
                source,
            })
    };
    let host = read("hostname")?;
    let domain = read("domainname")?;
    // The kernel's "no domain" is the literal "(none)".
    let domain = if domain == "(none)" {
        String::new()
    } else {
        domain
    };
    Ok((host, domain))
}

/// A controller's access to the kernel: the request connection and the event watcher, both
/// opened on the first reconcile (inside the runtime, with the controller's waker), so that a
/// registry can be built without a tokio runtime or a network namespace.
#[derive(Debug, Default)]
pub struct Kernel {
    groups: u32,
    netlink: Option<Netlink>,
    watcher: Option<watch::Watcher>,
    /// Where the watcher records the kernel's messages, for a controller that updates from them.
    log: Option<std::sync::Arc<watch::ChangeLog>>,
}

impl Kernel {
    /// Access that will watch the multicast `groups` (`watch::GROUP_*`; 0 for none).
    pub fn new(groups: u32) -> Self {
        Self {
            groups,
            netlink: None,
            watcher: None,
            log: None,
        }
    }

    /// Access that also records the messages of the watched `groups` for
    /// [`changes`](Self::changes).
    pub fn recording(groups: u32) -> Self {
        Self {
            log: Some(std::sync::Arc::default()),
            ..Self::new(groups)
        }
    }

    /// The kernel's changes recorded since the last call (in order); `None` if some were lost,
    /// if this access does not record, or before [`connect`](Self::connect) started the watch:
    /// then the caller must re-list.
    pub fn changes(&self) -> Option<Vec<watch::Change>> {
        self.watcher.as_ref()?;
        self.log.as_ref()?.take()
    }

    /// The connection, opening it (and starting the watcher, before any listing, so no event
    /// between a listing and the watch is lost) on first use.
    ///
    /// # Errors
    ///
    /// [`Error::Socket`] if a socket cannot be opened.
    pub fn connect(&mut self, waker: &cosi::Waker) -> Result<&Netlink, Error> {
        if self.watcher.is_none() && self.groups != 0 {
            let waker = waker.clone();
            self.watcher = Some(watch::Watcher::start_recording(
                self.groups,
                self.log.clone(),
                move || waker.wake(),
            )?);
        }
        if self.netlink.is_none() {
            self.netlink = Some(Netlink::connect()?);
        }
        self.netlink
            .as_ref()
            .ok_or_else(|| Error::Socket(std::io::Error::other("netlink connection missing")))
    }
}

/// Finds the link a spec names: the exact name first, then (unless `exact`) an alias
/// (`IFLA_IFALIAS`), then an alternative name, as upstream's `resolveLinkName`. Logical links
/// are matched by exact name only.
pub fn resolve_link<'a>(links: &'a [Link], name: &str, exact: bool) -> Option<&'a Link> {
    if name.is_empty() {
        return None;
    }
    links.iter().find(|l| l.name == name).or_else(|| {
        if exact {
            return None;
        }
        links
            .iter()
            .find(|l| l.alias == name)
            .or_else(|| links.iter().find(|l| l.alt_names.iter().any(|a| a == name)))
    })
}
