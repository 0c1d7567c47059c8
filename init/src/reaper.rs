//! The one place that waits for children: on every SIGCHLD it reaps every child that ended
//! (`waitpid(-1, WNOHANG)`), hands the status of a supervised one to its supervisor and drops
//! the others, so that as PID 1 no zombie stays behind (orphans re-parented to init included).
//!
//! A child that ends before its supervisor registered it (it can die right after exec) is kept
//! as unclaimed for a while, so registering late still gets its status.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    /// The exit code, if it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code(c) => Some(c),
            Exit::Signal(_) => None,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit {c}"),
            Exit::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// Unclaimed statuses kept at most (orphans that nobody registers).
const UNCLAIMED: usize = 256;

#[derive(Default)]
struct Inner {
    waiting: HashMap<i32, oneshot::Sender<Exit>>,
    unclaimed: VecDeque<(i32, Exit)>,
}

/// Reaps children and routes their statuses. Cheap to share.
#[derive(Clone, Default)]
pub struct Reaper {
    inner: Arc<Mutex<Inner>>,
}

impl Reaper {
    /// A reaper; [`Reaper::run`] must run for it to reap.
    pub fn new() -> Reaper {
        Reaper::default()
    }

    /// The status of `pid` once it ends.
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        if let Some(i) = inner.unclaimed.iter().position(|(p, _)| *p == pid) {
            if let Some((_, exit)) = inner.unclaimed.remove(i) {
                let _ = tx.send(exit);
            }
        } else {
            inner.waiting.insert(pid, tx);
        }
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves consistent maps; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reaps every child that has ended; returns how many.
    pub fn reap(&self) -> usize {
        let mut n = 0;
        loop {
            let (pid, exit) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid.as_raw(), Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid.as_raw(), Exit::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(_) => return n,
                Ok(_) => continue, // stopped/continued: not an end
            };
            n += 1;
            let mut inner = self.lock();
            match inner.waiting.remove(&pid) {
                Some(tx) => {
                    let _ = tx.send(exit);
                }
                None => {
                    tracing::debug!(pid, %exit, "reaped a process nobody supervises");
                    if inner.unclaimed.len() == UNCLAIMED {
                        inner.unclaimed.pop_front();
                    }
                    inner.unclaimed.push_back((pid, exit));
                }
            }
        }
    }

    /// Reaps on every SIGCHLD (and every second, in case a signal was coalesced away) forever.
    pub async fn run(self) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigchld = match signal(SignalKind::child()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGCHLD: reaping by polling");
                None
            }
        };
        loop {
            self.reap();
            match &mut sigchld {
                Some(s) => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), s.recv()).await;
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_child_that_ended_before_it_was_watched_is_still_reported() {
        let reaper = Reaper::new();
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while reaper.reap() == 0 {
            assert!(std::time::Instant::now() < deadline, "never reaped");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(reaper.watch(pid).await.unwrap(), Exit::Code(7));
        drop(child); // already reaped: dropping a std Child does not wait
    }
}
