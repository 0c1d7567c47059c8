//! `talosctl gen secrets` and `talosctl gen config`: a secrets bundle, and the machine
//! configurations and talosconfig of a cluster, in upstream's formats and file layout.
//!
//! Every file holding key material is written with mode 0600 and atomically (a temporary file
//! renamed into place), and nothing is written unless everything could be generated: a bad
//! patch or bundle leaves the output directory as it was.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use machinery::config::generate::{self, OutputType};
use machinery::config::{apply_patches, Config, MachineType, Patch, ValidationMode};
use machinery::secrets::Bundle;

use crate::talosconfig::{Context, TalosConfig};

/// Validity of the talosconfig's client certificate: one year, as upstream's
/// `TalosAPIDefaultCertificateValidityDuration`.
pub const CLIENT_CERT_TTL: Duration = Duration::from_secs(8760 * 3600);

/// `talosctl gen ...`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a secrets bundle (the cluster's CAs, keys and tokens) as upstream's
    /// secrets.yaml.
    Secrets(SecretsArgs),
    /// Generate the machine configurations (controlplane.yaml, worker.yaml) and talosconfig of
    /// a cluster.
    #[command(long_about = CONFIG_ABOUT)]
    Config(Box<ConfigArgs>),
}

const CONFIG_ABOUT: &str = "\
Generate the machine configurations (controlplane.yaml, worker.yaml) and the talosconfig of a
cluster, as upstream's `talosctl gen config`.

The cluster endpoint is the URL of the Kubernetes API: a control plane node's address with
port 6443, or a load balancer's. A new secrets bundle is generated unless --with-secrets names
one (keep it: every later config of the cluster needs it). A control plane's configuration
holds every CA with its key; a worker's holds only the certificates, no CA key.

Patches (--config-patch for both, --config-patch-control-plane, --config-patch-worker) are
inline YAML/JSON or @file, applied in order; the result must validate. The files are written
with mode 0600; existing ones are kept unless --force. The configurations carry no
documentation comments (upstream's --with-docs/--with-examples).";

/// `gen secrets`.
#[derive(Debug, Args)]
pub struct SecretsArgs {
    /// Where to write the bundle.
    #[arg(short = 'o', long = "output-file", default_value = "secrets.yaml")]
    pub output: PathBuf,
    /// Take the secrets from a control plane's machine configuration instead of generating
    /// them.
    #[arg(long, value_name = "PATH")]
    pub from_controlplane_config: Option<PathBuf>,
    /// Overwrite an existing file.
    #[arg(long)]
    pub force: bool,
}

/// `gen config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// The cluster's name.
    pub cluster_name: String,
    /// The Kubernetes API endpoint, e.g. https://10.5.0.2:6443.
    pub cluster_endpoint: String,
    /// Use this secrets bundle (secrets.yaml of `gen secrets`, or upstream's) instead of
    /// generating one.
    #[arg(long, value_name = "PATH")]
    pub with_secrets: Option<PathBuf>,
    /// A patch for every configuration: inline YAML/JSON or @file (repeatable).
    #[arg(long, value_name = "PATCH")]
    pub config_patch: Vec<String>,
    /// A patch for the control plane configuration only (repeatable).
    #[arg(long, value_name = "PATCH")]
    pub config_patch_control_plane: Vec<String>,
    /// A patch for the worker configuration only (repeatable).
    #[arg(long, value_name = "PATCH")]
    pub config_patch_worker: Vec<String>,
    /// Which files to write: controlplane, worker, talosconfig.
    #[arg(
        short = 't',
        long,
        value_delimiter = ',',
        default_value = "controlplane,worker,talosconfig"
    )]
    pub output_types: Vec<String>,
    /// The output directory; with a single output type, a file path, or `-` for standard
    /// output.
    #[arg(short = 'o', long, default_value = ".")]
    pub output: PathBuf,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
    /// Kubernetes version of the images.
    #[arg(long, default_value = generate::DEFAULT_KUBERNETES_VERSION)]
    pub kubernetes_version: String,
    /// `machine.install.disk`.
    #[arg(long, default_value = generate::DEFAULT_INSTALL_DISK)]
    pub install_disk: String,
    /// `machine.install.image`.
    #[arg(long, default_value = generate::DEFAULT_INSTALL_IMAGE)]
    pub install_image: String,
    /// Kubernetes DNS domain.
    #[arg(long, default_value = generate::DEFAULT_DNS_DOMAIN)]
    pub dns_domain: String,
    /// Extra SANs of the API server and machine certificates (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub additional_sans: Vec<String>,
    /// Endpoints of the talosconfig (apid addresses) [default: 127.0.0.1].
    #[arg(short = 'e', long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Upstream writes documentation comments; talos-rs does not (accepted, ignored: false is
    /// what it does).
    #[arg(long, default_value_t = false)]
    pub with_docs: bool,
    /// Upstream writes commented examples; talos-rs does not (accepted, ignored).
    #[arg(long, default_value_t = false)]
    pub with_examples: bool,
}

