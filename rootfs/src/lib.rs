//! The talos-rs node image (DESIGN.md §6): one directory tree, laid out as a node expects, and
//! the same tree packed as an initramfs (newc cpio, gzip) for VM mode.
//!
//! ```text
//! /init -> usr/bin/init          what the kernel runs from an initramfs
//! /bin, /sbin -> usr/bin         /lib -> usr/lib
//! /usr/bin/{init,stated,networkd,blockd,secretsd,trustd,apid,k8sd}
//! /usr/bin/mkfs.xfs              a tool of the build machine (blockd asks init to run it)
//! /usr/bin/blkid                 a tool of the build machine (blockd asks init to run it)
//! /usr/bin/etcd                  a tool of the build machine (k8sd asks init to run it)
//! /usr/lib/<multiarch>/...       the libraries of what is dynamically linked (mkfs.xfs, etcd)
//! /etc/talos/daemons.yaml        the daemon manifest init runs
//! /etc/talos/seccomp/*.json      the seccomp profiles (compiled into init; shipped for audit)
//! /etc/{os-release,passwd,group} one user per daemon of the manifest
//! /etc/{resolv.conf,hosts,hostname} -> /system/network/etc/*   (networkd renders them)
//! /etc/nsswitch.conf             `hosts: files dns` (glibc's resolver: trustd, k8sd)
//! /etc/kubernetes -> /system/kubernetes                          (k8sd writes the kubelet's files)
//! /dev /proc /sys /run /tmp      mount points (init mounts /proc, /run, /tmp)
//! /system /var                   the node's writable state
//! ```
//!
//! The build is reproducible: every entry is owned by 0:0, has a fixed mode and the mtime
//! `SOURCE_DATE_EPOCH`; the initramfs lists entries sorted by path with sequential inode
//! numbers, and its gzip header carries no name and no time. The same inputs give the same
//! bytes, in the tree and in the initramfs ([`build`] twice and compare: `tests/` does).
//!
//! Binaries are taken as built. A statically linked program (what `rootfs/build.sh` builds)
//! needs nothing else; for a dynamically linked one (a development build, and the tools taken
//! from the build machine: [`TOOLS`]) the libraries `ldd` names and the ELF interpreter are
//! copied into the tree, so the image runs all the same.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod cpio;
pub mod elf;

/// The programs of the image, installed in `/usr/bin`.
pub const PROGRAMS: &[&str] = &[
    "init", "stated", "networkd", "blockd", "secretsd", "trustd", "apid", "k8sd",
];

/// Seccomp profiles that are not shipped (test daemons only).
const TEST_PROFILES: &[&str] = &["testd"];

/// Where the image keeps its manifest and seccomp profiles.
pub const ETC_TALOS: &str = "etc/talos";

/// Errors of an image build.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The input.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An output cannot be written.
    #[error("cannot write {path}")]
    Write {
        /// The output.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An input is not what the image needs.
    #[error("{0}")]
    Invalid(String),
}

fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// One entry of the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory with its permission bits.
    Dir {
        /// Permission bits (e.g. `0o755`, `0o1777`).
        mode: u32,
    },
    /// A regular file.
    File {
        /// Permission bits.
        mode: u32,
        /// Its contents.
        data: Vec<u8>,
    },
    /// A symbolic link.
    Symlink {
        /// Where it points.
        target: String,
    },
}

/// The image: entries by path relative to the root (no leading `/`; the root itself is not
/// listed), in path order — a parent always comes before what it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// The entries.
    pub entries: BTreeMap<String, Kind>,
}

