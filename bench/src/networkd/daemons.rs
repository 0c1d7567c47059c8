//! stated and networkd as a node runs them: the release binaries as separate processes, stated
//! standalone on a socket in the run's directory, networkd inside the run's network namespace
//! (and a UTS namespace of its own, so the hostname it sets is not the host's).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use cosi::{Query, Resource, ResourceSpec};
use machinery::resources::config::{
    MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG_NS, REDACTED_NAMESPACE as REDACTED_NS,
};

use crate::ns::{Netns, Proc};

/// The binaries under test.
#[derive(Clone, Debug)]
pub struct Bins {
    /// stated (release).
    pub stated: PathBuf,
    /// networkd (release).
    pub networkd: PathBuf,
    /// networkd's `--log-level`.
    pub log_level: String,
}

/// A running stated and networkd; stopped on drop, networkd first.
pub struct Daemons {
    networkd: Option<Proc>,
    stated: Proc,
    /// A client of stated.
    pub client: cosi::Client,
}

impl Daemons {
    /// Starts stated in `dir`, writes `config` as the machine configuration, then starts
    /// networkd in `netns`.
    pub async fn start(bins: &Bins, netns: &Netns, dir: &Path, config: &str) -> Result<Self> {
        let socket = dir.join("state.sock");
        let log = dir.join("stated.log");
        let file = std::fs::File::create(&log).context("stated log")?;
        let child = Command::new(&bins.stated)
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--run-dir")
            .arg(dir.join("run"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", bins.stated.display()))?;
        let mut stated = Proc::new(child, log);
        let client = cosi::Client::new(&socket).context("stated client")?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if !stated.running() {
                bail!("stated exited: {}", stated.log());
            }
            if socket.exists()
                && client
                    .list(CONFIG_NS, MachineConfigSpec::TYPE, &Query::default())
                    .await
                    .is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("stated did not answer within 15 s: {}", stated.log());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut d = Self {
            networkd: None,
            stated,
            client,
        };
        d.apply_config(config).await?;

        let root = dir.join("root");
        std::fs::create_dir_all(root.join("etc")).context("etc root")?;
        let log = dir.join("networkd.log");
        let file = std::fs::File::create(&log).context("networkd log")?;
        // `ip netns exec` and `unshare` (without --fork) exec: the child's pid is networkd's.
        let child = Command::new("ip")
            .args(["netns", "exec", &netns.name, "unshare", "--uts"])
            .arg(&bins.networkd)
            .arg("--socket")
            .arg(&socket)
            .arg("--root")
            .arg(&root)
            .args(["--log-level", &bins.log_level])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", bins.networkd.display()))?;
        d.networkd = Some(Proc::new(child, log));
        Ok(d)
    }

    /// Writes the machine configuration (creates or replaces it) as init, the node's config
    /// writer, does: the full document in `config`, and its copy without secrets in
    /// `config-redacted`, which is the one networkd reads (written second: networkd's timer
    /// starts at the first write, and the copy is what wakes it).
    pub async fn apply_config(&self, yaml: &str) -> Result<()> {
        let redacted = machinery::config::Config::from_yaml(yaml)
            .map_err(|e| anyhow::anyhow!("the benchmark's machine config: {e}"))?
            .redacted()
            .to_yaml()
            .context("encode the redacted machine config")?;
        for (ns, text) in [(CONFIG_NS, yaml.to_string()), (REDACTED_NS, redacted)] {
            let r = Resource::new(ns, ACTIVE_ID, MachineConfigSpec(text));
            let mut raw = r.to_raw().context("encode the machine config")?;
            match self
                .client
                .get(ns, MachineConfigSpec::TYPE, ACTIVE_ID)
                .await
            {
                Ok(current) => {
                    raw.metadata.version = current.metadata.version;
                    raw.metadata.owner = current.metadata.owner.clone();
                    self.client
                        .update(&raw, &current.metadata.owner, None)
                        .await
                        .with_context(|| format!("update the machine config in {ns}"))?;
                }
                Err(e) if e.is_not_found() => {
                    self.client
                        .create(&raw, "")
                        .await
                        .with_context(|| format!("create the machine config in {ns}"))?;
                }
                Err(e) => return Err(e).with_context(|| format!("get the machine config in {ns}")),
            }
        }
        Ok(())
    }

    /// networkd's pid.
    pub fn networkd_pid(&self) -> u32 {
        self.networkd.as_ref().map_or(0, Proc::pid)
    }

    /// stated's pid.
    pub fn stated_pid(&self) -> u32 {
        self.stated.pid()
    }

    /// Fails with the end of networkd's log if it is not running.
    pub fn check(&mut self) -> Result<()> {
        if let Some(p) = self.networkd.as_mut() {
            if !p.running() {
                bail!("networkd exited:\n{}", tail(&p.log(), 30));
            }
        }
        if !self.stated.running() {
            bail!("stated exited:\n{}", tail(&self.stated.log(), 30));
        }
        Ok(())
    }

    /// The last `n` lines of networkd's log.
    pub fn networkd_log_tail(&self, n: usize) -> String {
        self.networkd
            .as_ref()
            .map(|p| tail(&p.log(), n))
            .unwrap_or_default()
    }

    /// networkd's whole log.
    pub fn networkd_log(&self) -> String {
        self.networkd.as_ref().map(Proc::log).unwrap_or_default()
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        if let Some(mut p) = self.networkd.take() {
            p.stop();
        }
        self.stated.stop();
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// CPU time (user + system, all threads) of process `pid` so far, from `/proc/PID/stat`
/// (clock ticks of 10 ms: `USER_HZ` is 100 on Linux).
pub fn cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Waits until none of `pids` used CPU for `quiet`, failing after `timeout`.
pub async fn wait_idle(pids: &[u32], quiet: Duration, timeout: Duration) -> Result<()> {
    let total = || -> Duration { pids.iter().filter_map(|p| cpu(*p)).sum() };
    let start = Instant::now();
    let mut last = (total(), Instant::now());
    while last.1.elapsed() < quiet {
        if start.elapsed() > timeout {
            bail!("the daemons never got idle within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = total();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    Ok(())
}
