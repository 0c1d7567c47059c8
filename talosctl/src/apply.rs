//! `talosctl apply-config` and `talosctl patch machineconfig`: change a node's machine
//! configuration (the `MachineConfig` resource `config/v1alpha1`) with
//! `machine.ApplyConfiguration`, through apid (or, on the development route, init's control
//! socket). The node validates (every problem listed), diffs and writes it; nothing is written
//! when it is invalid or with `--dry-run`.
//!
//! `patch` reads the current configuration first: through apid that is the redacted copy (apid
//! never reads the full one), so the patched text carries `******` where the secrets were, and
//! the node keeps its own values there. Modes as upstream's `--mode`: auto (no-reboot on a
//! talos-rs node: everything is applied live), no-reboot, staged (active after the next boot),
//! try (reverted after `--timeout` unless another apply comes first); reboot is refused by the
//! node, as upstream since 1.14.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use machinery::config::{apply_patches, Patch};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE, REDACTED_NAMESPACE};
use proto::init::ApplyRequest;
use proto::machine::apply_configuration_request::Mode as WireMode;
use proto::machine::machine_service_client::MachineServiceClient;
use proto::machine::ApplyConfigurationRequest;

use crate::api::{self, Api};

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Apply without a reboot when possible (always, on a talos-rs node).
    Auto,
    /// Apply now, without a reboot.
    NoReboot,
    /// Deprecated upstream; refused by the node.
    Reboot,
    /// Keep it for the next boot; change nothing now.
    Staged,
    /// Apply now and go back to the current configuration after `--timeout`.
    Try,
}

impl Mode {
    fn wire(self) -> WireMode {
        match self {
            Mode::Auto => WireMode::Auto,
            Mode::NoReboot => WireMode::NoReboot,
            Mode::Reboot => WireMode::Reboot,
            Mode::Staged => WireMode::Staged,
            Mode::Try => WireMode::Try,
        }
    }
}

/// A Go-style duration: `90s`, `1m`, `1m30s`, `500ms`, `2h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (e.g. 30s, 1m, 1m30s, 2h)");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let one = match &rest[..unit] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        total = one
            .checked_mul(u32::try_from(n).map_err(|_| bad())?)
            .and_then(|d| total.checked_add(d))
            .ok_or_else(bad)?;
        rest = &rest[unit..];
    }
    Ok(total)
}

/// What both commands share.
#[derive(Debug, Clone, clap::Args)]
pub struct ModeArgs {
    /// How to apply it.
    #[arg(short = 'm', long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,
    /// Show what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With `--mode try`: how long until the current configuration comes back.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Arguments of `apply-config`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The new machine configuration.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: PathBuf,
    /// Patches to apply to the file first (as `machineconfig patch`); repeatable.
    #[arg(short = 'p', long, value_name = "PATCH", allow_hyphen_values = true)]
    pub config_patch: Vec<String>,
    #[command(flatten)]
    pub how: ModeArgs,
    /// Talk to a node in maintenance (no configuration yet): no client certificate, the
    /// node's self-signed certificate taken as it is unless `--cert-fingerprint` pins it.
    /// The node is `-n` (or `-e`), by address.
    #[arg(short = 'i', long)]
    pub insecure: bool,
    /// With `--insecure`: the fingerprint the node's certificate must have (the base64
    /// SHA-256 of its public key, as the node's console shows it); repeatable.
    #[arg(long, value_name = "FP", requires = "insecure")]
    pub cert_fingerprint: Vec<String>,
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
    #[command(flatten)]
    pub how: ModeArgs,
}

fn load_patches(args: &[String]) -> anyhow::Result<Vec<Patch>> {
    args.iter()
        .map(|p| crate::machineconfig::load_patch(p))
        .collect()
}

/// The new configuration of `apply-config`: the file, patched.
fn apply_text(args: &ApplyArgs) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    if args.config_patch.is_empty() {
        return Ok(text);
    }
    let patches = load_patches(&args.config_patch)?;
    apply_patches(&text, &patches).with_context(|| format!("cannot patch {}", args.file.display()))
}

fn check_resource(args: &PatchArgs) -> anyhow::Result<()> {
    let r = args.resource.to_ascii_lowercase();
    if ![
        "machineconfig",
        "machineconfigs",
        "mc",
        <MachineConfigSpec as cosi::ResourceSpec>::TYPE,
    ]
    .iter()
    .any(|a| a.eq_ignore_ascii_case(&r))
    {
        anyhow::bail!(
            "patch {}: only the machine configuration can be patched (talosctl patch machineconfig)",
            args.resource
        );
    }
    Ok(())
}

/// `patch`: the node's configuration (`None`: it has none) with the patches applied.
fn patched(current: Option<&str>, patches: &[Patch]) -> anyhow::Result<String> {
    let current =
        current.context("the node has no machine configuration to patch (use apply-config)")?;
    apply_patches(current, patches).context("cannot patch the machine configuration")
}