impl Image {
    fn parents(&mut self, path: &str) {
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            let parent = &path[..at + i];
            self.entries
                .entry(parent.to_string())
                .or_insert(Kind::Dir { mode: 0o755 });
            at += i + 1;
        }
    }

    /// Adds a directory (and its parents).
    pub fn dir(&mut self, path: &str, mode: u32) {
        self.parents(path);
        self.entries.insert(path.to_string(), Kind::Dir { mode });
    }

    /// Adds a file (and its parents).
    pub fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        self.parents(path);
        self.entries
            .insert(path.to_string(), Kind::File { mode, data });
    }

    /// Adds a symbolic link (and its parents).
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parents(path);
        self.entries.insert(
            path.to_string(),
            Kind::Symlink {
                target: target.to_string(),
            },
        );
    }

    /// The bytes of every file and link target (the tree's size).
    pub fn content_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|k| match k {
                Kind::File { data, .. } => data.len() as u64,
                Kind::Symlink { target } => target.len() as u64,
                Kind::Dir { .. } => 0,
            })
            .sum()
    }

    /// Writes the image as a directory tree at `dir` (which must not exist): owner 0:0, the
    /// modes of the entries, every mtime `epoch`. Needs root for the ownership when run by
    /// another user (then the files keep that user's ownership).
    pub fn write_tree(&self, dir: &Path, epoch: u64) -> Result<(), Error> {
        std::fs::create_dir(dir).map_err(write_error(dir))?;
        let root = nix::unistd::geteuid().is_root();
        for (path, kind) in &self.entries {
            let p = dir.join(path);
            match kind {
                Kind::Dir { .. } => std::fs::create_dir(&p).map_err(write_error(&p))?,
                Kind::File { data, .. } => std::fs::write(&p, data).map_err(write_error(&p))?,
                Kind::Symlink { target } => {
                    std::os::unix::fs::symlink(target, &p).map_err(write_error(&p))?
                }
            }
            if root {
                std::os::unix::fs::lchown(&p, Some(0), Some(0)).map_err(write_error(&p))?;
            }
            if let Kind::Dir { mode } | Kind::File { mode, .. } = kind {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))
                    .map_err(write_error(&p))?;
            }
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map_err(write_error(dir))?;
        if root {
            std::os::unix::fs::lchown(dir, Some(0), Some(0)).map_err(write_error(dir))?;
        }
        // Children first: creating an entry changes its directory's mtime.
        let time = nix::sys::time::TimeSpec::new(i64::try_from(epoch).unwrap_or(i64::MAX), 0);
        for path in self
            .entries
            .keys()
            .rev()
            .map(|p| dir.join(p))
            .chain([dir.to_path_buf()])
        {
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                &path,
                &time,
                &time,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .map_err(|e| Error::Write {
                path: path.clone(),
                source: e.into(),
            })?;
        }
        Ok(())
    }

    /// The image as a gzip-compressed newc cpio archive (an initramfs), reproducibly.
    pub fn initramfs(&self, epoch: u64) -> Result<Vec<u8>, Error> {
        let archive = cpio::newc(self, epoch);
        let mut gz = flate2::GzBuilder::new()
            .mtime(0)
            .operating_system(3) // Unix, whatever the build host
            .write(Vec::new(), flate2::Compression::default());
        gz.write_all(&archive)
            .and_then(|()| gz.finish())
            .map_err(|source| Error::Write {
                path: PathBuf::from("initramfs"),
                source,
            })
    }
}

/// What goes into an image.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The directory of the built programs (`target/<triple>/image`, `target/debug`).
    pub bin_dir: PathBuf,
    /// The programs to install in `/usr/bin` ([`PROGRAMS`]).
    pub programs: Vec<String>,
    /// The `rootfs/` directory of the workspace (`etc/daemons.yaml`, `profiles/<arch>/`).
    pub source: PathBuf,
    /// The time of every entry (`SOURCE_DATE_EPOCH`).
    pub epoch: u64,
    /// A kernel's files (`rootfs/kernel.sh`'s output: `vmlinuz` and `lib/modules/<release>`
    /// with `modules.dep`): the image then carries the modules of `etc/kernel-modules.conf`
    /// and what they need, and the kernel is copied beside the image for VMs.
    pub kernel: Option<PathBuf>,
    /// Programs of the build machine the image carries in `/usr/bin` with their libraries
    /// ([`TOOLS`]: mkfs.xfs, which blockd asks init to run to format a system volume; etcd,
    /// which k8sd asks init to run on control planes; etcdctl, whose `snapshot restore` k8sd
    /// asks for on `bootstrap --recover-from`).
    pub tools: Vec<PathBuf>,
}

