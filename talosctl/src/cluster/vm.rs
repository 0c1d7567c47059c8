//! VM nodes (`cluster create --provisioner qemu`): Debian's stock kernel and the image's
//! initramfs under qemu, a tap in the cluster's bridge, a sparse raw disk, the serial console
//! in a file.
//!
//! Each VM has a supervisor on the host (the hidden `cluster node-vm`, detached) that:
//! - serves the node's machine configuration over HTTP on the bridge (`talos.config=` on the
//!   kernel command line, as upstream's qemu provisioner does), to the node's own address only
//!   and under a random path only the node's kernel command line carries, so that another
//!   node of the cluster cannot read it (a control plane's holds the cluster's CA keys);
//! - publishes the node's apid on the host's `127.0.0.1:<port>`, relayed to `<ip>:50000` from
//!   the cluster's network namespace ([`super::publish`]);
//! - runs qemu in the cluster's network namespace, killed with the supervisor
//!   (`setpriv --pdeathsig`). A reboot of the guest resets the same qemu process (no
//!   `-no-reboot`): the same VM, same disk, same address; a power-off ends qemu and the
//!   supervisor.
//!
//! TCG by default: on the machines this was built on `/dev/kvm` exists but a guest kernel
//! hangs with it; `--accel kvm` where it works.

use std::io::Read as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use nix::sched::CloneFlags;
use serde::{Deserialize, Serialize};

use super::net::NETNS_DIR;

/// The file of the node's directory holding its [`VmSpec`].
pub const SPEC_FILE: &str = "vm.json";
/// qemu's host PID, written by the supervisor.
pub const PID_FILE: &str = super::launch::INIT_PID_FILE;
/// Requests served at once by a node's configuration server.
const MAX_REQUESTS: usize = 8;
/// How long one configuration request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// qemu's accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Emulation: slow, works everywhere.
    Tcg,
    /// The host's KVM (`/dev/kvm`).
    Kvm,
}

impl Accel {
    fn as_str(self) -> &'static str {
        match self {
            Accel::Tcg => "tcg",
            Accel::Kvm => "kvm",
        }
    }
}

/// Everything a VM's supervisor needs, written by `create` into the node's directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmSpec {
    /// The node's name.
    pub name: String,
    /// The cluster's network namespace (bridge, tap, dnsmasq).
    pub netns: String,
    /// The tap, in the bridge.
    pub tap: String,
    /// The NIC's MAC address (dnsmasq's static lease).
    pub mac: String,
    /// The node's address.
    pub ip: Ipv4Addr,
    /// The bridge's address: where the configuration is served.
    pub gateway: Ipv4Addr,
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// The raw disk image.
    pub disk: PathBuf,
    /// Memory, MiB.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Accelerator.
    pub accel: Accel,
    /// The machine configuration to serve.
    pub config: PathBuf,
    /// The serial console's log.
    pub console: PathBuf,
    /// The host's 127.0.0.1 port apid is published on.
    pub api_port: u16,
}

/// Arguments of `cluster node-vm`.
#[derive(Debug, Clone, clap::Args)]
pub struct VmArgs {
    /// The node's [`VmSpec`] file.
    #[arg(long)]
    pub spec: PathBuf,
}

/// The command that starts a VM's supervisor (this same talosctl binary).
pub fn supervise_command(spec: &Path) -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("cannot find the talosctl binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["cluster", "node-vm", "--spec"]).arg(spec);
    Ok(cmd)
}

