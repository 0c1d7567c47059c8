//! `talosctl validate`: decode and validate a machine configuration file offline.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use machinery::config::{Config, ConfigErrors, ValidationMode};

/// Long help of `validate`.
pub const LONG_ABOUT: &str = "\
Validate a machine configuration file offline.

The file is decoded strictly (unknown fields, values of the wrong type and malformed documents are
errors), then validated for the mode the machine runs in. Every problem is printed with its path,
e.g. `machine.network.interfaces[0].mtu: ...`; the exit code is 1 if there is any. Warnings
(deprecated fields, legacy values) are printed to standard error and do not fail the check unless
--strict is given.";

/// Arguments of `talosctl validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Machine configuration file to validate.
    #[arg(short = 'c', long, value_name = "FILE")]
    pub config: PathBuf,

    /// Where the machine runs; decides which sections are required.
    #[arg(short = 'm', long, value_enum, default_value_t = Mode::Metal)]
    pub mode: Mode,

    /// Treat warnings as errors.
    #[arg(long)]
    pub strict: bool,
}

/// The validation mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A node in Linux namespaces: no install, no disks.
    Container,
    /// Bare metal or a VM: installs to a disk, so `machine.install` is required.
    Metal,
    /// A cloud instance booting a pre-installed image.
    Cloud,
}

impl From<Mode> for ValidationMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Container => ValidationMode::Container,
            Mode::Metal => ValidationMode::Metal,
            Mode::Cloud => ValidationMode::Cloud,
        }
    }
}

/// Runs `validate`; success is reported on `out`, warnings on standard error.
pub fn run(args: &ValidateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let file = args.config.display();
    let mode = ValidationMode::from(args.mode);
    let text =
        std::fs::read_to_string(&args.config).with_context(|| format!("cannot read {file}"))?;
    let config = Config::from_yaml(&text).map_err(|e| invalid(&file, mode, &e))?;
    if args.strict {
        config
            .validate_strict(mode)
            .map_err(|e| invalid(&file, mode, &e))?;
    } else {
        let warnings = config
            .validate(mode)
            .map_err(|e| invalid(&file, mode, &e))?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
    }
    writeln!(out, "{file} is valid for {mode} mode")?;
    Ok(())
}

/// The error listing every problem, one per line.
fn invalid(
    file: &std::path::Display<'_>,
    mode: ValidationMode,
    errors: &ConfigErrors,
) -> anyhow::Error {
    let n = errors.len();
    let mut msg = format!(
        "{file} is not valid for {mode} mode: {n} {}",
        if n == 1 { "problem" } else { "problems" }
    );
    for e in errors {
        let _ = write!(msg, "\n  * {e}");
    }
    anyhow::anyhow!(msg)
}
