//! The node's hostname. networkd merges the desired names into the `HostnameSpec` `hostname` of
//! `network`, but may not set them: `sethostname(2)` needs CAP_SYS_ADMIN, which is outside its
//! allow-list (DESIGN.md §5). init, PID 1 of the node and owner of its UTS namespace (as it owns
//! the early mounts), applies them: it watches that one resource and, when its names differ from
//! the kernel's, calls `sethostname(2)` and sets the domain name (`/proc/sys/kernel/domainname`,
//! the same as `setdomainname(2)`). networkd reads the result back into `HostnameStatus`.
//!
//! Only where init owns a UTS namespace ([`may_set`]): as a VM's PID 1, in container mode, and in
//! development mode only with `--own-uts` (tests run init under `unshare --uts`). Outside a VM,
//! init refuses when it can see that it shares the host's UTS namespace, so a runner that forgot
//! `--uts` never renames the host. A spec being torn down changes nothing (as upstream).

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use machinery::resources::network::HostnameSpecSpec;

use crate::pid1::Mode;

/// The inode of the kernel's initial UTS namespace (`PROC_UTS_INIT_INO`): the host's, unless
/// the host itself runs in a container.
pub const INITIAL_UTS_INO: u64 = 0xEFFF_FFFE;

/// Whether init may set the hostname in `mode`; the reason when it may not.
///
/// # Errors
///
/// Why not: development mode without `own_uts`, or a UTS namespace init can see it shares with
/// the host (the initial one) or with its parent.
pub fn may_set(mode: Mode, own_uts: bool) -> Result<(), String> {
    match mode {
        Mode::Vm => return Ok(()),
        Mode::Dev if !own_uts => {
            return Err(
                "development mode without --own-uts: the UTS namespace is not init's".into(),
            )
        }
        Mode::Dev | Mode::Container => {}
    }
    let own = uts_of(Path::new("/proc/self/ns/uts"))?;
    if own.1 == INITIAL_UTS_INO {
        return Err("init runs in the host's UTS namespace (run it under `unshare --uts`)".into());
    }
    // As PID 1 of a PID namespace the parent is outside it (ppid 0): nothing to compare.
    let parent = nix::unistd::getppid().as_raw();
    if parent > 0 && uts_of(Path::new(&format!("/proc/{parent}/ns/uts")))? == own {
        return Err(format!("init shares its parent's ({parent}) UTS namespace"));
    }
    Ok(())
}

/// (device, inode) of a `/proc/<pid>/ns/uts` link: the namespace's identity.
fn uts_of(link: &Path) -> Result<(u64, u64), String> {
    std::fs::metadata(link)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| format!("cannot read {}: {e}", link.display()))
}

/// The kernel's hostname and domain name (no domain is empty, not the kernel's `(none)`).
///
/// # Errors
///
/// `uname(2)` failed.
pub fn kernel_names() -> Result<(String, String), nix::Error> {
    let uts = nix::sys::utsname::uname()?;
    let host = uts.nodename().to_string_lossy().into_owned();
    let domain = uts.domainname().to_string_lossy().into_owned();
    Ok((host, normalize_domain(domain)))
}

fn normalize_domain(domain: String) -> String {
    if domain == "(none)" {
        String::new()
    } else {
        domain
    }
}

/// What [`apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The kernel had the names already.
    Unchanged,
    /// The kernel has them now.
    Set,
}

/// Gives the kernel the spec's names, each only if it differs.
///
/// # Errors
///
/// An invalid spec (it comes from stated: checked like any outside input), or the kernel's
/// refusal.
pub fn apply(spec: &HostnameSpecSpec) -> Result<Applied, String> {
    spec.validate().map_err(|e| e.to_string())?;
    let (host, domain) = kernel_names().map_err(|e| format!("uname: {e}"))?;
    let mut applied = Applied::Unchanged;
    if host != spec.hostname {
        nix::unistd::sethostname(&spec.hostname)
            .map_err(|e| format!("sethostname {:?}: {e}", spec.hostname))?;
        applied = Applied::Set;
    }
    if domain != spec.domainname {
        // A newline ends the value, so an empty domain name is written too (an empty write
        // would not reach the kernel).
        std::fs::write(
            "/proc/sys/kernel/domainname",
            format!("{}\n", spec.domainname),
        )
        .map_err(|e| format!("setting the domain name {:?}: {e}", spec.domainname))?;
        applied = Applied::Set;
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_vm_or_an_own_uts_namespace_allows_it() {
        assert!(may_set(Mode::Vm, false).is_ok());
        let dev = may_set(Mode::Dev, false).unwrap_err();
        assert!(dev.contains("--own-uts"), "{dev}");
        // Where the tests run in the host's initial UTS namespace: refused, also with the flag
        // and in container mode.
        if std::fs::metadata("/proc/self/ns/uts").is_ok_and(|m| m.ino() == INITIAL_UTS_INO) {
            for (mode, flag) in [(Mode::Dev, true), (Mode::Container, false)] {
                let why = may_set(mode, flag).unwrap_err();
                assert!(why.contains("host's UTS namespace"), "{why}");
            }
        }
    }

    #[test]
    fn the_kernels_no_domain_is_empty() {
        assert_eq!(normalize_domain("(none)".into()), "");
        assert_eq!(normalize_domain("example.org".into()), "example.org");
        assert!(kernel_names().is_ok());
    }
}
