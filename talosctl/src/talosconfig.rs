//! The talosconfig file: contexts (endpoints, nodes, credentials) and the current one, as
//! upstream's, plus `localCluster`: the state directory of a local cluster, through which
//! talosctl reaches that cluster's nodes until apid exists.
//!
//! Which file: `--talosconfig`, then `$TALOSCONFIG`, then `$TALOS_HOME/config`, then
//! `~/.talos/config`. Fields talos-rs does not know are kept as they are when the file is
//! rewritten.
//!
//! ```yaml
//! context: demo
//! contexts:
//!     demo:
//!         endpoints: [10.5.0.2]
//!         nodes: [10.5.0.2]
//!         localCluster: /root/.talos/clusters/demo
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// One context.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Context {
    /// Where the API is reached (apid; for a local cluster, the control planes' addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// The default target nodes (`-n` overrides them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// The OS CA (base64 PEM); empty until apid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca: String,
    /// The client certificate (base64 PEM); empty until apid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub crt: String,
    /// The client key (base64 PEM); empty until apid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// talos-rs: the state directory of the local cluster this context belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_cluster: Option<PathBuf>,
    /// Fields talos-rs does not use (`auth`, `cluster`, `proxy-url`…), kept as they are.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_yaml_ng::Value>,
}

/// A talosconfig file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TalosConfig {
    /// The current context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Every context by name.
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
    /// Fields talos-rs does not use, kept.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_yaml_ng::Value>,
}

/// The talosconfig path: `explicit` (`--talosconfig` or `$TALOSCONFIG`), else
/// `$TALOS_HOME/config`, else `~/.talos/config`.
pub fn path(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(home) = std::env::var_os("TALOS_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home).join("config"));
    }
    Ok(talos_home()?.join("config"))
}

/// `~/.talos`.
pub fn talos_home() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("$HOME is not set: give --talosconfig and --state")?;
    Ok(PathBuf::from(home).join(".talos"))
}

impl TalosConfig {
    /// Reads a talosconfig; a missing file is an empty configuration.
    pub fn load(path: &Path) -> anyhow::Result<TalosConfig> {
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => Ok(TalosConfig::default()),
            Ok(text) => serde_yaml_ng::from_str(&text)
                .with_context(|| format!("{} is not a talosconfig", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TalosConfig::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes it atomically with mode 0600, creating the directory.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let text = serde_yaml_ng::to_string(self)?;
        crate::files::write_private(path, text.as_bytes())
    }

    /// Adds a context as `name`, or as `name-1`, `name-2`… when `name` is taken by another
    /// one (as `talosctl config merge`); a context of the same local cluster is replaced.
    /// Makes it the current context and returns the name used.
    pub fn merge(&mut self, name: &str, context: Context) -> String {
        let mut chosen = name.to_string();
        let mut i = 0;
        while let Some(existing) = self.contexts.get(&chosen) {
            if existing.local_cluster.is_some() && existing.local_cluster == context.local_cluster {
                break;
            }
            i += 1;
            chosen = format!("{name}-{i}");
        }
        self.contexts.insert(chosen.clone(), context);
        self.context = Some(chosen.clone());
        chosen
    }

    /// Removes a context; the current context moves to another one (or none).
    pub fn remove(&mut self, name: &str) -> bool {
        let removed = self.contexts.remove(name).is_some();
        if self.context.as_deref() == Some(name) {
            self.context = self.contexts.keys().next().cloned();
        }
        removed
    }

    /// The context `name`, or the current one.
    pub fn context(&self, name: Option<&str>) -> anyhow::Result<(&str, &Context)> {
        let name = match name.or(self.context.as_deref()) {
            Some(n) => n,
            None => anyhow::bail!("the talosconfig has no current context (give --context)"),
        };
        self.contexts
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
            .with_context(|| {
                format!(
                    "no context {name:?} in the talosconfig (contexts: {})",
                    self.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })
    }
}

/// `talosctl config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List the contexts of the talosconfig; `*` marks the current one.
    Contexts,
    /// Make a context the current one.
    Context {
        /// The context.
        name: String,
    },
    /// Show the current context.
    Info,
}

/// Runs a `config` subcommand on the talosconfig at `path`.
pub fn run(
    cmd: &Command,
    path: &Path,
    context: Option<&str>,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let mut config = TalosConfig::load(path)?;
    match cmd {
        Command::Contexts => {
            let mut rows = vec![vec![
                "CURRENT".to_string(),
                "NAME".to_string(),
                "ENDPOINTS".to_string(),
                "NODES".to_string(),
                "LOCAL CLUSTER".to_string(),
            ]];
            for (name, c) in &config.contexts {
                rows.push(vec![
                    if config.context.as_deref() == Some(name) {
                        "*"
                    } else {
                        ""
                    }
                    .to_string(),
                    name.clone(),
                    c.endpoints.join(","),
                    c.nodes.join(","),
                    c.local_cluster
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                ]);
            }
            crate::services::table(out, &rows)?;
        }
        Command::Context { name } => {
            if !config.contexts.contains_key(name) {
                anyhow::bail!("no context {name:?} in {}", path.display());
            }
            config.context = Some(name.clone());
            config.save(path)?;
            writeln!(out, "current context: {name}")?;
        }
        Command::Info => {
            let (name, c) = config.context(context)?;
            writeln!(out, "Current context:     {name}")?;
            writeln!(out, "Nodes:               {}", c.nodes.join(", "))?;
            writeln!(out, "Endpoints:           {}", c.endpoints.join(", "))?;
            if let Some(l) = &c.local_cluster {
                writeln!(out, "Local cluster:       {}", l.display())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_renames_clashes_and_replaces_the_same_cluster() {
        let mut c = TalosConfig::default();
        let a = Context {
            local_cluster: Some("/a".into()),
            ..Default::default()
        };
        let b = Context {
            local_cluster: Some("/b".into()),
            ..Default::default()
        };
        assert_eq!(c.merge("demo", a.clone()), "demo");
        assert_eq!(c.merge("demo", b), "demo-1");
        assert_eq!(c.merge("demo", a), "demo");
        assert_eq!(c.context.as_deref(), Some("demo"));
        assert!(c.remove("demo"));
        assert_eq!(c.context.as_deref(), Some("demo-1"));
    }

    #[test]
    fn unknown_fields_survive_a_rewrite() {
        let text = "context: x\ncontexts:\n  x:\n    endpoints: [1.2.3.4]\n    auth: {siderov1: {identity: me}}\n";
        let c: TalosConfig = serde_yaml_ng::from_str(text).unwrap();
        let again: TalosConfig =
            serde_yaml_ng::from_str(&serde_yaml_ng::to_string(&c).unwrap()).unwrap();
        assert_eq!(c, again);
        assert!(again.contexts["x"].other.contains_key("auth"));
    }
}
