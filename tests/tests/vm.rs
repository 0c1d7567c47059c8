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

/// What a VM test needs (root, qemu, the image built): the kernel and the initramfs, or `None`
/// once said why not (a skip, which fails under `CI=true`).
fn vm_prerequisites() -> Option<(PathBuf, PathBuf)> {
    if !testkit::require_root("it makes network namespaces, taps and runs qemu")
        || !testkit::require_program("qemu-system-x86_64", "apt-get install qemu-system-x86")
        || !testkit::require_program("sfdisk", "apt-get install fdisk")
    {
        return None;
    }
    let image = vm_image();
    if image.is_none() {
        testkit::skip(
            "no VM image in target/rootfs (run rootfs/kernel.sh && rootfs/build.sh, as \
             scripts/test.sh does)",
        );
    }
    image
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

/// Whether sfdisk and mkfs.xfs are here (disk images are made with them).
fn have_disk_tools() -> bool {
    ["sfdisk", "mkfs.xfs"].iter().all(|p| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
    })
}

/// A VM node booted by hand: a network namespace with a bridge (`NET.1/24`), a tap, a real
/// dnsmasq leasing `NET.10-20`, and qemu with the image's kernel and initramfs and `disks`
/// (virtio, in order: vda, vdb…); its lease awaited. Everything goes when it is dropped.
struct Vm {
    ns: Netns,
    console: PathBuf,
    ip: String,
    _dir: tempfile::TempDir,
    _dnsmasq: Proc,
    qemu: Proc,
    _print: Console,
}

impl Vm {
    fn boot(name: &str, net: &str, kernel: &Path, initramfs: &Path, disks: &[&Path]) -> Vm {
        let dir = tempfile::tempdir().unwrap();
        let ns = Netns::new(name);
        ns.ip(&["link", "set", "lo", "up"]);
        ns.ip(&["link", "add", "br0", "type", "bridge"]);
        ns.ip(&["addr", "add", &format!("{net}.1/24"), "dev", "br0"]);
        ns.ip(&["link", "set", "br0", "up"]);
        ns.ip(&["tuntap", "add", "tap0", "mode", "tap"]);
        ns.ip(&["link", "set", "tap0", "master", "br0"]);
        ns.ip(&["link", "set", "tap0", "up"]);
        let leases = dir.path().join("leases");
        let dnsmasq_log = dir.path().join("dnsmasq.log");
        let dnsmasq = Proc::new(
            Command::new("ip")
                .args(["netns", "exec", &ns.name, "dnsmasq", "--no-daemon"])
                .args(["--interface=br0", "--bind-interfaces"])
                .arg(format!("--dhcp-range={net}.10,{net}.20,1h"))
                .args(["--no-resolv", "--no-hosts", "--port=0", "--no-ping"])
                .arg(format!("--dhcp-leasefile={}", leases.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&dnsmasq_log).unwrap())
                .spawn()
                .expect("dnsmasq"),
            dnsmasq_log,
        );
        let console = dir.path().join("console.log");
        let print = Console(console.clone());
        let qemu_log = dir.path().join("qemu.log");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name, "qemu-system-x86_64"])
            .args([
                "-machine", "q35", "-accel", "tcg", "-m", "1024", "-smp", "2",
            ])
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 panic=-1"]);
        for d in disks {
            cmd.arg("-drive")
                .arg(format!("file={},format=raw,if=virtio", d.display()));
        }
        let mut qemu = Proc::new(
            cmd.args(["-display", "none", "-monitor", "none", "-no-reboot"])
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
        // networkd leased an address over the virtio NIC: the kernel's virtio modules are
        // loaded.
        let ip = wait_for("the VM's DHCP lease", Duration::from_secs(180), || {
            assert!(qemu.running(), "qemu exited: {}", qemu.log());
            std::fs::read_to_string(&leases)
                .unwrap_or_default()
                .lines()
                .find(|l| l.contains(MAC))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        });
        Vm {
            ns,
            console,
            ip,
            _dir: dir,
            _dnsmasq: dnsmasq,
            qemu,
            _print: print,
        }
    }
}