/// The node's configuration as `client` may read it from `namespace`, and the version of the
/// active configuration it is (0 when the node does not say): sent back with the change, so
/// that the node refuses it if another apply came in between.
async fn current(client: &cosi::Client, namespace: &str) -> anyhow::Result<Option<(String, u64)>> {
    match client
        .get_typed::<MachineConfigSpec>(namespace, ACTIVE_ID)
        .await
    {
        Ok(r) => {
            let version = machinery::resources::config::source_version(&r).unwrap_or(0);
            Ok(Some((r.spec.0, version)))
        }
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context("cannot read the machine configuration")),
    }
}

fn request(text: String, how: &ModeArgs, expected_version: u64) -> ApplyConfigurationRequest {
    ApplyConfigurationRequest {
        expected_version,
        data: text.into_bytes(),
        mode: how.mode.wire() as i32,
        dry_run: how.dry_run,
        try_mode_timeout: Some(prost_types::Duration {
            seconds: i64::try_from(how.timeout.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(how.timeout.subsec_nanos()).unwrap_or(0),
        }),
    }
}

/// Prints one node's answer: its warnings, then what was done (with `--dry-run`, the diff).
fn print(
    label: Option<&str>,
    warnings: &[String],
    details: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    for w in warnings {
        eprintln!("warning: {w}");
    }
    match label {
        Some(node) => writeln!(out, "{node}: {details}")?,
        None => writeln!(out, "{details}")?,
    }
    Ok(())
}

/// Where the new configuration comes from.
pub enum Change<'a> {
    /// `apply-config`.
    Apply(&'a ApplyArgs),
    /// `patch machineconfig`.
    Patch(&'a PatchArgs),
}

impl Change<'_> {
    fn how(&self) -> &ModeArgs {
        match self {
            Change::Apply(a) => &a.how,
            Change::Patch(p) => &p.how,
        }
    }
}

/// `apply-config` / `patch` through apid: one ApplyConfiguration per node (`node` metadata).
pub async fn run_api(api: &Api, change: Change<'_>, out: &mut dyn Write) -> anyhow::Result<()> {
    let (fixed, patches) = match &change {
        Change::Apply(a) => (Some(apply_text(a)?), Vec::new()),
        Change::Patch(p) => {
            check_resource(p)?;
            (None, load_patches(&p.patch)?)
        }
    };
    let mut machine = MachineServiceClient::new(api.channel()?)
        .max_decoding_message_size(cosi::client::MAX_MESSAGE)
        .max_encoding_message_size(cosi::client::MAX_MESSAGE);
    let sources = api.state_sources()?;
    let several = sources.len() > 1;
    let mut errors = Vec::new();
    for ((label, node), source) in api.targets().into_iter().zip(sources) {
        let (text, expected) = match &fixed {
            Some(t) => (t.clone(), 0),
            None => {
                let now = match current(&source.client, REDACTED_NAMESPACE).await {
                    Ok(c) => c,
                    Err(e) => {
                        errors.push(format!("{label}: {e:#}"));
                        continue;
                    }
                };
                let expected = now.as_ref().map_or(0, |(_, v)| *v);
                match patched(now.as_ref().map(|(t, _)| t.as_str()), &patches) {
                    Ok(t) => (t, expected),
                    Err(e) => {
                        errors.push(format!("{label}: {e:#}"));
                        continue;
                    }
                }
            }
        };
        let req = api.for_node(request(text, change.how(), expected), node.as_deref())?;
        match machine.apply_configuration(req).await {
            Ok(reply) => {
                for m in reply.into_inner().messages {
                    print(
                        several.then_some(label.as_str()),
                        &m.warnings,
                        &m.mode_details,
                        out,
                    )?;
                }
            }
            Err(s) => {
                let why = api::explain(api, &s).to_string();
                errors.push(format!("{label}: {why}"));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("\n"))
    }
}

/// `apply-config` / `patch` on the development route: the node's own sockets (stated's for
/// the current configuration, init's control socket to apply).
pub async fn run_sockets(
    target: &crate::target::Target,
    change: Change<'_>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (text, expected) = match &change {
        Change::Apply(a) => (apply_text(a)?, 0),
        Change::Patch(p) => {
            check_resource(p)?;
            let patches = load_patches(&p.patch)?;
            let socket = &target.state_socket;
            if !socket.exists() {
                anyhow::bail!(
                    "stated socket {} does not exist: is the node running?",
                    socket.display()
                );
            }
            let client = cosi::Client::new(socket)
                .with_context(|| format!("cannot use stated socket {}", socket.display()))?;
            let now = current(&client, NAMESPACE).await?;
            let expected = now.as_ref().map_or(0, |(_, v)| *v);
            (
                patched(now.as_ref().map(|(t, _)| t.as_str()), &patches)?,
                expected,
            )
        }
    };
    let r = request(text, change.how(), expected);
    let mut init = crate::services::connect(&target.init_socket)?;
    let reply = init
        .apply_configuration(ApplyRequest {
            data: r.data,
            mode: r.mode,
            dry_run: r.dry_run,
            try_timeout_ms: u64::try_from(change.how().timeout.as_millis()).unwrap_or(u64::MAX),
            maintenance: false,
            expected_version: r.expected_version,
        })
        .await
        .map_err(|s| {
            crate::services::call_error(&target.init_socket, "cannot apply the configuration", s)
        })?
        .into_inner();
    print(None, &reply.warnings, &reply.mode_details, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_go_writes_them() {
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["", "1", "m", "1x", "-1s", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
