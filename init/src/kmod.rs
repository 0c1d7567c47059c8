//! Kernel modules of a VM node: loading one with its dependencies, from the modules the image
//! carries for its kernel (`/lib/modules/<release>`, with the `modules.dep` that `depmod` wrote
//! at image build), and reading what the kernel has loaded (`/proc/modules`).
//!
//! Written here rather than through a crate: loading is one `finit_module(2)` per file (nix's
//! safe wrapper), and the two text formats are a line each; what a modprobe library adds
//! (aliases, blacklists, compressed modules) the image does not use.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::path::{Path, PathBuf};

use machinery::resources::runtime::LoadedKernelModuleSpec;

/// Errors of loading modules.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    /// A file of the module index could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The running kernel's release could not be read.
    #[error("cannot read the kernel's release")]
    Release(#[source] nix::Error),
    /// The image has no such module for this kernel.
    #[error("no module {0:?} in the image for this kernel (not in modules.dep, not built in)")]
    Unknown(String),
    /// A module's parameters cannot be passed to the kernel.
    #[error("the parameters of {0} contain a NUL byte")]
    BadParameters(String),
    /// The kernel refused a module.
    #[error("the kernel refused module {name} ({path})")]
    Load {
        /// The module.
        name: String,
        /// Its file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: nix::Error,
    },
}

/// The modules of one kernel release: `modules.dep` and `modules.builtin` under its directory.
#[derive(Debug, Default)]
pub struct ModuleIndex {
    root: PathBuf,
    /// Module name → its file and its dependencies' files (relative to `root`), as listed.
    deps: HashMap<String, (PathBuf, Vec<PathBuf>)>,
    builtin: HashSet<String>,
}

/// A module's name from its file: the file name without `.ko`, dashes as underscores (the
/// kernel's own spelling of module names).
pub fn module_name(path: &Path) -> String {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    normalize(file.strip_suffix(".ko").unwrap_or(file))
}

fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

impl ModuleIndex {
    /// The index of the running kernel's modules (`/lib/modules/<release>`).
    ///
    /// # Errors
    ///
    /// As [`ModuleIndex::open`]; the release cannot be read.
    pub fn for_running_kernel() -> Result<Self, KmodError> {
        let uname = nix::sys::utsname::uname().map_err(KmodError::Release)?;
        let release = uname.release().to_string_lossy().into_owned();
        Self::open(&Path::new("/lib/modules").join(release))
    }

    /// Reads `modules.dep` (required) and `modules.builtin` (optional) under `root`.
    ///
    /// # Errors
    ///
    /// `modules.dep` cannot be read.
    pub fn open(root: &Path) -> Result<Self, KmodError> {
        let read = |name: &str| {
            let path = root.join(name);
            std::fs::read_to_string(&path).map_err(|source| KmodError::Read { path, source })
        };
        let deps_text = read("modules.dep")?;
        let builtin_text = match read("modules.builtin") {
            Ok(t) => t,
            Err(KmodError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                String::new()
            }
            Err(e) => return Err(e),
        };
        Ok(Self::parse(root, &deps_text, &builtin_text))
    }

    /// The index of the two files' contents (`modules.dep`: `path: dep dep ...` per line;
    /// `modules.builtin`: a path per line). Malformed lines are skipped.
    pub fn parse(root: &Path, modules_dep: &str, modules_builtin: &str) -> Self {
        let mut deps = HashMap::new();
        for line in modules_dep.lines() {
            let Some((module, rest)) = line.split_once(':') else {
                continue;
            };
            let module = PathBuf::from(module.trim());
            let list = rest.split_whitespace().map(PathBuf::from).collect();
            deps.insert(module_name(&module), (module, list));
        }
        let builtin = modules_builtin
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| module_name(Path::new(l)))
            .collect();
        Self {
            root: root.to_path_buf(),
            deps,
            builtin,
        }
    }

    /// The files to load for `name`, in order: its dependencies (modules.dep lists them so that
    /// the last one is loaded first), then the module. Empty for a module built into the
    /// kernel.
    ///
    /// # Errors
    ///
    /// [`KmodError::Unknown`].
    pub fn plan(&self, name: &str) -> Result<Vec<PathBuf>, KmodError> {
        let name = normalize(name);
        if self.builtin.contains(&name) {
            return Ok(Vec::new());
        }
        let (file, deps) = self
            .deps
            .get(&name)
            .ok_or_else(|| KmodError::Unknown(name.clone()))?;
        let mut out: Vec<PathBuf> = deps.iter().rev().cloned().collect();
        out.push(file.clone());
        Ok(out)
    }

    /// Loads `name` (with `parameters`, `key=value` each) and the modules it needs; returns
    /// those it loaded now. A module already loaded is left as it is.
    ///
    /// # Errors
    ///
    /// [`KmodError::Unknown`]; a file that cannot be opened; the kernel refusing one.
    pub fn load(&self, name: &str, parameters: &[String]) -> Result<Vec<String>, KmodError> {
        let plan = self.plan(name)?;
        let target = normalize(name);
        let params = CString::new(parameters.join(" "))
            .map_err(|_| KmodError::BadParameters(target.clone()))?;
        let none = CString::default();
        let mut loaded = Vec::new();
        for rel in plan {
            let module = module_name(&rel);
            if is_loaded(&module) {
                continue;
            }
            let path = self.root.join(&rel);
            let file = std::fs::File::open(&path).map_err(|source| KmodError::Read {
                path: path.clone(),
                source,
            })?;
            let p = if module == target { &params } else { &none };
            match nix::kmod::finit_module(&file, p, nix::kmod::ModuleInitFlags::empty()) {
                Ok(()) => loaded.push(module),
                Err(nix::errno::Errno::EEXIST) => {}
                Err(source) => {
                    return Err(KmodError::Load {
                        name: module,
                        path,
                        source,
                    })
                }
            }
        }
        Ok(loaded)
    }
}