/// A random path component (128 bits, hex).
fn token() -> anyhow::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("cannot read /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The kernel command line of a node whose configuration is at `config_url`.
pub fn kernel_cmdline(config_url: &str) -> String {
    format!("console=ttyS0 panic=-1 talos.platform=metal talos.config={config_url}")
}

/// qemu's arguments for `spec` (run in the cluster's network namespace).
pub fn qemu_args(spec: &VmSpec, cmdline: &str) -> Vec<String> {
    let mut a: Vec<String> = [
        "-nodefaults",
        "-no-user-config",
        "-machine",
        "q35",
        "-accel",
        spec.accel.as_str(),
        "-m",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(spec.memory_mib.to_string());
    a.push("-smp".into());
    a.push(spec.cpus.to_string());
    a.push("-kernel".into());
    a.push(spec.kernel.display().to_string());
    a.push("-initrd".into());
    a.push(spec.initrd.display().to_string());
    a.push("-append".into());
    a.push(cmdline.to_string());
    a.push("-drive".into());
    a.push(format!(
        "file={},format=raw,if=virtio,cache=unsafe",
        spec.disk.display()
    ));
    a.push("-netdev".into());
    a.push(format!(
        "tap,id=net0,ifname={},script=no,downscript=no",
        spec.tap
    ));
    a.push("-device".into());
    a.push(format!("virtio-net-pci,netdev=net0,mac={}", spec.mac));
    a.push("-serial".into());
    a.push(format!("file:{}", spec.console.display()));
    a.extend(["-display", "none", "-monitor", "none"].map(String::from));
    a
}

/// `cluster node-vm`: serves the configuration, publishes apid, runs qemu; returns qemu's exit
/// code.
pub fn supervise(args: &VmArgs) -> anyhow::Result<i32> {
    // Out of talosctl's session and process group: a ^C of `cluster create` does not reach
    // the node.
    let _ = nix::unistd::setsid();
    let text = std::fs::read_to_string(&args.spec)
        .with_context(|| format!("cannot read {}", args.spec.display()))?;
    let spec: VmSpec = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a VM spec", args.spec.display()))?;
    let netns = Path::new(NETNS_DIR).join(&spec.netns);

    let listener = super::publish::bind(spec.api_port)?;
    let apid = SocketAddr::from((spec.ip, super::publish::API_PORT));
    let relay_ns = netns.clone();
    std::thread::Builder::new()
        .name("api-publish".into())
        .spawn(move || super::publish::relay(listener, relay_ns, apid))
        .context("cannot start the API relay")?;

    let token = token()?;
    let port = serve_config(&netns, &spec, &token)?;
    let url = format!("http://{}:{port}/{token}/config.yaml", spec.gateway);
    let cmdline = kernel_cmdline(&url);

    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", "nsenter"])
        .arg(format!("--net={}", netns.display()))
        .args(["--", "qemu-system-x86_64"])
        .args(qemu_args(&spec, &cmdline))
        .stdin(Stdio::null());
    let mut child = cmd
        .spawn()
        .context("cannot start qemu (apt-get install qemu-system-x86 util-linux)")?;
    let dir = args.spec.parent().unwrap_or(Path::new("."));
    std::fs::write(dir.join(PID_FILE), child.id().to_string())
        .context("cannot write qemu's pid file")?;
    eprintln!(
        "talosctl node-vm: {} runs (qemu pid {}, {}, config served on {}:{port})",
        spec.name,
        child.id(),
        spec.accel.as_str(),
        spec.gateway
    );
    let status = child.wait().context("cannot wait for qemu")?;
    eprintln!("talosctl node-vm: qemu of {} ended: {status}", spec.name);
    Ok(status.code().unwrap_or(128))
}

/// Starts the configuration server in the cluster's network namespace on the bridge's
/// address; returns its port (the kernel's pick).
fn serve_config(netns: &Path, spec: &VmSpec, token: &str) -> anyhow::Result<u16> {
    let (tx, rx) = std::sync::mpsc::channel::<anyhow::Result<u16>>();
    let netns = netns.to_path_buf();
    let gateway = spec.gateway;
    let node = IpAddr::V4(spec.ip);
    let file = spec.config.clone();
    let path = format!("/{token}/config.yaml");
    std::thread::Builder::new()
        .name("config-server".into())
        .spawn(move || {
            let bound = (|| {
                let ns = std::fs::File::open(&netns)
                    .with_context(|| format!("cannot open {}", netns.display()))?;
                nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| {
                    anyhow::anyhow!("cannot enter the cluster's network namespace: {e}")
                })?;
                let l = std::net::TcpListener::bind((gateway, 0))
                    .with_context(|| format!("cannot listen on {gateway}"))?;
                l.set_nonblocking(true)?;
                anyhow::Ok(l)
            })();
            let listener = match bound {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let port = listener.local_addr().map(|a| a.port());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let (Ok(port), Ok(rt)) = (port, rt) else {
                let _ = tx.send(Err(anyhow::anyhow!(
                    "cannot start the configuration server"
                )));
                return;
            };
            let _ = tx.send(Ok(port));
            rt.block_on(config_server(listener, node, path, file));
        })
        .context("cannot start the configuration server")?;
    rx.recv()
        .context("the configuration server ended at once")?
}

async fn config_server(listener: std::net::TcpListener, node: IpAddr, path: String, file: PathBuf) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        eprintln!("talosctl node-vm: the configuration server cannot listen");
        return;
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS));
    let path: Arc<str> = path.into();
    let file = Arc::new(file);
    loop {
        let Ok((conn, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Only the node itself (its static lease): another node of the cluster gets nothing.
        if peer.ip() != node {
            continue;
        }
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (path, file) = (path.clone(), file.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (path, file) = (path.clone(), file.clone());
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &path, &file)) }
            });
            let serve = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service);
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, serve).await;
            drop(permit);
        });
    }
}

