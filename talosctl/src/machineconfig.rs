//! `talosctl machineconfig`: local operations on machine configuration files.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use machinery::config::{apply_patches, Config, Patch};

/// The `machineconfig` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Patch a machine configuration file.
    #[command(long_about = PATCH_LONG_ABOUT, after_long_help = PATCH_EXAMPLES)]
    Patch(PatchArgs),
}

const PATCH_LONG_ABOUT: &str = "\
Patch a machine configuration file and print the result (or write it with --output).

A patch is a strategic merge patch (a YAML configuration fragment, merged into the document of the
same kind; `$patch: delete` removes a key, list item or document) or an RFC 6902 JSON patch (a JSON
array, or a YAML list, of operations; single-document configurations only). Patches apply in the
order given. The patched configuration is decoded strictly before anything is written: on any
error nothing is written.";

const PATCH_EXAMPLES: &str = "\
Examples:
  talosctl machineconfig patch controlplane.yaml --patch @hostname.yaml -o patched.yaml
  talosctl machineconfig patch worker.yaml -p 'machine: {network: {hostname: w1}}'
  talosctl mc patch worker.yaml -p '[{\"op\": \"add\", \"path\": \"/machine/env\", \"value\": {\"A\": \"b\"}}]'";

/// Arguments of `talosctl machineconfig patch`.
#[derive(Debug, clap::Args)]
pub struct PatchArgs {
    /// Machine configuration file to patch.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// A patch, inline or `@file` to read it from a file; repeat to apply several, in order.
    #[arg(
        short = 'p',
        long,
        required = true,
        value_name = "PATCH",
        allow_hyphen_values = true
    )]
    pub patch: Vec<String>,

    /// Write the patched configuration to this file (created with mode 0600) instead of
    /// standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs a `machineconfig` subcommand.
pub fn run(cmd: &Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        Command::Patch(args) => patch(args, out),
    }
}

fn patch(args: &PatchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let config = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let patches = args
        .patch
        .iter()
        .map(|p| load_patch(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let patched = apply_patches(&config, &patches)
        .with_context(|| format!("cannot patch {}", args.file.display()))?;
    Config::from_yaml(&patched).map_err(|e| {
        anyhow::anyhow!(
            "the patched configuration is not valid:\n  * {}",
            e.errors()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n  * ")
        )
    })?;
    match &args.output {
        Some(path) => write_file(path, patched.as_bytes())
            .with_context(|| format!("cannot write {}", path.display())),
        None => Ok(out.write_all(patched.as_bytes())?),
    }
}

/// Parses `--patch` text: inline, or `@path` to read a file.
pub(crate) fn load_patch(arg: &str) -> anyhow::Result<Patch> {
    let (text, origin) = match arg.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("cannot read patch {path}"))?,
            format!("patch {arg}"),
        ),
        None => (arg.to_string(), "inline patch".to_string()),
    };
    Patch::parse(&text).with_context(|| format!("invalid {origin}"))
}

/// Writes `data` to `path` atomically: a temporary file beside it, then a rename.
fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