/// Whether the running kernel has `module` loaded (or built in with parameters).
fn is_loaded(module: &str) -> bool {
    Path::new("/sys/module")
        .join(module)
        .join("initstate")
        .exists()
}

/// The modules `/proc/modules` lists (`name size refcount deps state address` per line; `-`
/// for no dependency), by name.
pub fn parse_proc_modules(text: &str) -> Vec<(String, LoadedKernelModuleSpec)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let name = f.next()?.to_string();
            let size = f.next()?.parse().ok()?;
            let reference_count = f.next()?.parse().ok()?;
            let dependencies = f
                .next()?
                .split(',')
                .filter(|d| !d.is_empty() && *d != "-")
                .map(str::to_string)
                .collect();
            let state = f.next()?.to_string();
            let address = f.next().unwrap_or_default().to_string();
            Some((
                name,
                LoadedKernelModuleSpec {
                    size,
                    reference_count,
                    dependencies,
                    state,
                    address,
                },
            ))
        })
        .collect()
}

/// The modules listed in a `modules-load.d` file, with their parameters: one module per line,
/// `#` and `;` comments, and (talos-rs's addition to the format) parameters after the name.
pub fn parse_modules_load(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = normalize(words.next()?);
            Some((name, words.map(str::to_string).collect()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/fs/overlayfs/overlay.ko:
kernel/net/8021q/8021q.ko: kernel/net/802/garp.ko kernel/net/802/stp.ko kernel/net/802/mrp.ko kernel/net/llc/llc.ko
kernel/drivers/some-thing.ko:
not a line
";

    #[test]
    fn a_module_comes_after_its_dependencies_in_reverse_listed_order() {
        let idx = ModuleIndex::parse(Path::new("/m"), DEP, "kernel/net/ipv6/ipv6.ko\n");
        let plan: Vec<String> = idx
            .plan("virtio_net")
            .expect("known")
            .iter()
            .map(|p| module_name(p))
            .collect();
        assert_eq!(
            plan,
            [
                "virtio_ring",
                "virtio",
                "failover",
                "net_failover",
                "virtio_net"
            ]
        );
        assert_eq!(
            idx.plan("8021q")
                .expect("known")
                .last()
                .map(|p| module_name(p)),
            Some("8021q".to_string())
        );
        assert_eq!(idx.plan("overlay").expect("known").len(), 1);
        // Dashes and underscores name the same module, as for the kernel.
        assert_eq!(idx.plan("some_thing").expect("known").len(), 1);
        assert_eq!(idx.plan("some-thing").expect("known").len(), 1);
        assert!(idx.plan("ipv6").expect("built in").is_empty());
        assert!(matches!(idx.plan("nope"), Err(KmodError::Unknown(n)) if n == "nope"));
    }

    #[test]
    fn proc_modules_and_modules_load_files_parse() {
        let text = "virtio_net 73728 0 - Live 0x0000000000000000\n\
                    failover 16384 1 net_failover, Live 0xffffffffc0123000\n\
                    garbage\n";
        let m = parse_proc_modules(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, "virtio_net");
        assert_eq!(m[0].1.size, 73728);
        assert!(m[0].1.dependencies.is_empty());
        assert_eq!(m[1].1.dependencies, ["net_failover"]);
        assert_eq!(m[1].1.reference_count, 1);
        assert_eq!(m[1].1.state, "Live");
        let none = Vec::<String>::new;
        assert_eq!(
            parse_modules_load(
                "# boot\nvirtio_net\n\n; old\n  8021q \nsome-thing\nbonding max_bonds=0 x=1\n"
            ),
            [
                ("virtio_net".to_string(), none()),
                ("8021q".to_string(), none()),
                ("some_thing".to_string(), none()),
                (
                    "bonding".to_string(),
                    vec!["max_bonds=0".to_string(), "x=1".to_string()]
                ),
            ]
        );
    }
}
