//! Child processes (killed on drop), their memory, free ports, tmpfs checks and machine facts.

use std::fs::File;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A child process that is stopped (SIGTERM, then SIGKILL) when dropped, also on error paths.
pub struct ChildGuard {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr going to `log`.
    pub fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let err = out.try_clone().context("dup log file")?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {name} ({:?})", cmd.get_program()))?;
        Ok(Self {
            name,
            child: Some(child),
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Fails, with the tail of its log, if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} was stopped", self.name);
        };
        if let Some(status) = child.try_wait().context("wait")? {
            bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// Stops the process: SIGTERM, up to 3 s to exit, then SIGKILL. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `n` lines of a file (for error messages).
pub fn tail(path: &Path, n: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr().context("local address")?.port())
}

/// Memory of a process from /proc/<pid>/status, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mem {
    /// Resident set size.
    pub rss: u64,
    /// Peak resident set size.
    pub hwm: u64,
    /// Anonymous resident memory (heap).
    pub anon: u64,
    /// Resident file-backed memory (binary, mapped files).
    pub file: u64,
    /// Resident shared memory (includes mapped tmpfs files).
    pub shmem: u64,
}

impl Mem {
    /// Reads the memory figures of `pid`.
    pub fn of(pid: u32) -> Result<Self> {
        let path = format!("/proc/{pid}/status");
        let s = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        let mut m = Mem::default();
        for line in s.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let kib = v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
            match k {
                "VmRSS" => m.rss = kib,
                "VmHWM" => m.hwm = kib,
                "RssAnon" => m.anon = kib,
                "RssFile" => m.file = kib,
                "RssShmem" => m.shmem = kib,
                _ => {}
            }
        }
        if m.rss == 0 {
            bail!("no VmRSS in {path}");
        }
        Ok(m)
    }

    /// As JSON (KiB).
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "rss_kib": self.rss, "hwm_kib": self.hwm, "anon_kib": self.anon,
            "file_kib": self.file, "shmem_kib": self.shmem,
        })
    }
}

/// Bytes allocated under `dir` (blocks, as tmpfs accounts memory), recursively.
pub fn dir_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        let Ok(md) = e.metadata() else { continue };
        if md.is_dir() {
            total += dir_usage(&e.path());
        } else {
            total += md.blocks() * 512;
        }
    }
    total
}

/// Fails unless `dir` is on a tmpfs.
pub fn require_tmpfs(dir: &Path) -> Result<()> {
    let st = nix::sys::statfs::statfs(dir).with_context(|| format!("statfs {}", dir.display()))?;
    if st.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        bail!(
            "{} is not a tmpfs; pass --tmpfs with a tmpfs directory (e.g. /dev/shm, or `mount -t tmpfs tmpfs DIR`)",
            dir.display()
        );
    }
    Ok(())
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// CPU model, number of CPUs and memory of this machine.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    serde_json::json!({ "cpu_model": model, "cpus": cpus, "mem_mib": mem_kib / 1024, "kernel": kernel })
}

/// The first line of `prog --version`.
pub fn version_of(prog: &Path) -> String {
    Command::new(prog)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default()
}