/// The build machine's programs every image carries (Debian's xfsprogs, etcd-server and
/// etcd-client: `install-deps.sh`).
pub const TOOLS: &[&str] = &[
    "/usr/sbin/mkfs.xfs",
    "/usr/sbin/blkid",
    "/usr/bin/etcd",
    "/usr/bin/etcdctl",
];

impl Inputs {
    /// The image's programs from `bin_dir`, with this workspace's manifest and profiles.
    pub fn new(bin_dir: impl Into<PathBuf>, epoch: u64) -> Inputs {
        Inputs {
            bin_dir: bin_dir.into(),
            programs: PROGRAMS.iter().map(|p| p.to_string()).collect(),
            source: source_dir(),
            epoch,
            kernel: None,
            tools: TOOLS.iter().map(PathBuf::from).collect(),
        }
    }
}

/// The `rootfs/` directory of this workspace.
pub fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The image for `inputs`: every entry, in memory.
pub fn plan(inputs: &Inputs) -> Result<Image, Error> {
    let mut image = Image::default();
    for (dir, mode) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("system", 0o755),
        ("var", 0o755),
        ("var/lib", 0o755),
        ("var/log", 0o755),
        ("usr/bin", 0o755),
        ("usr/lib", 0o755),
        (ETC_TALOS, 0o755),
    ] {
        image.dir(dir, mode);
    }
    image.symlink("bin", "usr/bin");
    image.symlink("sbin", "usr/bin");
    image.symlink("lib", "usr/lib");
    image.symlink("init", "usr/bin/init");
    // networkd renders these under its own directory (see rootfs/etc/daemons.yaml).
    for f in ["resolv.conf", "hosts", "hostname"] {
        image.symlink(&format!("etc/{f}"), &format!("/system/network/etc/{f}"));
    }
    // glibc's resolver (trustd, k8sd: a control plane endpoint by name): /etc/hosts first,
    // then DNS. Without the file glibc asks DNS first, and with no name server it fails.
    image.file("etc/nsswitch.conf", 0o644, b"hosts: files dns\n".to_vec());
    image.symlink("etc/mtab", "/proc/self/mounts");
    image.symlink("etc/kubernetes", "/system/kubernetes");

    let manifest_path = inputs.source.join("etc/daemons.yaml");
    let manifest = std::fs::read_to_string(&manifest_path).map_err(read_error(&manifest_path))?;
    let users = manifest_users(&manifest)?;
    image.file(
        &format!("{ETC_TALOS}/daemons.yaml"),
        0o644,
        manifest.into_bytes(),
    );
    let mut passwd = String::from("root:x:0:0:root:/root:/usr/bin/init\n");
    let mut group = String::from("root:x:0:\n");
    for (name, uid, gid) in &users {
        passwd.push_str(&format!(
            "{name}:x:{uid}:{gid}:talos-rs {name}:/nonexistent:/nonexistent\n"
        ));
        group.push_str(&format!("{name}:x:{gid}:\n"));
    }
    image.file("etc/passwd", 0o644, passwd.into_bytes());
    image.file("etc/group", 0o644, group.into_bytes());
    image.file(
        "etc/os-release",
        0o644,
        format!(
            "NAME=\"talos-rs\"\nID=talos-rs\nVERSION_ID={v}\nPRETTY_NAME=\"talos-rs {v}\"\n\
             HOME_URL=\"https://www.talos.dev\"\n",
            v = env!("CARGO_PKG_VERSION")
        )
        .into_bytes(),
    );

    let profiles = inputs.source.join("profiles").join(std::env::consts::ARCH);
    let mut names: Vec<PathBuf> = std::fs::read_dir(&profiles)
        .map_err(read_error(&profiles))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    for p in names {
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if TEST_PROFILES.iter().any(|t| name == format!("{t}.json")) {
            continue;
        }
        let data = std::fs::read(&p).map_err(read_error(&p))?;
        image.file(&format!("{ETC_TALOS}/seccomp/{name}"), 0o644, data);
    }

    if let Some(kernel) = &inputs.kernel {
        kernel_modules(&mut image, kernel, &inputs.source)?;
    }

    let mut libraries: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut interpreter: Option<String> = None;
    let programs = inputs
        .programs
        .iter()
        .map(|p| (p.clone(), inputs.bin_dir.join(p)))
        .chain(inputs.tools.iter().map(|t| {
            let name = t
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, t.clone())
        }));
    for (program, path) in programs {
        if !path.exists() && inputs.tools.contains(&path) {
            return Err(Error::Invalid(format!(
                "{} is not on this machine (Debian's xfsprogs: scripts/install-deps.sh)",
                path.display()
            )));
        }
        let data = std::fs::read(&path).map_err(read_error(&path))?;
        let info = elf::inspect(&data).map_err(|e| {
            Error::Invalid(format!("{} is not an ELF executable: {e}", path.display()))
        })?;
        if let Some(interp) = info.interpreter {
            for lib in ldd(&path)? {
                let name = lib
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| Error::Invalid(format!("library {}", lib.display())))?
                    .to_string();
                libraries.insert(name, lib);
            }
            interpreter = Some(interp);
        }
        image.file(&format!("usr/bin/{program}"), 0o755, data);
    }
    if let Some(interp) = interpreter {
        // Libraries go to /usr/lib/<multiarch> (the interpreter's default search path, and
        // /usr/lib is where the manifest lets daemons map executable code from); the
        // interpreter's own path links there.
        let multiarch = libraries
            .values()
            .find_map(|p| p.parent()?.file_name()?.to_str().map(str::to_string))
            .unwrap_or_else(|| format!("{}-linux-gnu", std::env::consts::ARCH));
        let interp_name = Path::new(&interp)
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Invalid(format!("ELF interpreter {interp}")))?
            .to_string();
        libraries
            .entry(interp_name.clone())
            .or_insert_with(|| PathBuf::from(&interp));
        for (name, path) in &libraries {
            let data = std::fs::read(path).map_err(read_error(path))?;
            image.file(&format!("usr/lib/{multiarch}/{name}"), 0o755, data);
        }
        let rel = interp.trim_start_matches('/');
        if !image.entries.contains_key(rel) {
            image.symlink(rel, &format!("/usr/lib/{multiarch}/{interp_name}"));
        }
    }
    Ok(image)
}

