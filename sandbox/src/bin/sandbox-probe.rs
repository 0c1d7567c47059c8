//! sandbox-probe: tries one action from inside a sandbox and reports what the kernel said, for
//! the sandbox tests.
//!
//! Prints one line, `ok` (exit 0) or `errno N` (exit 1); a usage error exits 2. A system call
//! the seccomp filter kills never returns: the test sees SIGSYS.
//!
//! ```text
//! sandbox-probe write PATH        create/truncate PATH and write to it
//! sandbox-probe bind PORT         TCP bind on 127.0.0.1:PORT
//! sandbox-probe connect PORT      TCP connect to 127.0.0.1:PORT
//! sandbox-probe ptrace            ptrace(PTRACE_TRACEME): outside the probe's seccomp profile
//! sandbox-probe packet-socket     socket(AF_PACKET): outside the profile's allowed families
//! sandbox-probe sethostname       set the hostname to itself: needs CAP_SYS_ADMIN
//! sandbox-probe fds               list the open fds (0..1024)
//! sandbox-probe env               print the environment
//! sandbox-probe sleep SECS        start 2 more threads, write "ready\n" to fd 3 if open, sleep
//! sandbox-probe clone3            a raw clone3(2) (the sandbox fails it with ENOSYS)
//! sandbox-probe thread            start a thread and join it (glibc falls back to clone)
//! sandbox-probe clone-newuser     a raw clone(2) with CLONE_NEWUSER: outside the profile
//! ```

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args[..] {
        ["write", path] => std::fs::write(path, b"probe\n"),
        ["bind", port] => match port.parse::<u16>() {
            Ok(port) => TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map(drop),
            Err(_) => return usage(),
        },
        ["connect", port] => match port.parse::<u16>() {
            Ok(port) => TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map(drop),
            Err(_) => return usage(),
        },
        ["ptrace"] => {
            // SAFETY: PTRACE_TRACEME takes no pointers.
            cvt(unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) })
        }
        ["packet-socket"] => {
            // SAFETY: socket(2) takes integers; the fd, if any, is closed right away.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
            if fd >= 0 {
                // SAFETY: `fd` was just returned by socket(2) and is owned here.
                drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
            }
            cvt(fd.into())
        }
        ["sethostname"] => sethostname_to_itself(),
        ["fds"] => {
            let open: Vec<String> = (0..1024)
                // SAFETY: F_GETFD takes an integer and only reports the fd's flags.
                .filter(|fd| unsafe { libc::fcntl(*fd, libc::F_GETFD) } >= 0)
                .map(|fd| fd.to_string())
                .collect();
            println!("fds {}", open.join(" "));
            Ok(())
        }
        ["env"] => {
            for (k, v) in std::env::vars_os() {
                println!("{}={}", k.to_string_lossy(), v.to_string_lossy());
            }
            Ok(())
        }
        ["sleep", secs] => match secs.parse::<u64>() {
            Ok(secs) => sleep_with_threads(secs),
            Err(_) => return usage(),
        },
        ["clone3"] => {
            // SAFETY: clone3 with a null argument and size 0: the kernel (or the filter) refuses
            // it before creating anything.
            cvt(unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) })
        }
        ["thread"] => std::thread::spawn(|| ())
            .join()
            .map_err(|_| std::io::Error::other("the thread panicked")),
        ["clone-newuser"] => {
            // SAFETY: clone with SIGCHLD and CLONE_NEWUSER and no stack is fork-like; the child,
            // if one is created, exits at once.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                )
            };
            if rc == 0 {
                // SAFETY: the child leaves without running anything else.
                unsafe { libc::_exit(0) };
            }
            cvt(rc)
        }
        _ => return usage(),
    };
    match result {
        Ok(()) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("errno {}", e.raw_os_error().unwrap_or(-1));
            ExitCode::from(1)
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: sandbox-probe write PATH | bind PORT | connect PORT | ptrace | packet-socket | sethostname | fds | env | sleep SECS");
    ExitCode::from(2)
}

fn cvt(rc: libc::c_long) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// sethostname(2) with the current name: refused without CAP_SYS_ADMIN, and harmless if a
/// broken sandbox let it through.
fn sethostname_to_itself() -> std::io::Result<()> {
    let mut name = [0u8; 65];
    // SAFETY: gethostname writes at most `name.len()` bytes into the live buffer.
    cvt(unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) }.into())?;
    let len = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    // SAFETY: sethostname reads `len` bytes of the live buffer.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), len) }.into())
}

/// Starts two threads (so that every-thread checks have threads to check), signals readiness on
/// fd 3 when it is open, and sleeps.
fn sleep_with_threads(secs: u64) -> std::io::Result<()> {
    let duration = Duration::from_secs(secs);
    let threads: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || std::thread::sleep(duration)))
        .collect();
    // SAFETY: F_GETFD only reports whether fd 3 is open.
    if unsafe { libc::fcntl(3, libc::F_GETFD) } >= 0 {
        // SAFETY: fd 3 is open, was handed to us as the readiness fd, and nothing else owns it.
        let mut notify = unsafe { std::fs::File::from_raw_fd(3) };
        notify.write_all(b"ready\n")?;
    }
    std::thread::sleep(duration);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