#[test]
fn a_vm_node_boots_loads_its_modules_and_leases_its_address() {
    let Some((kernel, initramfs)) = vm_prerequisites() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A disk as an installer would leave it: a GPT with STATE (xfs) and EPHEMERAL (blank).
    let disk = dir.path().join("disk.raw");
    if !have_disk_tools() {
        testkit::skip("sfdisk or mkfs.xfs is not installed (scripts/install-deps.sh)");
        return;
    }
    make_disk(&disk);
    let vm = Vm::boot("vm", "10.89.0", &kernel, &initramfs, &[&disk]);
    let (ns, console, ip) = (&vm.ns, &vm.console, vm.ip.clone());

    // The maintenance API answers (no configuration yet): a VM, in maintenance.
    let status = wait_for("the maintenance API", Duration::from_secs(120), || {
        talosctl_in(
            ns,
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
        let out = talosctl_in(ns, &["get", "modules", "--insecure", "-n", &ip]).ok()?;
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
    let specs = talosctl_in(ns, &["get", "kernelmodulespecs", "--insecure", "-n", &ip]).unwrap();
    assert!(specs.contains("virtio_net"), "{specs}");

    // eth0 is the virtio NIC, up with its lease; the modules made no links of their own.
    let links = talosctl_in(ns, &["get", "links", "--insecure", "-n", &ip]).unwrap();
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
        let out = talosctl_in(ns, &["get", "addresses", "--insecure", "-n", &ip]).ok()?;
        out.contains(&format!("eth0/{ip}/24")).then_some(out)
    });
    assert!(addresses.contains(&ip), "{addresses}");
    // init logs each module it loads; the serial console may show the line after the kernel's
    // own messages (and after the lease): wait for it.
    wait_for(
        "init's \"kernel module loaded\"",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(console)
                .unwrap_or_default()
                .contains("kernel module loaded")
                .then_some(())
        },
    );

    // blockd: the virtio disk, and what is on it, probed in the VM (through the group init
    // gave the device nodes).
    let disks = wait_for("the disk", Duration::from_secs(60), || {
        let out = talosctl_in(ns, &["get", "disks", "--insecure", "-n", &ip]).ok()?;
        out.lines()
            .any(|l| l.split_whitespace().nth(3) == Some("vda"))
            .then_some(out)
    });
    assert!(
        disks.contains("1.1 GB") && disks.contains("virtio"),
        "{disks}"
    );
    // Upstream's `disks` (storage.Disks), in maintenance as upstream's `disks --insecure`.
    let old = talosctl_in(ns, &["disks", "--insecure", "-n", &ip]).unwrap();
    let vda = old
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/dev/vda"))
        .unwrap_or_else(|| panic!("{old}"));
    assert!(
        vda.contains("1.1 GB") && vda.contains("/sys/class/block"),
        "{vda}"
    );
    // `get KIND --insecure -o json` of the maintenance node, by ID, once it lists `n`.
    let listed = |kind: &str, n: usize| {
        let out = talosctl_in(ns, &["get", kind, "--insecure", "-n", &ip, "-o", "json"]).ok()?;
        let v = specs_by_id(out.as_bytes());
        (v.len() == n).then_some(v)
    };
    let volumes = wait_for("the discovered volumes", Duration::from_secs(60), || {
        listed("discoveredvolumes", 3)
    });
    assert_eq!(volumes["vda"]["name"], "gpt", "{volumes:?}");
    assert_eq!(volumes["vda1"]["name"], "xfs", "{volumes:?}");
    // STATE holds the node's keys: init mounted it at boot and made its device (and its
    // disk's) root's, so blockd locates it from what the kernel and init say, reading nothing
    // of it: no filesystem UUID or label.
    assert_eq!(
        volumes["vda1"]["label"].as_str().unwrap_or_default(),
        "",
        "{volumes:?}"
    );
    assert_eq!(
        volumes["vda1"]["uuid"].as_str().unwrap_or_default(),
        "",
        "{volumes:?}"
    );
    assert_eq!(volumes["vda1"]["partitionLabel"], "STATE", "{volumes:?}");
    assert!(
        volumes["vda1"]["devicePath"]
            .as_str()
            .is_some_and(|p| p.starts_with("/sys/devices/")),
        "the VM's kernel knows the partition: {volumes:?}"
    );
    assert_eq!(volumes["vda2"]["name"], "", "{volumes:?}");
    assert_eq!(
        volumes["vda2"]["partitionLabel"], "EPHEMERAL",
        "{volumes:?}"
    );
    // The system volumes: STATE found by its partition label and ready (xfs, as wanted);
    // EPHEMERAL found blank and left so: nothing is formatted before a configuration.
    let statuses = wait_for("the volume statuses", Duration::from_secs(60), || {
        listed("volumestatuses", 2)
    });
    assert_eq!(statuses["STATE"]["phase"], "ready", "{statuses:?}");
    assert_eq!(statuses["STATE"]["location"], "/dev/vda1", "{statuses:?}");
    assert_eq!(statuses["EPHEMERAL"]["phase"], "located", "{statuses:?}");
    assert!(
        statuses["EPHEMERAL"]["errorMessage"]
            .as_str()
            .is_some_and(|m| m.contains("once the machine is configured")),
        "{statuses:?}"
    );
    assert_eq!(
        statuses["EPHEMERAL"]["location"], "/dev/vda2",
        "{statuses:?}"
    );
}