/// The kernel release of a kernel directory: its one `lib/modules/<release>`.
pub fn kernel_release(kernel: &Path) -> Result<String, Error> {
    let dir = kernel.join("lib/modules");
    let mut releases: Vec<String> = std::fs::read_dir(&dir)
        .map_err(read_error(&dir))?
        .flatten()
        .filter(|e| e.path().join("modules.dep").is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    releases.sort();
    match releases.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::Invalid(format!(
            "{} holds no kernel release with a modules.dep (run rootfs/kernel.sh)",
            dir.display()
        ))),
        many => Err(Error::Invalid(format!(
            "{} holds several kernel releases ({}): one is expected",
            dir.display(),
            many.join(", ")
        ))),
    }
}

/// Adds the boot modules of `source/etc/kernel-modules.conf` and every module they need (from
/// the kernel's `modules.dep`) under `usr/lib/modules/<release>`, with a `modules.dep` of
/// just those, the kernel's `modules.builtin`, and the list as
/// `usr/lib/modules-load.d/talos-rs.conf`.
fn kernel_modules(image: &mut Image, kernel: &Path, source: &Path) -> Result<(), Error> {
    let release = kernel_release(kernel)?;
    let dir = kernel.join("lib/modules").join(&release);
    let list_path = source.join("etc/kernel-modules.conf");
    let list = std::fs::read_to_string(&list_path).map_err(read_error(&list_path))?;
    let wanted: Vec<String> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_whitespace().next())
        .map(|l| l.replace('-', "_"))
        .collect();
    let dep_path = dir.join("modules.dep");
    let deps_text = std::fs::read_to_string(&dep_path).map_err(read_error(&dep_path))?;
    let name_of = |p: &str| {
        Path::new(p)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .trim_end_matches(".ko")
            .replace('-', "_")
    };
    let lines: BTreeMap<String, (String, Vec<String>)> = deps_text
        .lines()
        .filter_map(|l| {
            let (m, rest) = l.split_once(':')?;
            let m = m.trim().to_string();
            Some((
                name_of(&m),
                (m, rest.split_whitespace().map(str::to_string).collect()),
            ))
        })
        .collect();
    let builtin_path = dir.join("modules.builtin");
    let builtin = std::fs::read_to_string(&builtin_path).unwrap_or_default();
    let builtin_names: std::collections::BTreeSet<String> =
        builtin.lines().map(|l| name_of(l.trim())).collect();
    // Every module file needed, by its path in modules.dep.
    let mut files: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for name in &wanted {
        if builtin_names.contains(name) {
            continue;
        }
        let (file, deps) = lines.get(name).ok_or_else(|| {
            Error::Invalid(format!(
                "{}: module {name} is not in {} (not a module of kernel {release})",
                list_path.display(),
                dep_path.display()
            ))
        })?;
        files.insert(file.clone());
        files.extend(deps.iter().cloned());
    }
    let base = format!("usr/lib/modules/{release}");
    let mut dep_out = String::new();
    for file in &files {
        let from = dir.join(file);
        if !file.ends_with(".ko") {
            return Err(Error::Invalid(format!(
                "{}: only uncompressed modules (.ko) are supported",
                from.display()
            )));
        }
        let data = std::fs::read(&from).map_err(read_error(&from))?;
        image.file(&format!("{base}/{file}"), 0o644, data);
        if let Some((_, deps)) = lines.get(&name_of(file)) {
            dep_out.push_str(&format!("{file}:"));
            for d in deps {
                dep_out.push(' ');
                dep_out.push_str(d);
            }
            dep_out.push('\n');
        }
    }
    image.file(&format!("{base}/modules.dep"), 0o644, dep_out.into_bytes());
    image.file(
        &format!("{base}/modules.builtin"),
        0o644,
        builtin.into_bytes(),
    );
    image.file(
        "usr/lib/modules-load.d/talos-rs.conf",
        0o644,
        list.into_bytes(),
    );
    Ok(())
}

