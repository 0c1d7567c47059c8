//! The seccomp profiles compiled into init at build time (`rootfs/profiles/<arch>/*.json`,
//! checked by `build.rs`), written out under the node's `/run/init/seccomp` at start so the
//! sandbox can compile the one a program needs before each spawn. The files are root's and
//! read-only: a daemon cannot change the profile of its next start.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/profiles.rs"));

/// The JSON of the profile called `name`.
pub fn get(name: &str) -> Option<&'static str> {
    PROFILES.iter().find(|(n, _)| *n == name).map(|(_, j)| *j)
}

/// The names of every compiled-in profile.
pub fn names() -> impl Iterator<Item = &'static str> {
    PROFILES.iter().map(|(n, _)| *n)
}

/// Writes every profile to `dir/<name>.json` (mode 0444), replacing what is there.
pub fn install(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for (name, json) in PROFILES {
        let path = dir.join(format!("{name}.json"));
        let tmp = dir.join(format!(".{name}.json.tmp"));
        std::fs::write(&tmp, json)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o444))?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_profile_compiles_with_the_sandbox_checks() {
        for (name, json) in super::PROFILES {
            sandbox::seccomp::compile_bytes(std::path::Path::new(name), json.as_bytes(), name)
                .unwrap_or_else(|e| panic!("{name}: {}", cosi::error::Chain(&e)));
        }
        assert!(super::get("stated").is_some());
        assert!(super::get("networkd").is_some());
    }
}
