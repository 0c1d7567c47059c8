//! `mkrootfs`: builds the node image (tree and initramfs) from built binaries. `rootfs/build.sh`
//! is the one command that compiles the binaries statically and runs this.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Builds the talos-rs node image: a directory tree and the same tree as an initramfs.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Directory of the built programs (e.g. target/x86_64-unknown-linux-gnu/image).
    #[arg(long, value_name = "DIR")]
    bin_dir: PathBuf,
    /// Output directory: DIR/tree and DIR/initramfs.cpio.gz.
    #[arg(long, value_name = "DIR", default_value = "target/rootfs")]
    out: PathBuf,
    /// The programs to install in /usr/bin.
    #[arg(long, value_delimiter = ',', default_values_t = rootfs::PROGRAMS.iter().map(|p| p.to_string()))]
    programs: Vec<String>,
    /// The workspace's rootfs/ directory (manifest, seccomp profiles) [default: this crate's].
    #[arg(long, value_name = "DIR")]
    source: Option<PathBuf>,
    /// A kernel for VM nodes (rootfs/kernel.sh's output: DIR/vmlinuz, DIR/lib/modules/<release>):
    /// the image carries its boot modules and DIR/vmlinuz is copied to OUT/vmlinuz.
    #[arg(long, value_name = "DIR")]
    kernel: Option<PathBuf>,
    /// Programs of this machine to carry in /usr/bin with their libraries (mkfs.xfs, which
    /// blockd asks init to run to format a system volume, from Debian's xfsprogs; etcd, which
    /// k8sd asks init to run on control planes, from Debian's etcd-server).
    #[arg(long, value_delimiter = ',', default_values_t = rootfs::TOOLS.iter().map(|p| p.to_string()))]
    tools: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let epoch = match rootfs::epoch_from_env() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("mkrootfs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let inputs = rootfs::Inputs {
        bin_dir: args.bin_dir,
        programs: args.programs,
        source: args.source.unwrap_or_else(rootfs::source_dir),
        epoch,
        kernel: args.kernel,
        tools: args.tools.into_iter().map(PathBuf::from).collect(),
    };
    match rootfs::build(&inputs, &args.out) {
        Ok(r) => {
            println!(
                "tree        {} ({} entries, {} bytes)",
                r.tree.display(),
                r.entries,
                r.tree_bytes
            );
            println!(
                "initramfs   {} ({} bytes)",
                r.initramfs.display(),
                r.initramfs_bytes
            );
            println!("mtime       {epoch} (SOURCE_DATE_EPOCH)");
            if r.shared_libraries.is_empty() {
                println!("linking     static (no shared libraries in the image)");
            } else {
                println!(
                    "linking     dynamic: shipped {}",
                    r.shared_libraries.join(", ")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("mkrootfs: {msg}");
            ExitCode::FAILURE
        }
    }
}