/// The daemons of a manifest: (name, uid, gid).
fn manifest_users(manifest: &str) -> Result<Vec<(String, u64, u64)>, Error> {
    let paths = machinery::manifest::Paths {
        root: "/".into(),
        bin: "/usr/bin".into(),
    };
    let m = machinery::manifest::Manifest::parse(manifest, &paths)
        .map_err(|e| Error::Invalid(format!("the daemon manifest: {}", cosi::error::Chain(&e))))?;
    Ok(m.daemons
        .iter()
        .map(|d| (d.name.clone(), u64::from(d.uid), u64::from(d.gid)))
        .collect())
}

/// The shared libraries a dynamically linked program loads, as `ldd` resolves them on this
/// host (the interpreter excluded).
fn ldd(program: &Path) -> Result<Vec<PathBuf>, Error> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(read_error(Path::new("ldd")))?;
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "ldd {}: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)"
        if let Some((_, rest)) = line.split_once("=>") {
            if let Some(path) = rest
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                libs.push(PathBuf::from(path));
            }
        }
    }
    Ok(libs)
}

/// What [`build`] produced.
#[derive(Clone, Debug)]
pub struct Report {
    /// The directory tree.
    pub tree: PathBuf,
    /// The initramfs.
    pub initramfs: PathBuf,
    /// Entries in the tree (without the root).
    pub entries: usize,
    /// Bytes of file contents and link targets in the tree.
    pub tree_bytes: u64,
    /// Bytes of the compressed initramfs.
    pub initramfs_bytes: u64,
    /// Shared libraries copied in because a program is dynamically linked (empty for a static
    /// image).
    pub shared_libraries: Vec<String>,
}

