//! The skeleton every daemon's `main.rs` runs on: logging, hardening of the process itself,
//! the fds init hands over (readiness pipe, a held listening socket), the async runtime, the
//! shutdown signal, and exit codes init understands. A daemon's `main.rs` is then its
//! command-line arguments and one call.
//!
//! ```no_run
//! # async fn serve(ready: impl FnOnce(), stop: impl std::future::Future) -> Result<(), std::io::Error> { Ok(()) }
//! fn main() -> std::process::ExitCode {
//!     let d = match sandbox::daemon::Daemon::start("exampled", "info") {
//!         Ok(d) => d,
//!         Err(code) => return code,
//!     };
//!     let notify = match d.notifier(Some(3)) {
//!         Ok(n) => n,
//!         Err(code) => return code,
//!     };
//!     d.run(Some(2), serve(move || notify.ready(), sandbox::daemon::shutdown_signal()))
//! }
//! ```

use std::future::Future;
use std::io::Write as _;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::process::ExitCode;

/// The exit code with which a daemon says "do not restart me": its configuration cannot work
/// (`EX_CONFIG` of sysexits.h). init leaves such a daemon failed instead of restarting it.
pub const EX_CONFIG: u8 = 78;

/// A daemon that has set itself up (logging, hardening); see the module documentation.
pub struct Daemon {
    name: &'static str,
}

/// Why the process cannot harden itself.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// `prctl(PR_SET_DUMPABLE, 0)` failed.
    #[error("cannot make the process non-dumpable")]
    Dumpable(#[source] nix::Error),
}

/// Makes this process non-dumpable: no core dumps, and its `/proc/<pid>` files (memory,
/// environment, fds) belong to root, so no process of the same uid that is not its parent can
/// read its memory or attach to it (`ptrace`), even one that shares the uid by accident.
/// `execve` resets the flag, so a daemon calls this itself, first thing.
pub fn harden() -> Result<(), HardenError> {
    nix::sys::prctl::set_dumpable(false).map_err(HardenError::Dumpable)
}

