//! A VM node: Debian's stock kernel under qemu (TCG: on these machines a guest hangs with KVM)
//! with the image's initramfs (`rootfs/kernel.sh && rootfs/build.sh`, which `scripts/test.sh`
//! runs). init is the real PID 1: it mounts the early filesystems and loads the image's boot
//! modules with their dependencies (`KernelModuleSpec`s); networkd leases an address from a
//! real dnsmasq over the virtio NIC; the node, unconfigured, serves the maintenance API, which
//! `talosctl get --insecure` reads from the DHCP server's namespace.
//!
//! Everything lives in a network namespace of the test (a bridge, a tap for the VM, dnsmasq);
//! qemu, dnsmasq and the namespace go away when the test ends, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../networkd/tests/kernel_support/ns.rs"]
mod ns;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ns::{wait_for, Netns, Proc};

const MAC: &str = "52:54:00:89:00:01";

/// The VM image of this workspace: the kernel and the initramfs `rootfs/build.sh` made.
fn vm_image() -> Option<(PathBuf, PathBuf)> {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/rootfs");
    let kernel = out.join("vmlinuz");
    let initramfs = out.join("initramfs.cpio.gz");
    (kernel.is_file() && initramfs.is_file()).then_some((kernel, initramfs))
}

/// `talosctl ARGS` run in `ns`; its stdout, or a panic with its output.
fn talosctl_in(ns: &Netns, args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(node_tests::talosctl_bin())
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Prints the VM's console when the test fails.
struct Console(PathBuf);

impl Drop for Console {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            eprintln!("---- VM console ----\n{log}\n---- end of console ----");
        }
    }
}

#[test]
fn a_vm_node_boots_loads_its_modules_and_leases_its_address() {
    if !testkit::require_root("it makes a network namespace, a tap and runs qemu") {
        return;
    }
    if !testkit::require_program("qemu-system-x86_64", "apt-get install qemu-system-x86") {
        return;
    }
    let Some((kernel, initramfs)) = vm_image() else {
        testkit::skip(
            "no VM image in target/rootfs (run rootfs/kernel.sh && rootfs/build.sh, as \
             scripts/test.sh does)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ns = Netns::new("vm");
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&["link", "add", "br0", "type", "bridge"]);
    ns.ip(&["addr", "add", "10.89.0.1/24", "dev", "br0"]);
    ns.ip(&["link", "set", "br0", "up"]);
    ns.ip(&["tuntap", "add", "tap0", "mode", "tap"]);
    ns.ip(&["link", "set", "tap0", "master", "br0"]);
    ns.ip(&["link", "set", "tap0", "up"]);

    let leases = dir.path().join("leases");
    let dnsmasq_log = dir.path().join("dnsmasq.log");
    let _dnsmasq = Proc::new(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, "dnsmasq", "--no-daemon"])
            .args([
                "--interface=br0",
                "--bind-interfaces",
                "--dhcp-range=10.89.0.10,10.89.0.20,1h",
                "--no-resolv",
                "--no-hosts",
                "--port=0",
                "--no-ping",
            ])
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&dnsmasq_log).unwrap())
            .spawn()
            .expect("dnsmasq"),
        dnsmasq_log,
    );

    let console = dir.path().join("console.log");
    let _print = Console(console.clone());
    let qemu_log = dir.path().join("qemu.log");
    let mut qemu = Proc::new(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, "qemu-system-x86_64"])
            .args([
                "-machine", "q35", "-accel", "tcg", "-m", "1024", "-smp", "2",
            ])
            .arg("-kernel")
            .arg(&kernel)
            .arg("-initrd")
            .arg(&initramfs)
            .args(["-append", "console=ttyS0 panic=-1"])
            .args(["-display", "none", "-monitor", "none", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .args([
                "-netdev",
                "tap,id=n0,ifname=tap0,script=no,downscript=no",
                "-device",
                &format!("virtio-net-pci,netdev=n0,mac={MAC}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&qemu_log).unwrap())
            .spawn()
            .expect("qemu"),
        qemu_log,
    );

    // networkd leased an address over the virtio NIC: the kernel's virtio modules are loaded.
    let ip = wait_for("the VM's DHCP lease", Duration::from_secs(180), || {
        assert!(qemu.running(), "qemu exited: {}", qemu.log());
        std::fs::read_to_string(&leases)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains(MAC))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
    });

    // The maintenance API answers (no configuration yet): a VM, in maintenance.
    let status = wait_for("the maintenance API", Duration::from_secs(120), || {
        talosctl_in(
            &ns,
            &[
                "get",
                "machinestatus",
                "--insecure",
                "-n",
                &ip,
                "-o",
                "yaml",
            ],
        )
        .ok()
    });
    assert!(status.contains("stage: maintenance"), "{status}");
    assert!(status.contains("mode: vm"), "{status}");

    // The boot modules and their dependencies are loaded (the loaded list is read again
    // shortly after they load).
    let modules = wait_for("the loaded modules", Duration::from_secs(60), || {
        let out = talosctl_in(&ns, &["get", "modules", "--insecure", "-n", &ip]).ok()?;
        [
            "virtio_net",
            "virtio_pci",
            "failover",
            "xfs",
            "libcrc32c",
            "8021q",
            "bonding",
        ]
        .iter()
        .all(|m| out.lines().any(|l| l.split_whitespace().any(|w| w == *m)))
        .then_some(out)
    });
    assert!(modules.contains("Live"), "{modules}");
    let specs = talosctl_in(&ns, &["get", "kernelmodulespecs", "--insecure", "-n", &ip]).unwrap();
    assert!(specs.contains("virtio_net"), "{specs}");

    // eth0 is the virtio NIC, up with its lease; the modules made no links of their own.
    let links = talosctl_in(&ns, &["get", "links", "--insecure", "-n", &ip]).unwrap();
    let eth0 = links
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some("eth0"))
        .unwrap_or_else(|| panic!("no eth0: {links}"));
    assert!(eth0.contains(MAC) && eth0.contains(" up "), "{eth0}");
    assert!(
        !links.contains("bond0") && !links.contains("dummy0"),
        "bonding/dummy made links of their own: {links}"
    );
    let addresses = wait_for("the leased address", Duration::from_secs(30), || {
        let out = talosctl_in(&ns, &["get", "addresses", "--insecure", "-n", &ip]).ok()?;
        out.contains(&format!("eth0/{ip}/24")).then_some(out)
    });
    assert!(addresses.contains(&ip), "{addresses}");
    let log = std::fs::read_to_string(&console).unwrap_or_default();
    assert!(log.contains("kernel module loaded"), "console: {log}");
}