/// Builds the image of `inputs` into `out`: `out/tree` and `out/initramfs.cpio.gz`, replacing
/// what was there only once the new image is complete.
pub fn build(inputs: &Inputs, out: &Path) -> Result<Report, Error> {
    let image = plan(inputs)?;
    std::fs::create_dir_all(out).map_err(write_error(out))?;
    let tree = out.join("tree");
    let initramfs = out.join("initramfs.cpio.gz");
    let pid = std::process::id();
    let tmp_tree = out.join(format!(".tree.{pid}"));
    let old_tree = out.join(format!(".tree.old.{pid}"));
    let tmp_initramfs = out.join(format!(".initramfs.{pid}"));
    let vmlinuz = out.join("vmlinuz");
    let tmp_vmlinuz = inputs
        .kernel
        .as_ref()
        .map(|_| out.join(format!(".vmlinuz.{pid}")));
    remove_tree(&tmp_tree)?;
    let result = (|| {
        image.write_tree(&tmp_tree, inputs.epoch)?;
        let archive = image.initramfs(inputs.epoch)?;
        std::fs::write(&tmp_initramfs, &archive).map_err(write_error(&tmp_initramfs))?;
        if let (Some(k), Some(tmp)) = (&inputs.kernel, &tmp_vmlinuz) {
            let from = k.join("vmlinuz");
            std::fs::copy(&from, tmp).map_err(read_error(&from))?;
        }
        std::fs::set_permissions(&tmp_initramfs, std::fs::Permissions::from_mode(0o644))
            .map_err(write_error(&tmp_initramfs))?;
        if tree.symlink_metadata().is_ok() {
            std::fs::rename(&tree, &old_tree).map_err(write_error(&tree))?;
        }
        std::fs::rename(&tmp_tree, &tree).map_err(write_error(&tree))?;
        std::fs::rename(&tmp_initramfs, &initramfs).map_err(write_error(&initramfs))?;
        remove_tree(&old_tree)?;
        // The kernel a VM boots this image with, beside it (none without one: an old kernel
        // must not stay beside a new image).
        match &tmp_vmlinuz {
            Some(tmp) => std::fs::rename(tmp, &vmlinuz).map_err(write_error(&vmlinuz))?,
            None => match std::fs::remove_file(&vmlinuz) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::Write {
                        path: vmlinuz.clone(),
                        source: e,
                    })
                }
                _ => {}
            },
        }
        Ok(archive.len() as u64)
    })();
    match result {
        Ok(initramfs_bytes) => Ok(Report {
            tree,
            initramfs,
            entries: image.entries.len(),
            tree_bytes: image.content_bytes(),
            initramfs_bytes,
            shared_libraries: image
                .entries
                .keys()
                .filter(|p| p.starts_with("usr/lib/") && !p.starts_with("usr/lib/modules"))
                .filter(|p| matches!(image.entries.get(*p), Some(Kind::File { .. })))
                .cloned()
                .collect(),
        }),
        Err(e) => {
            let _ = remove_tree(&tmp_tree);
            let _ = std::fs::remove_file(&tmp_initramfs);
            if let Some(tmp) = &tmp_vmlinuz {
                let _ = std::fs::remove_file(tmp);
            }
            Err(e)
        }
    }
}