/// Caps glibc's allocator at one arena per worker thread of the runtime, before the runtime
/// starts them. glibc gives each new thread an arena of its own (up to 8 per CPU: 10 for a
/// process of 9 threads on 2 CPUs, see the test), and every arena keeps its own free pages
/// resident: an idle daemon pays that in RSS on every node for nothing. One arena in all saved
/// 0.9 MiB over the seven daemons but made the worker threads wait for each other's
/// allocations: networkd took ~1.3x the CPU to converge 1000 addresses and routes
/// (BENCHMARKS.md, "networkd"); one per worker cost nothing measurable.
/// Without glibc (musl), nothing to do. glibc's own `MALLOC_ARENA_MAX` in the environment
/// wins (a daemon whose manifest entry sets it keeps glibc's behaviour for that setting).
fn cap_malloc_arenas(workers: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return;
        }
        let n = libc::c_int::try_from(workers.max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets an allocator parameter (under glibc's own lock); called
        // before the runtime's threads exist. A refusal (0) leaves the default, still correct.
        let _ = unsafe { libc::mallopt(libc::M_ARENA_MAX, n) };
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = workers;
}

/// How often a daemon looks at the memory its allocator holds free.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// Free memory held by the allocator beyond which it is given back to the kernel.
const TRIM_ABOVE: usize = 1 << 20;

/// Gives the memory glibc's allocator holds free back to the kernel (`malloc_trim`) when there
/// is more than [`TRIM_ABOVE`] of it: what a burst of requests allocated (10,000 watches of
/// made-up types left stated 12 MiB larger after every structure was freed) does not stay
/// resident, and a repeated burst does not add to it. Returns the bytes free before, or `None`
/// without glibc (nothing to do).
pub fn trim_free_memory() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 reads the allocator's statistics under its own locks and returns
        // them by value.
        let info = unsafe { libc::mallinfo2() };
        if info.fordblks > TRIM_ABOVE {
            // SAFETY: malloc_trim releases free pages of the allocator's arenas under its own
            // locks; it frees nothing that is in use.
            let _ = unsafe { libc::malloc_trim(0) };
        }
        Some(info.fordblks)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

impl Daemon {
    /// Sets up logging to stderr (init keeps it; `RUST_LOG` wins over `log_level`, an
    /// `EnvFilter` such as `info` or `networkd=debug`) and hardens the process. On a bad
    /// `log_level` it returns [`EX_CONFIG`]: a restart would not help.
    pub fn start(name: &'static str, log_level: &str) -> Result<Daemon, ExitCode> {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .or_else(|_| tracing_subscriber::EnvFilter::try_new(log_level));
        let filter = match filter {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{name}: invalid log level {log_level:?}: {e}");
                return Err(ExitCode::from(EX_CONFIG));
            }
        };
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Plain text: init keeps it in a ring buffer (and a TTY check would be an ioctl
            // the seccomp profiles do not allow).
            .with_ansi(false)
            .init();
        if let Err(e) = harden() {
            eprintln!("{name}: {e}: {}", e_source(&e));
            return Err(ExitCode::FAILURE);
        }
        Ok(Daemon { name })
    }

    /// Takes an fd that init passed (its number given on the command line), after checking
    /// that it is open and not stdio. A bad one is [`EX_CONFIG`].
    pub fn take_fd(&self, fd: Option<RawFd>) -> Result<Option<OwnedFd>, ExitCode> {
        take_fd(fd).map_err(|e| {
            eprintln!("{}: {e}", self.name);
            ExitCode::from(EX_CONFIG)
        })
    }

    /// The readiness notifier on the fd init passed (`--notify-fd`), if any.
    pub fn notifier(&self, fd: Option<RawFd>) -> Result<Notifier, ExitCode> {
        Ok(Notifier(self.take_fd(fd)?))
    }

    /// Runs `body` to its end on a multi-threaded runtime (`worker_threads`, or one per CPU)
    /// and turns its result into the exit code: an error is printed with its causes.
    pub fn run<E>(
        self,
        worker_threads: Option<usize>,
        body: impl Future<Output = Result<(), E>>,
    ) -> ExitCode
    where
        E: std::error::Error + 'static,
    {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = worker_threads {
            b.worker_threads(n);
        }
        // tokio's default: one worker per CPU.
        cap_malloc_arenas(worker_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }));
        let rt = match b.enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("{}: cannot start the runtime: {e}", self.name);
                return ExitCode::FAILURE;
            }
        };
        // Freed memory goes back to the kernel (see `trim_free_memory`).
        rt.spawn(async {
            let mut every = tokio::time::interval(TRIM_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if trim_free_memory().is_none() {
                    return;
                }
            }
        });
        match rt.block_on(body) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let mut msg = e.to_string();
                let mut cur = e.source();
                while let Some(s) = cur {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    cur = s.source();
                }
                eprintln!("{}: {msg}", self.name);
                ExitCode::FAILURE
            }
        }
    }
}

fn e_source(e: &dyn std::error::Error) -> String {
    e.source().map(ToString::to_string).unwrap_or_default()
}

/// Takes ownership of an fd number given on the command line, after checking it is open and
/// not stdio.
pub fn take_fd(fd: Option<RawFd>) -> Result<Option<OwnedFd>, String> {
    let Some(fd) = fd else { return Ok(None) };
    if fd < 3 {
        return Err(format!("fd {fd} is stdio, not a passed fd"));
    }
    // SAFETY: borrowed only for the F_GETFD query below; a closed fd fails it with EBADF.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    if nix::fcntl::fcntl(borrowed, nix::fcntl::FcntlArg::F_GETFD).is_err() {
        return Err(format!("fd {fd} is not open"));
    }
    // SAFETY: the fd is open (checked above), was passed by the parent for this process alone,
    // and is owned from here on: the daemon's code uses that number through this value only.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Says "ready" once, on the pipe init passed (s6's notification-fd protocol).
