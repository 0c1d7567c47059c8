//! TCP connections made from inside another network namespace (a node's, from the host):
//! each by a thread of its own that enters the namespace (`setns`), so that no other thread of
//! the caller changes namespace. The socket stays in that namespace once made. For
//! `machinery::tls::channel_via` (the node tests, the API benchmark).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

/// A connection being made (`machinery::tls::Dial`).
pub type Dial = Pin<Box<dyn Future<Output = std::io::Result<tokio::net::TcpStream>> + Send>>;

/// A dialer into the network namespace at `netns` (`/proc/<pid>/ns/net`, `/run/netns/<name>`),
/// or one that fails saying `why` when there is none.
pub fn dial_in(
    netns: Result<PathBuf, String>,
    timeout: Duration,
) -> impl Fn(SocketAddr) -> Dial + Clone + Send + 'static {
    move |addr| {
        let netns = netns.clone();
        Box::pin(async move {
            let netns = netns.map_err(std::io::Error::other)?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let r = (|| {
                    let ns = std::fs::File::open(&netns)?;
                    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                    let s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
                    s.set_nodelay(true)?;
                    s.set_nonblocking(true)?;
                    Ok::<_, std::io::Error>(s)
                })();
                let _ = tx.send(r);
            });
            let s = rx
                .await
                .map_err(|_| std::io::Error::other("the dialing thread died"))??;
            tokio::net::TcpStream::from_std(s)
        })
    }
}