fn remove_tree(path: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Write {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// `SOURCE_DATE_EPOCH` from the environment, or 0.
pub fn epoch_from_env() -> Result<u64, Error> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
            Error::Invalid(format!(
                "SOURCE_DATE_EPOCH={v:?} is not a number of seconds"
            ))
        }),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_come_first_and_are_directories() {
        let mut image = Image::default();
        image.file("a/b/c", 0o644, b"x".to_vec());
        image.symlink("a-link", "a");
        let keys: Vec<&String> = image.entries.keys().collect();
        assert_eq!(keys, ["a", "a-link", "a/b", "a/b/c"]);
        assert_eq!(image.entries["a/b"], Kind::Dir { mode: 0o755 });
    }

    #[test]
    fn manifest_users_are_read_from_the_shipped_manifest() {
        let text = std::fs::read_to_string(source_dir().join("etc/daemons.yaml")).unwrap();
        let users = manifest_users(&text).unwrap();
        assert!(users
            .iter()
            .any(|(n, u, _)| n == "stated" && *u == u64::from(machinery::manifest::node_uid(10))));
        assert!(users.iter().any(|(n, _, _)| n == "networkd"));
    }

    #[test]
    fn a_tree_written_twice_is_identical_and_so_is_its_initramfs() {
        let mut image = Image::default();
        image.dir("tmp", 0o1777);
        image.file("usr/bin/x", 0o755, b"#!x".to_vec());
        image.symlink("bin", "usr/bin");
        let dir = tempfile::tempdir().unwrap();
        image.write_tree(&dir.path().join("a"), 1234).unwrap();
        image.write_tree(&dir.path().join("b"), 1234).unwrap();
        for p in ["", "tmp", "usr/bin/x", "bin"] {
            let a = dir.path().join("a").join(p).symlink_metadata().unwrap();
            let b = dir.path().join("b").join(p).symlink_metadata().unwrap();
            use std::os::unix::fs::MetadataExt;
            assert_eq!((a.mode(), a.mtime()), (b.mode(), b.mtime()), "{p}");
            assert_eq!(a.mtime(), 1234, "{p}");
        }
        assert_eq!(
            image.initramfs(1234).unwrap(),
            image.initramfs(1234).unwrap()
        );
    }

    /// A kernel directory as rootfs/kernel.sh leaves it, with three modules: `a` needs `b`,
    /// `c` stands alone, `x` is built in.
    fn fake_kernel(dir: &Path) {
        let m = dir.join("lib/modules/9.9.9");
        std::fs::create_dir_all(m.join("kernel/sub")).unwrap();
        for f in ["a.ko", "sub/b-b.ko", "c.ko"] {
            std::fs::write(m.join("kernel").join(f), f.as_bytes()).unwrap();
        }
        std::fs::write(
            m.join("modules.dep"),
            "kernel/a.ko: kernel/sub/b-b.ko\nkernel/sub/b-b.ko:\nkernel/c.ko:\n",
        )
        .unwrap();
        std::fs::write(m.join("modules.builtin"), "kernel/x.ko\n").unwrap();
        std::fs::write(dir.join("vmlinuz"), b"kernel").unwrap();
    }

    #[test]
    fn the_boot_modules_and_what_they_need_go_into_the_image() {
        let kernel = tempfile::tempdir().unwrap();
        fake_kernel(kernel.path());
        let source = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(source.path().join("etc")).unwrap();
        std::fs::write(
            source.path().join("etc/kernel-modules.conf"),
            "# boot\na opt=1\nx\n",
        )
        .unwrap();
        let mut image = Image::default();
        kernel_modules(&mut image, kernel.path(), source.path()).unwrap();
        let base = "usr/lib/modules/9.9.9";
        for f in [
            "kernel/a.ko",
            "kernel/sub/b-b.ko",
            "modules.dep",
            "modules.builtin",
        ] {
            assert!(image.entries.contains_key(&format!("{base}/{f}")), "{f}");
        }
        assert!(!image.entries.contains_key(&format!("{base}/kernel/c.ko")));
        assert!(image
            .entries
            .contains_key("usr/lib/modules-load.d/talos-rs.conf"));
        let Some(Kind::File { data, .. }) = image.entries.get(&format!("{base}/modules.dep"))
        else {
            panic!("modules.dep is a file");
        };
        assert_eq!(
            String::from_utf8_lossy(data),
            "kernel/a.ko: kernel/sub/b-b.ko\nkernel/sub/b-b.ko:\n"
        );
        assert_eq!(kernel_release(kernel.path()).unwrap(), "9.9.9");

        // A module the kernel does not have is refused, naming the list.
        std::fs::write(source.path().join("etc/kernel-modules.conf"), "nope\n").unwrap();
        let e = kernel_modules(&mut Image::default(), kernel.path(), source.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nope") && e.contains("kernel-modules.conf"),
            "{e}"
        );
    }
}