pub struct Notifier(Option<OwnedFd>);

impl Notifier {
    /// Writes `READY=1` and closes the pipe. A reader that went away is init's business: the
    /// daemon runs regardless.
    pub fn ready(self) {
        if let Some(fd) = self.0 {
            let _ = std::fs::File::from(fd).write_all(b"READY=1\n");
        }
    }
}

/// Completes on SIGTERM or SIGINT (init stops a daemon with SIGTERM).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        // Without signal handlers, Ctrl-C is all that can be waited for.
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fds_are_checked_before_they_are_taken() {
        assert!(take_fd(None).unwrap().is_none());
        assert!(take_fd(Some(1)).unwrap_err().contains("stdio"));
        assert!(take_fd(Some(987_654)).unwrap_err().contains("not open"));
    }

    /// The arenas glibc's allocator has now (`<heap nr=...>` in `malloc_info`).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn malloc_arenas() -> usize {
        let mut buf: *mut libc::c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        // SAFETY: open_memstream allocates the buffer it returns in `buf` (freed below, after
        // fclose, as its manual says); malloc_info writes into that stream.
        let xml = unsafe {
            let f = libc::open_memstream(&mut buf, &mut len);
            assert!(!f.is_null(), "open_memstream failed");
            assert_eq!(libc::malloc_info(0, f), 0, "malloc_info failed");
            libc::fclose(f);
            let xml = std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec();
            libc::free(buf.cast());
            xml
        };
        String::from_utf8_lossy(&xml).matches("<heap nr=").count()
    }

    /// Run in a process of its own by `arenas_are_capped_at_the_workers`: caps the arenas at 2
    /// (unless `ARENA_TEST_NO_CAP`), starts 8 threads that each allocate, and prints how many
    /// arenas glibc made.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    #[ignore = "run by arenas_are_capped_at_the_workers in a process of its own"]
    fn arena_child() {
        if std::env::var_os("ARENA_TEST_NO_CAP").is_none() {
            cap_malloc_arenas(2);
        }
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    // Above glibc's per-thread cache, so that the arena itself is used.
                    let v: Vec<Vec<u8>> = (0..64).map(|i| vec![1u8; 4096 + i * 512]).collect();
                    barrier.wait();
                    v.len()
                })
            })
            .collect();
        for t in threads {
            t.join().expect("allocating thread");
        }
        println!("ARENAS {}", malloc_arenas());
    }

    /// What a daemon's process gets: at most one arena per worker thread, whatever its threads
    /// allocate; `MALLOC_ARENA_MAX` in the environment wins; without the cap glibc makes more
    /// (so the first check can fail).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn arenas_are_capped_at_the_workers() {
        let run = |env: &[(&str, &str)]| -> usize {
            let exe = std::env::current_exe().expect("test binary");
            let mut cmd = std::process::Command::new(exe);
            cmd.args([
                "--exact",
                "daemon::tests::arena_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env_remove("MALLOC_ARENA_MAX")
            .env_remove("ARENA_TEST_NO_CAP");
            for (k, v) in env {
                cmd.env(k, v);
            }
            let out = cmd.output().expect("run the child test");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child failed: {stdout}");
            stdout
                .lines()
                .find_map(|l| l.split_once("ARENAS ")) // after libtest's "test ... "
                .and_then(|(_, n)| n.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no arena count in: {stdout}"))
        };
        let capped = run(&[]);
        assert_eq!(
            capped, 2,
            "one arena per worker thread: not fewer, not more"
        );
        let uncapped = run(&[("ARENA_TEST_NO_CAP", "1")]);
        assert!(uncapped > 2, "without the cap glibc made only {uncapped}");
        let from_env = run(&[("MALLOC_ARENA_MAX", "4")]);
        assert!(
            from_env > 2 && from_env <= 4,
            "MALLOC_ARENA_MAX=4 gave {from_env}"
        );
    }
}
