//! Compiles every seccomp profile of the image (`rootfs/profiles/<arch>/<name>.json`) with
//! seccompiler for the target architecture, so a profile that does not compile fails the build,
//! and embeds the checked JSON into the init binary (`$OUT_DIR/profiles.rs`), as Firecracker
//! embeds its default filters. init writes them out under `/run/init/seccomp` at start and the
//! sandbox compiles the one a daemon needs before each spawn.
use std::fmt::Write as _;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?)
        .join("../rootfs/profiles")
        .join(&arch);
    println!("cargo:rerun-if-changed={}", dir.display());
    let target = seccompiler::TargetArch::try_from(arch.as_str())
        .map_err(|e| format!("seccompiler does not support {arch}: {e:?}"))?;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    let mut out = String::from(
        "/// The seccomp profiles compiled into init: (name, seccompiler JSON). Each file holds one\n\
         /// filter named like the file.\npub static PROFILES: &[(&str, &str)] = &[\n",
    );
    for path in entries {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or("profile file name is not UTF-8")?
            .to_string();
        let bytes = std::fs::read(&path)?;
        let programs = seccompiler::compile_from_json(bytes.as_slice(), target)
            .map_err(|e| format!("seccomp profile {} does not compile: {e}", path.display()))?;
        if !programs.contains_key(&name) {
            return Err(format!("{} has no filter named {name:?}", path.display()).into());
        }
        writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            path.canonicalize()?.display()
        )?;
    }
    out.push_str("];\n");
    std::fs::write(
        PathBuf::from(std::env::var("OUT_DIR")?).join("profiles.rs"),
        out,
    )?;
    Ok(())
}
