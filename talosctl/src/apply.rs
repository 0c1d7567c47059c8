//! `talosctl apply-config` and `talosctl patch machineconfig`: change a node's machine
//! configuration (the `MachineConfig` resource `config/v1alpha1`).
//!
//! Both build the new configuration on the client, decode and validate it for the node's mode
//! first, print a unified diff against the current one, and write nothing when it is invalid,
//! unchanged, or `--dry-run` is given. The write is a compare-and-set on the version read: a
//! configuration changed meanwhile is not overwritten.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use cosi::{Client, Resource, ResourceSpec as _};
use machinery::config::{apply_patches, Config, Patch, ValidationMode};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE};
use machinery::resources::runtime::MachineStatusSpec;

/// Arguments of `apply-config`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The new machine configuration.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: PathBuf,
    /// Patches to apply to the file first (as `machineconfig patch`); repeatable.
    #[arg(short = 'p', long, value_name = "PATCH", allow_hyphen_values = true)]
    pub config_patch: Vec<String>,
    /// Show what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Arguments of `patch`.
#[derive(Debug, clap::Args)]
pub struct PatchArgs {
    /// What to patch: `machineconfig` (`mc`, `machineconfigs`).
    #[arg(value_name = "RESOURCE")]
    pub resource: String,
    /// A patch, inline or `@file`: strategic merge (YAML) or JSON 6902 (JSON, or a YAML list);
    /// repeat to apply several, in order.
    #[arg(
        short = 'p',
        long,
        required = true,
        value_name = "PATCH",
        allow_hyphen_values = true
    )]
    pub patch: Vec<String>,
    /// Show what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `apply-config` against one node's stated.
pub async fn apply(socket: &Path, args: &ApplyArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let text = if args.config_patch.is_empty() {
        text
    } else {
        let patches = load_patches(&args.config_patch)?;
        apply_patches(&text, &patches)
            .with_context(|| format!("cannot patch {}", args.file.display()))?
    };
    change(socket, |_| Ok(text.clone()), args.dry_run, true, out).await
}

/// Runs `patch machineconfig` against one node's stated.
pub async fn patch(socket: &Path, args: &PatchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let r = args.resource.to_ascii_lowercase();
    if ![
        "machineconfig",
        "machineconfigs",
        "mc",
        MachineConfigSpec::TYPE,
    ]
    .iter()
    .any(|a| a.eq_ignore_ascii_case(&r))
    {
        anyhow::bail!(
            "patch {}: only the machine configuration can be patched (talosctl patch machineconfig)",
            args.resource
        );
    }
    let patches = load_patches(&args.patch)?;
    change(
        socket,
        |current| {
            let current = current
                .context("the node has no machine configuration to patch (use apply-config)")?;
            apply_patches(current, &patches).context("cannot patch the machine configuration")
        },
        args.dry_run,
        false,
        out,
    )
    .await
}

fn load_patches(args: &[String]) -> anyhow::Result<Vec<Patch>> {
    args.iter()
        .map(|p| crate::machineconfig::load_patch(p))
        .collect()
}

/// The validation mode of the node: from init's MachineStatus (`vm` → metal, else container).
async fn node_mode(client: &Client) -> ValidationMode {
    match client
        .get_typed::<MachineStatusSpec>("runtime", "machine")
        .await
    {
        Ok(r) if r.spec.mode == "vm" => ValidationMode::Metal,
        _ => ValidationMode::Container,
    }
}