type Body = http_body_util::Full<bytes::Bytes>;

fn answer<B>(req: &http::Request<B>, path: &str, file: &Path) -> http::Response<Body> {
    let reply = |status: http::StatusCode, body: Vec<u8>| {
        let mut r = http::Response::new(Body::new(body.into()));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != path {
        return reply(http::StatusCode::NOT_FOUND, b"not found\n".to_vec());
    }
    if req.method() != http::Method::GET {
        return reply(http::StatusCode::METHOD_NOT_ALLOWED, Vec::new());
    }
    match std::fs::read(file) {
        Ok(data) => reply(http::StatusCode::OK, data),
        Err(e) => {
            eprintln!("talosctl node-vm: cannot read {}: {e}", file.display());
            reply(http::StatusCode::INTERNAL_SERVER_ERROR, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tokened_path_is_served_and_only_with_get() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config.yaml");
        std::fs::write(&f, "version: v1alpha1\n").unwrap();
        let get = |uri: &str, m: http::Method| {
            let req = http::Request::builder()
                .method(m)
                .uri(uri)
                .body(())
                .unwrap();
            answer(&req, "/abc/config.yaml", &f).status()
        };
        assert_eq!(get("/abc/config.yaml", http::Method::GET), 200);
        assert_eq!(get("/config.yaml", http::Method::GET), 404);
        assert_eq!(get("/abd/config.yaml", http::Method::GET), 404);
        assert_eq!(get("/abc/config.yaml", http::Method::POST), 405);
    }

    #[test]
    fn qemu_gets_the_kernel_the_disk_the_tap_and_the_console() {
        let spec = VmSpec {
            name: "n".into(),
            netns: "c-net".into(),
            tap: "tap-c1".into(),
            mac: "02:74:72:73:00:01".into(),
            ip: Ipv4Addr::new(10, 5, 0, 2),
            gateway: Ipv4Addr::new(10, 5, 0, 1),
            kernel: "/k".into(),
            initrd: "/i".into(),
            disk: "/d.raw".into(),
            memory_mib: 1024,
            cpus: 2,
            accel: Accel::Tcg,
            config: "/c".into(),
            console: "/console.log".into(),
            api_port: 1,
        };
        let a = qemu_args(&spec, &kernel_cmdline("http://10.5.0.1:9/t/config.yaml")).join(" ");
        for want in [
            "-accel tcg",
            "-m 1024",
            "-smp 2",
            "-kernel /k",
            "-initrd /i",
            "talos.config=http://10.5.0.1:9/t/config.yaml",
            "file=/d.raw,format=raw,if=virtio",
            "ifname=tap-c1,script=no",
            "mac=02:74:72:73:00:01",
            "-serial file:/console.log",
        ] {
            assert!(a.contains(want), "{want} not in {a}");
        }
        assert!(!a.contains("-no-reboot"), "a reboot must reset the same VM");
    }
}