/// Runs `talosctl gen ...`.
pub fn run(cmd: &Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        Command::Secrets(args) => secrets(args, out),
        Command::Config(args) => config(args, out),
    }
}

/// Writes `text` at `path` ([`crate::files::write_private`]); refuses an existing file
/// unless `force`.
fn write_private(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    if !force && path.symlink_metadata().is_ok() {
        anyhow::bail!(
            "{} already exists, use --force to overwrite",
            path.display()
        );
    }
    crate::files::write_private(path, text.as_bytes())
}

fn load_bundle(path: &Path) -> anyhow::Result<Bundle> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let bundle = Bundle::from_yaml(&text).with_context(|| format!("{}", path.display()))?;
    bundle
        .validate()
        .with_context(|| format!("{} is not a complete secrets bundle", path.display()))?;
    Ok(bundle)
}

fn secrets(args: &SecretsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if !args.force && args.output.symlink_metadata().is_ok() {
        anyhow::bail!(
            "{} already exists, use --force to overwrite",
            args.output.display()
        );
    }
    let bundle = match &args.from_controlplane_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let config = Config::from_yaml(&text).with_context(|| format!("{}", path.display()))?;
            let bundle = from_config(&config);
            bundle.validate().with_context(|| {
                format!("{} does not hold a control plane's secrets", path.display())
            })?;
            bundle
        }
        None => Bundle::generate(SystemTime::now())?,
    };
    write_private(&args.output, &bundle.to_yaml()?, args.force)?;
    writeln!(out, "wrote {}", args.output.display())?;
    Ok(())
}

/// The bundle a control plane's configuration holds (upstream's `NewBundleFromConfig`).
fn from_config(config: &Config) -> Bundle {
    use machinery::secrets::{CertAndKey, Certs, ClusterSecrets, KeyOnly, Secrets, TrustdInfo};
    let pair = |p: Option<&machinery::config::v1alpha1::CertificateAndKey>| {
        p.map(|p| CertAndKey {
            crt: p.crt.clone().unwrap_or_default(),
            key: p.key.clone().unwrap_or_default(),
        })
    };
    let m = config.machine();
    let c = config.cluster();
    Bundle {
        cluster: c.map(|c| ClusterSecrets {
            id: c.id.clone().unwrap_or_default(),
            secret: c.secret.clone().unwrap_or_default(),
        }),
        secrets: c.map(|c| Secrets {
            bootstraptoken: c.token.clone().unwrap_or_default(),
            aescbcencryptionsecret: c.aescbc_encryption_secret.clone().unwrap_or_default(),
            secretboxencryptionsecret: c.secretbox_encryption_secret.clone().unwrap_or_default(),
        }),
        trustdinfo: m.map(|m| TrustdInfo {
            token: m.token.clone().unwrap_or_default(),
        }),
        certs: Some(Certs {
            etcd: pair(c.and_then(|c| c.etcd.as_ref()).and_then(|e| e.ca.as_ref())),
            k8s: pair(c.and_then(|c| c.ca.as_ref())),
            k8saggregator: pair(c.and_then(|c| c.aggregator_ca.as_ref())),
            k8sserviceaccount: c.and_then(|c| c.service_account.as_ref()).map(|k| KeyOnly {
                key: k.key.clone().unwrap_or_default(),
            }),
            os: pair(m.and_then(|m| m.ca.as_ref())),
        }),
    }
}

fn load_patches(args: &[String]) -> anyhow::Result<Vec<Patch>> {
    args.iter()
        .map(|a| crate::machineconfig::load_patch(a))
        .collect()
}

/// One generated machine configuration, patched and validated.
fn machine_config(
    input: &generate::Input<'_>,
    role: MachineType,
    patches: &[Patch],
) -> anyhow::Result<String> {
    let text = generate::generate(input, role)?.to_yaml()?;
    let text = if patches.is_empty() {
        text
    } else {
        apply_patches(&text, patches)
            .with_context(|| format!("cannot patch the {role} configuration"))?
    };
    let config = Config::from_yaml(&text)
        .with_context(|| format!("the patched {role} configuration does not decode"))?;
    // The configuration must be good for a node of any kind: metal is the strictest mode
    // upstream's `gen config` checks against.
    config
        .validate(ValidationMode::Metal)
        .with_context(|| format!("the {role} configuration is invalid"))?;
    Ok(text)
}