/// A sparse image of `size` bytes with a partition table of `label` (`gpt`, `dos`) that
/// sfdisk writes from `script`.
fn partitioned_image(path: &Path, size: u64, label: &str, script: &str) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
    let mut sfdisk = Command::new("sfdisk")
        .args(["-q", "--label", label])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(sfdisk.wait().unwrap().success());
}

/// A 1 GiB disk image: a GPT (sfdisk) with STATE (400 MiB from 1 MiB, xfs made by mkfs.xfs)
/// and EPHEMERAL (the rest, blank).
fn make_disk(path: &Path) {
    partitioned_image(
        path,
        1024 * 1024 * 1024,
        "gpt",
        "start=2048, size=400MiB, name=STATE\nname=EPHEMERAL\n",
    );
    let fs = path.with_extension("state");
    std::fs::File::create(&fs)
        .unwrap()
        .set_len(400 * 1024 * 1024)
        .unwrap();
    assert!(Command::new("mkfs.xfs")
        .args(["-q", "-L", "STATE"])
        .arg(&fs)
        .status()
        .unwrap()
        .success());
    assert!(Command::new("dd")
        .arg(format!("if={}", fs.display()))
        .arg(format!("of={}", path.display()))
        .args(["bs=1M", "seek=1", "conv=sparse,notrunc", "status=none"])
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(&fs).unwrap();
}

/// The links a VM node's config asks for: a VLAN on the virtio NIC, a dummy with an address,
/// and an active-backup bond of two more dummies (the VM has one NIC) — what the host kernel
/// here cannot make (no 8021q, bonding or dummy).
const LINKS_PATCH: &str = r#"machine:
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        vlans:
          - vlanId: 10
            addresses: [198.51.100.2/24]
      - interface: dummy0
        dummy: true
        addresses: [192.0.2.1/24]
      - interface: dummy1
        dummy: true
      - interface: dummy2
        dummy: true
      - interface: bond0
        bond:
          mode: active-backup
          miimon: 100
          interfaces: [dummy1, dummy2]
        addresses: [203.0.113.1/24]
"#;

/// The volume statuses by ID, once STATE and EPHEMERAL are both `ready` (2 minutes at most).
fn system_volumes_ready(
    cluster: &node_tests::Cluster,
    what: &str,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    wait_for(what, Duration::from_secs(120), || {
        let out = cluster.talosctl(&["get", "volumestatuses", "-o", "json"]);
        let v = specs_by_id(&out.stdout);
        (v.len() == 2 && v.values().all(|s| s["phase"] == "ready")).then_some(v)
    })
}

/// etcd's status on the cluster's node once it is healthy (2 minutes at most).
fn etcd_healthy(cluster: &node_tests::Cluster, what: &str) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let out = cluster.talosctl(&["get", "etcdstatuses", "-o", "json"]);
        let status = specs_by_id(&out.stdout).remove("etcd");
        if let Some(s) = status.as_ref().filter(|s| s["healthy"] == true) {
            return s.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{what}: not within 120 s; status {status:?}\netcd's log:\n{}",
            node_tests::text(&cluster.talosctl(&["logs", "etcd"]))
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `sfdisk --json` of a disk image, from the host.
fn sfdisk_json(disk: &Path) -> serde_json::Value {
    let out = Command::new("sfdisk")
        .arg("--json")
        .arg(disk)
        .output()
        .unwrap();
    assert!(out.status.success(), "sfdisk --json: {out:?}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["partitiontable"].clone()
}

/// `talosctl get links -o json` of the cluster's node: each link's spec by name.
fn links(cluster: &node_tests::Cluster) -> std::collections::BTreeMap<String, serde_json::Value> {
    let out = cluster.talosctl(&["get", "links", "-o", "json"]);
    assert!(
        out.status.success(),
        "get links: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    specs_by_id(&out.stdout)
}

/// The specs of `talosctl get … -o json` (one document per resource), by resource ID.
fn specs_by_id(json: &[u8]) -> std::collections::BTreeMap<String, serde_json::Value> {
    serde_json::Deserializer::from_slice(json)
        .into_iter::<serde_json::Value>()
        .filter_map(Result::ok)
        .filter_map(|v| Some((v["metadata"]["id"].as_str()?.to_string(), v["spec"].clone())))
        .collect()
}

fn addresses(cluster: &node_tests::Cluster) -> String {
    node_tests::text(&cluster.talosctl(&["get", "addresses"]))
}

/// The links and addresses of [`LINKS_PATCH`] are all there, the bond with both members.
fn links_converged(cluster: &node_tests::Cluster) -> Option<()> {
    let l = links(cluster);
    let kind = |n: &str| {
        l.get(n)
            .and_then(|s| s["kind"].as_str().map(str::to_string))
    };
    let index = |n: &str| l.get(n).and_then(|s| s["index"].as_u64());
    let master = |n: &str| l.get(n).and_then(|s| s["masterIndex"].as_u64());
    let a = addresses(cluster);
    (kind("eth0.10").as_deref() == Some("vlan")
        && kind("dummy0").as_deref() == Some("dummy")
        && kind("bond0").as_deref() == Some("bond")
        && l["bond0"]["bondMaster"]["mode"] == "active-backup"
        && index("bond0").is_some()
        && master("dummy1") == index("bond0")
        && master("dummy2") == index("bond0")
        && a.contains("eth0.10/198.51.100.2/24")
        && a.contains("dummy0/192.0.2.1/24")
        && a.contains("bond0/203.0.113.1/24"))
    .then_some(())
}

#[test]
fn a_qemu_cluster_boots_converges_vlan_bond_and_dummy_reboots_and_leaves_nothing() {
    let Some((kernel, initramfs)) = vm_prerequisites() else {
        return;
    };
    let before = node_tests::HostSnapshot::take();
    let patch_dir = tempfile::tempdir().unwrap();
    let patch = patch_dir.path().join("links.yaml");
    std::fs::write(&patch, LINKS_PATCH).unwrap();
    let mut cluster = node_tests::Cluster::builder()
        .arg("--provisioner")
        .arg("qemu")
        .arg("--memory")
        .arg("1024")
        .arg("--disk")
        .arg("3072")
        .arg("--vmlinuz-path")
        .arg(&kernel.to_string_lossy())
        .arg("--initrd-path")
        .arg(&initramfs.to_string_lossy())
        .arg("--config-patch")
        .arg(&format!("@{}", patch.display()))
        .create();
    let info = cluster.show();
    let node = &info.nodes[0];
    let _print = Console(
        cluster
            .cluster_dir()
            .join("nodes")
            .join(&node.name)
            .join("console.log"),
    );
    let console_log = || {
        std::fs::read_to_string(
            cluster
                .cluster_dir()
                .join("nodes")
                .join(&node.name)
                .join("console.log"),
        )
        .unwrap_or_default()
    };
    assert_eq!(node.state, "ready", "{node:?}");
    // Ready means its system volumes are mounted too: on this first boot blockd formats them
    // after every daemon started, and init restarts the daemons that keep files under /var
    // once EPHEMERAL is there. `create` returns after that, not before (a CI run once found
    // k8sd restarting just after it).
    let out = cluster.talosctl(&["get", "mountstatuses", "-o", "json"]);
    let mounted = specs_by_id(&out.stdout);
    assert_eq!(
        mounted.keys().collect::<Vec<_>>(),
        ["EPHEMERAL", "STATE"],
        "{mounted:?}"
    );
    assert_eq!(cluster.show().nodes[0].state, "ready");
    assert_eq!(
        node.netns, info.netns,
        "a VM has no network namespace of its own"
    );
    let qemu = node.init_pid.expect("qemu runs");
    let cmdline = std::fs::read_to_string(format!("/proc/{qemu}/cmdline")).unwrap();
    assert!(cmdline.starts_with("qemu-system-x86_64"), "{cmdline:?}");

    // The disk: a sparse raw image of the asked size.
    let disk = cluster
        .cluster_dir()
        .join("nodes")
        .join(&node.name)
        .join("disk.raw");
    let meta = std::fs::metadata(&disk).unwrap();
    assert_eq!(meta.len(), 3072 * 1024 * 1024);
    use std::os::unix::fs::MetadataExt as _;
    assert!(
        meta.blocks() * 512 < 512 * 1024 * 1024,
        "the disk is sparse"
    );

    // Through apid (the node's published port): the VM's own kernel made the links.
    let version = node_tests::text(&cluster.talosctl(&["get", "machinestatus", "-o", "yaml"]));
    assert!(
        version.contains("mode: vm") && version.contains("stage: running"),
        "{version}"
    );
    wait_for(
        "VLAN, dummy and bond links",
        Duration::from_secs(60),
        || links_converged(&cluster),
    );

    // blockd: the VM's blank virtio disk, partitioned and formatted once the node is
    // configured (STATE, EPHEMERAL), and init mounts them.
    let disks = wait_for("the VM's disk", Duration::from_secs(60), || {
        let out = node_tests::text(&cluster.talosctl(&["get", "disks"]));
        out.lines()
            .any(|l| l.split_whitespace().nth(3) == Some("vda"))
            .then_some(out)
    });
    assert!(disks.contains("3.2 GB"), "{disks}");
    let old = node_tests::text(&cluster.talosctl(&["disks"]));
    assert!(
        old.lines()
            .any(|l| l.contains("/dev/vda") && l.contains("3.2 GB")),
        "{old}"
    );
    let volumes = system_volumes_ready(&cluster, "STATE and EPHEMERAL ready");
    assert_eq!(volumes["STATE"]["location"], "/dev/vda1", "{volumes:?}");
    assert_eq!(volumes["EPHEMERAL"]["location"], "/dev/vda2", "{volumes:?}");
    // Mounted, their devices are init's: blockd reads nothing of them (no filesystem UUID).
    for v in ["STATE", "EPHEMERAL"] {
        assert_eq!(
            volumes[v]["uuid"].as_str().unwrap_or_default(),
            "",
            "{volumes:?}"
        );
    }
    // Checked from the host, on the image itself: a GPT with both, xfs on each.
    let table = sfdisk_json(&disk);
    let names: Vec<&str> = table["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["STATE", "EPHEMERAL"], "{table}");
    // The filesystems' UUIDs, as blkid reads them from the image on the host: what tells a
    // filesystem kept from one made again.
    let host_uuids = || -> Vec<String> {
        table["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let offset = p["start"].as_u64().unwrap() * 512;
                let blkid = Command::new("blkid")
                    .args(["-p", "-o", "export", "-O", &offset.to_string()])
                    .arg(&disk)
                    .output()
                    .unwrap();
                let out = String::from_utf8_lossy(&blkid.stdout).into_owned();
                assert!(out.contains("TYPE=xfs"), "{out}");
                assert!(out.contains(&format!("LABEL={}", names[i])), "{out}");
                out.lines()
                    .find_map(|l| l.strip_prefix("UUID="))
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    let uuids = host_uuids();
    assert!(uuids.iter().all(|u| u.len() == 36), "{uuids:?}");
    let mounted = wait_for("the mount statuses", Duration::from_secs(60), || {
        let out = cluster.talosctl(&["get", "mountstatuses", "-o", "json"]);
        let v = specs_by_id(&out.stdout);
        (v.len() == 2).then_some(v)
    });
    assert_eq!(mounted["STATE"]["target"], "/system/state", "{mounted:?}");
    assert_eq!(mounted["STATE"]["source"], "/dev/vda1", "{mounted:?}");
    assert_eq!(mounted["EPHEMERAL"]["target"], "/var", "{mounted:?}");
    assert_eq!(mounted["EPHEMERAL"]["filesystem"], "xfs", "{mounted:?}");
    let mount_table = || {
        let out = node_tests::text(&cluster.talosctl(&["mounts"]));
        let mut l: Vec<String> = out
            .lines()
            .filter(|l| l.contains("/dev/vd"))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                format!("{} {}", w[1], w[w.len() - 1])
            })
            .collect();
        l.sort();
        l
    };
    let before_restart = mount_table();
    assert_eq!(
        before_restart,
        ["/dev/vda1 /system/state", "/dev/vda2 /var"],
        "{before_restart:?}"
    );

    // blockd restarted in place re-adopts what it wrote: the disk's resource is not rewritten,
    // no mount changes, nothing is formatted again.
    let version = |out: &std::process::Output| -> Option<u64> {
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()?
            .get("metadata")?
            .get("version")?
            .as_u64()
    };
    let disk_version =
        version(&cluster.talosctl(&["get", "disks", "vda", "-o", "json"])).expect("vda's version");
    let out = cluster.talosctl(&["service", "blockd", "restart"]);
    assert!(out.status.success(), "{}", node_tests::text(&out));
    wait_for("blockd running again", Duration::from_secs(60), || {
        let out = node_tests::text(&cluster.talosctl(&["service", "blockd"]));
        out.contains("Running").then_some(())
    });
    // Past a resync of sysfs (5 s): still the same version.
    std::thread::sleep(Duration::from_secs(7));
    let now = version(&cluster.talosctl(&["get", "disks", "vda", "-o", "json"]));
    assert_eq!(
        now,
        Some(disk_version),
        "blockd rewrote vda after its restart"
    );
    assert_eq!(
        mount_table(),
        before_restart,
        "a mount changed with blockd's restart"
    );
    let again = specs_by_id(
        &cluster
            .talosctl(&["get", "volumestatuses", "-o", "json"])
            .stdout,
    );
    for v in ["STATE", "EPHEMERAL"] {
        assert_eq!(again[v]["phase"], "ready", "{again:?}");
    }
    assert_eq!(host_uuids(), uuids, "reformatted after blockd's restart");

    // The VM's mounts, measured by its init, through apid.
    let mounts = node_tests::text(&cluster.talosctl(&["mounts"]));
    let header = mounts.lines().next().unwrap_or_default();
    assert!(
        header.contains("FILESYSTEM") && header.contains("MOUNTED ON"),
        "{mounts}"
    );
    for (fs, at) in [
        ("cgroup2", "/sys/fs/cgroup"),
        ("tmpfs", "/run"),
        ("proc", "/proc"),
    ] {
        assert!(
            mounts.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.get(1) == Some(&fs) && w.last() == Some(&at)
            }),
            "{fs} on {at}: {mounts}"
        );
    }

    // The VM's own kernel log, through apid: the handoff to our init, the virtio disk.
    let dmesg = node_tests::text(&cluster.talosctl(&["dmesg"]));
    assert!(
        dmesg.contains("Run /init as init process") && dmesg.contains("virtio_blk"),
        "{dmesg}"
    );

    // The configuration server answers the node only: from the bridge's own address (another
    // party on the cluster network) the connection is dropped, token or not.
    let console = console_log();
    let url = console
        .split_whitespace()
        .find_map(|w| w.strip_prefix("talos.config="))
        .expect("talos.config= on the kernel command line")
        .trim()
        .to_string();
    assert!(
        url.starts_with(&format!("http://{}:", info.gateway)),
        "{url}"
    );
    let stolen = Command::new("ip")
        .args(["netns", "exec", &info.netns, "curl", "-sS", "-m", "5", &url])
        .output()
        .unwrap();
    assert!(
        !stolen.status.success() && !String::from_utf8_lossy(&stolen.stdout).contains("machine"),
        "the configuration was served to another address: {}",
        String::from_utf8_lossy(&stolen.stdout)
    );

    // Removed from the config: removed from the kernel (and, below, still removed after a
    // reboot: the configuration is kept on STATE).
    let out = cluster.talosctl(&[
        "patch",
        "machineconfig",
        "-p",
        r#"[{"op":"remove","path":"/machine/network/interfaces/4"},
            {"op":"remove","path":"/machine/network/interfaces/3"},
            {"op":"remove","path":"/machine/network/interfaces/2"},
            {"op":"remove","path":"/machine/network/interfaces/1"},
            {"op":"remove","path":"/machine/network/interfaces/0/vlans"}]"#,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the links removed", Duration::from_secs(60), || {
        let l = links(&cluster);
        (l.contains_key("eth0") && l.len() == 2).then_some(())
    });

    // etcd: bootstrapped on the VM (its data on EPHEMERAL, /var), healthy.
    let out = cluster.talosctl(&["bootstrap"]);
    assert!(
        out.status.success(),
        "bootstrap: {}",
        node_tests::text(&out)
    );
    let etcd = etcd_healthy(&cluster, "etcd healthy after the bootstrap");
    assert_eq!(etcd["start"], "bootstrap", "{etcd}");

    // A reboot comes back as the same VM (same qemu), configured and converged again.
    let out = cluster.talosctl(&["reboot"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the reboot to start", Duration::from_secs(60), || {
        (console_log().matches("Linux version").count() >= 2).then_some(())
    });
    wait_for("the node ready again", Duration::from_secs(120), || {
        let n = cluster.show().nodes.into_iter().next()?;
        (n.state == "ready").then_some(n)
    });
    assert_eq!(
        cluster.show().nodes[0].init_pid,
        Some(qemu),
        "the same qemu"
    );
    // The configuration came back from STATE, patch included (the configuration server
    // still serves the first one, with the links): the links stay removed.
    wait_for(
        "the network after the reboot",
        Duration::from_secs(60),
        || {
            let l = links(&cluster);
            (l.contains_key("eth0") && l.len() == 2).then_some(())
        },
    );
    let config = node_tests::text(&cluster.talosctl(&["get", "machineconfig", "-o", "yaml"]));
    assert!(
        !config.contains("bond0") && !config.contains("dummy0"),
        "{config}"
    );
    // The second boot adopted the layout: same filesystems (UUIDs), mounted again.
    system_volumes_ready(&cluster, "STATE and EPHEMERAL ready again");
    assert_eq!(host_uuids(), uuids, "reformatted after the reboot");
    wait_for("the mounts again", Duration::from_secs(60), || {
        (mount_table() == before_restart).then_some(())
    });
    let console = console_log();
    assert!(
        console.contains("STATE mounted at /system/state")
            && console.contains("EPHEMERAL mounted at /var"),
        "{console}"
    );
    // etcd resumed from its data on EPHEMERAL: the same member, not a new cluster.
    let again = etcd_healthy(&cluster, "etcd healthy after the reboot");
    assert_eq!(again["start"], "resume", "{again}");
    assert_eq!(again["memberId"], etcd["memberId"], "{again}");

    // Destroy leaves nothing: no qemu, no namespace (with its tap and bridge), no file.
    let out = cluster.destroy();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!node_tests::alive(qemu), "qemu {qemu} is gone");
    let after = node_tests::HostSnapshot::take();
    assert_eq!(before.links, after.links, "the host's links are untouched");
    assert!(
        !after.netns.iter().any(|n| n.starts_with(&cluster.name)),
        "{:?}",
        after.netns
    );
    assert!(!cluster.cluster_dir().exists());
    let left = node_tests::processes_mentioning(&cluster.cluster_dir().to_string_lossy());
    assert!(left.is_empty(), "processes left: {left:?}");
}

/// A disk image of `size` bytes holding an MBR (one partition from 1 MiB) and data in it.
fn make_mbr_disk(path: &Path, size: u64) {
    partitioned_image(path, size, "dos", "start=2048, type=83\n");
    use std::io::{Seek as _, Write as _};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(std::io::SeekFrom::Start(5 * 1024 * 1024)).unwrap();
    f.write_all(&[0xA5; 64 * 1024]).unwrap();
}

/// The first 16 MiB and the last 2 MiB of a disk image (where a partitioner writes).
fn edges(path: &Path) -> Vec<u8> {
    use std::io::{Read as _, Seek as _};
    let mut f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let mut out = vec![0u8; 16 * 1024 * 1024];
    f.read_exact(&mut out).unwrap();
    let mut tail = vec![0u8; 2 * 1024 * 1024];
    f.seek(std::io::SeekFrom::Start(len - tail.len() as u64))
        .unwrap();
    f.read_exact(&mut tail).unwrap();
    out.extend(tail);
    out
}

#[test]
fn a_vm_writes_only_its_install_disk_and_never_one_that_holds_data() {
    let Some((kernel, initramfs)) = vm_prerequisites() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // vda: an MBR and data (what blockd's own probe does not read); vdb: blank.
    let data = dir.path().join("data.raw");
    let blank = dir.path().join("blank.raw");
    make_mbr_disk(&data, 3 * 1024 * 1024 * 1024);
    std::fs::File::create(&blank)
        .unwrap()
        .set_len(3 * 1024 * 1024 * 1024)
        .unwrap();
    let data_before = edges(&data);
    let mut vm = Vm::boot("vmi", "10.90.0", &kernel, &initramfs, &[&data, &blank]);
    let (ns, ip) = (&vm.ns, vm.ip.clone());
    assert!(vm.qemu.running(), "qemu exited: {}", vm.qemu.log());
    wait_for("the maintenance API", Duration::from_secs(120), || {
        talosctl_in(ns, &["get", "machinestatus", "--insecure", "-n", &ip]).ok()
    });

    // A configuration whose install disk is the one with data.
    let out = dir.path().join("config");
    let gen = Command::new(node_tests::talosctl_bin())
        .args(["gen", "config", "demo", &format!("https://{ip}:6443")])
        .args(["--install-disk", "/dev/vda"])
        .args([
            "--config-patch",
            r#"{"machine": {"network": {"interfaces": [{"interface": "eth0", "dhcp": true}]}}}"#,
        ])
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(gen.status.success(), "{gen:?}");
    let cp = out.join("controlplane.yaml").to_string_lossy().into_owned();
    let tc = out.join("talosconfig").to_string_lossy().into_owned();
    talosctl_in(ns, &["apply-config", "--insecure", "-n", &ip, "-f", &cp]).unwrap();
    let node = |args: &[&str]| {
        let mut all = vec![
            "--talosconfig",
            tc.as_str(),
            "-e",
            ip.as_str(),
            "-n",
            ip.as_str(),
        ];
        all.extend_from_slice(args);
        talosctl_in(ns, &all)
    };
    // blkid finds the MBR: the disk is passed over, said why, and the blank disk the
    // configuration does not name is not taken either.
    let said = wait_for("why vda is passed over", Duration::from_secs(180), || {
        let out = node(&["get", "volumestatuses", "-o", "json"]).ok()?;
        let st = specs_by_id(out.as_bytes());
        let m = st.get("STATE")?["errorMessage"].as_str()?.to_string();
        m.contains("a partition table (dos)").then_some(m)
    });
    assert!(
        said.contains("/dev/vda") && said.contains("machine.install.disk"),
        "{said}"
    );
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        edges(&data) == data_before,
        "the disk with data was written"
    );
    assert!(
        edges(&blank).iter().all(|&b| b == 0),
        "a disk the configuration does not name was written"
    );

    // The configuration names vdb: it is asked about, found blank, laid out and mounted.
    node(&[
        "patch",
        "machineconfig",
        "-p",
        r#"{"machine": {"install": {"disk": "/dev/vdb"}}}"#,
    ])
    .unwrap();
    wait_for(
        "STATE and EPHEMERAL on vdb",
        Duration::from_secs(240),
        || {
            let out = node(&["get", "mountstatuses", "-o", "json"]).ok()?;
            let m = specs_by_id(out.as_bytes());
            (m.get("STATE")?["source"] == "/dev/vdb1"
                && m.get("EPHEMERAL")?["source"] == "/dev/vdb2")
                .then_some(())
        },
    );
    let table = sfdisk_json(&blank);
    let names: Vec<&str> = table["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["STATE", "EPHEMERAL"]);
    assert!(
        edges(&data) == data_before,
        "the disk with data was written"
    );
    // upstream's `disks`: vdb is the system disk.
    let disks = node(&["disks"]).unwrap();
    let vdb = disks
        .lines()
        .find(|l| l.contains("/dev/vdb"))
        .unwrap_or_else(|| panic!("{disks}"));
    assert!(vdb.trim_end().ends_with('*'), "{disks}");
    assert!(
        !disks
            .lines()
            .find(|l| l.contains("/dev/vda"))
            .unwrap()
            .trim_end()
            .ends_with('*'),
        "{disks}"
    );
    // STATE is located without blockd reading it (its device is init's once mounted).
    let volumes = wait_for("vdb's volumes discovered", Duration::from_secs(60), || {
        let v = specs_by_id(
            node(&["get", "discoveredvolumes", "-o", "json"])
                .ok()?
                .as_bytes(),
        );
        // Discovery catches up with the formats and the mounts within its resync.
        (v.get("vdb1")?["name"] == "xfs" && v.get("vdb2")?["name"] == "xfs").then_some(v)
    });
    assert_eq!(volumes["vdb1"]["partitionLabel"], "STATE", "{volumes:?}");
    assert_eq!(volumes["vdb1"]["name"], "xfs", "{volumes:?}");
    assert_eq!(
        volumes["vdb1"]["uuid"].as_str().unwrap_or_default(),
        "",
        "{volumes:?}"
    );
}