/// Reads the current configuration, builds the new one with `new`, validates it, shows the
/// diff, and writes it (compare-and-set) unless `dry_run`. `create` allows a node without a
/// configuration yet.
async fn change(
    socket: &Path,
    new: impl FnOnce(Option<&str>) -> anyhow::Result<String>,
    dry_run: bool,
    create: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if !socket.exists() {
        anyhow::bail!(
            "stated socket {} does not exist: is the node running?",
            socket.display()
        );
    }
    let client = Client::new(socket)
        .with_context(|| format!("cannot use stated socket {}", socket.display()))?;
    let current = match client
        .get_typed::<MachineConfigSpec>(NAMESPACE, ACTIVE_ID)
        .await
    {
        Ok(r) => Some(r),
        Err(e) if e.is_not_found() => None,
        Err(e) => {
            return Err(anyhow::Error::new(e).context("cannot read the machine configuration"))
        }
    };
    let old_text = current.as_ref().map(|r| r.spec.0.as_str());
    let text = new(old_text)?;
    let mode = node_mode(&client).await;
    let config = Config::from_yaml(&text).map_err(|e| invalid(mode, &e))?;
    let warnings = config.validate(mode).map_err(|e| invalid(mode, &e))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let (old_norm, new_norm) = (normalize(old_text.unwrap_or("")), normalize(&text));
    let diff = similar::TextDiff::from_lines(old_norm.as_str(), new_norm.as_str())
        .unified_diff()
        .context_radius(3)
        .header("current", "new")
        .to_string();
    if diff.is_empty() {
        writeln!(out, "Config diff:\n\nNo changes.")?;
    } else {
        writeln!(out, "Config diff:\n\n{diff}")?;
    }
    if dry_run {
        writeln!(out, "Dry run: nothing was written.")?;
        return Ok(());
    }
    if old_text == Some(text.as_str()) || (diff.is_empty() && current.is_some()) {
        writeln!(out, "Apply was skipped: no changes detected.")?;
        return Ok(());
    }
    let stored = match current {
        Some(mut r) => {
            r.spec = MachineConfigSpec(text);
            let raw = r.to_raw()?;
            client
                .update(&raw, &raw.metadata.owner, None)
                .await
                .map_err(|e| {
                    if e.is_conflict() {
                        anyhow::anyhow!(
                            "the machine configuration changed since it was read (version {}); \
                             nothing was written: run the command again",
                            raw.metadata.version
                        )
                    } else {
                        anyhow::Error::new(e).context("cannot write the machine configuration")
                    }
                })?
        }
        None if create => {
            let raw = Resource::new(NAMESPACE, ACTIVE_ID, MachineConfigSpec(text)).to_raw()?;
            client
                .create(&raw, "")
                .await
                .context("cannot write the machine configuration")?
        }
        None => anyhow::bail!("the node has no machine configuration"),
    };
    writeln!(
        out,
        "Applied configuration without a reboot (MachineConfig version {}).",
        stored.metadata.version
    )?;
    Ok(())
}

/// A configuration as the diff compares it: every document decoded and encoded again, so
/// that only changes of content show (not of indentation, quoting or comments), as upstream
/// compares encoded configurations. Text that does not decode is compared as it is.
fn normalize(text: &str) -> String {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        match serde::Deserialize::deserialize(doc) {
            Ok(serde_yaml_ng::Value::Null) => {}
            Ok(v) => match serde_yaml_ng::to_string::<serde_yaml_ng::Value>(&v) {
                Ok(s) => docs.push(s),
                Err(_) => return text.to_string(),
            },
            Err(_) => return text.to_string(),
        }
    }
    docs.join("---\n")
}

fn invalid(mode: ValidationMode, errors: &machinery::config::ConfigErrors) -> anyhow::Error {
    anyhow::anyhow!(
        "the new machine configuration is not valid for {mode} mode; nothing was written:\n  * {}",
        errors
            .errors()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n  * ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizing_hides_layout_and_keeps_content() {
        let a = "# c\nmachine:\n    type: worker\n---\nkind: X\napiVersion: v1alpha1\n";
        let b = "machine:\n  type: worker\n---\nkind: X\napiVersion: v1alpha1\n";
        assert_eq!(normalize(a), normalize(b));
        assert_ne!(normalize(a), normalize("machine:\n  type: controlplane\n"));
    }
}