fn config(args: &ConfigArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.with_docs || args.with_examples {
        eprintln!(
            "warning: --with-docs/--with-examples: talos-rs writes configurations without \
             documentation comments or examples"
        );
    }
    let mut types = BTreeSet::new();
    for t in &args.output_types {
        let parsed = OutputType::parse(t.trim()).with_context(|| {
            format!("unknown output type {t:?}: controlplane, worker or talosconfig")
        })?;
        types.insert(parsed);
    }
    if types.is_empty() {
        anyhow::bail!("no output type: give controlplane, worker or talosconfig");
    }
    let to_stdout = args.output.as_os_str() == "-";
    // With one type, -o may name the file (or -); with several it is a directory.
    let single_file = types.len() == 1 && (to_stdout || !args.output.is_dir());
    if to_stdout && types.len() > 1 {
        anyhow::bail!("-o - writes one output type only, got {}", types.len());
    }
    if !single_file && args.output.exists() && !args.output.is_dir() {
        anyhow::bail!(
            "{} is not a directory: several output types need one",
            args.output.display()
        );
    }
    let bundle = match &args.with_secrets {
        Some(path) => load_bundle(path)?,
        None => Bundle::generate(SystemTime::now())?,
    };
    let mut input = generate::Input::new(&args.cluster_name, &args.cluster_endpoint, &bundle);
    input.kubernetes_version = args.kubernetes_version.trim_start_matches('v').to_string();
    input.install_disk = args.install_disk.clone();
    input.install_image = args.install_image.clone();
    input.dns_domain = args.dns_domain.clone();
    input.additional_sans = args.additional_sans.clone();
    let common = load_patches(&args.config_patch)?;
    let mut cp_patches = common.clone();
    cp_patches.extend(load_patches(&args.config_patch_control_plane)?);
    let mut worker_patches = common;
    worker_patches.extend(load_patches(&args.config_patch_worker)?);

    // Everything first, then the files: nothing is written if anything fails.
    let mut files: Vec<(OutputType, String)> = Vec::new();
    for t in &types {
        let text = match t {
            OutputType::ControlPlane => {
                machine_config(&input, MachineType::ControlPlane, &cp_patches)?
            }
            OutputType::Worker => machine_config(&input, MachineType::Worker, &worker_patches)?,
            OutputType::TalosConfig => talosconfig(args, &bundle)?,
        };
        files.push((*t, text));
    }
    if to_stdout {
        for (_, text) in &files {
            out.write_all(text.as_bytes())?;
        }
        return Ok(());
    }
    let paths: Vec<(PathBuf, &String)> = files
        .iter()
        .map(|(t, text)| {
            let path = if single_file {
                args.output.clone()
            } else {
                args.output.join(t.file_name())
            };
            (path, text)
        })
        .collect();
    if !args.force {
        for (path, _) in &paths {
            if path.symlink_metadata().is_ok() {
                anyhow::bail!(
                    "{} already exists, use --force to overwrite",
                    path.display()
                );
            }
        }
    }
    if !single_file {
        std::fs::create_dir_all(&args.output)
            .with_context(|| format!("cannot create {}", args.output.display()))?;
    }
    for (path, text) in &paths {
        write_private(path, text, true)?;
        writeln!(out, "created {}", path.display())?;
    }
    Ok(())
}

/// The talosconfig: one context named after the cluster, with the OS CA and an os:admin
/// client certificate valid for [`CLIENT_CERT_TTL`].
fn talosconfig(args: &ConfigArgs, bundle: &Bundle) -> anyhow::Result<String> {
    let client = bundle.client_certificate(
        &["os:admin".to_string()],
        SystemTime::now(),
        CLIENT_CERT_TTL,
    )?;
    let ca = bundle.os_ca_crt();
    let endpoints = if args.endpoints.is_empty() {
        vec!["127.0.0.1".to_string()]
    } else {
        args.endpoints.clone()
    };
    let mut config = TalosConfig {
        context: Some(args.cluster_name.clone()),
        ..TalosConfig::default()
    };
    config.contexts.insert(
        args.cluster_name.clone(),
        Context {
            endpoints,
            ca,
            crt: client.crt,
            key: client.key,
            ..Context::default()
        },
    );
    Ok(serde_yaml_ng::to_string(&config)?)
}
