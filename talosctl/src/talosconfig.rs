//! The talosconfig file: contexts (endpoints, nodes, credentials) and the current one, as
//! upstream's, plus `localCluster`: the state directory of a local cluster (`cluster show`,
//! `destroy` and the development `--socket` route use it).
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
use std::time::SystemTime;

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
    /// Set the endpoint(s) of the current context (`--context` another one).
    #[command(visible_alias = "endpoints")]
    Endpoint {
        /// The endpoints (`host` or `host:port`).
        #[arg(required = true)]
        endpoints: Vec<String>,
    },
    /// Set the node(s) of the current context (`--context` another one); none clears them.
    #[command(visible_alias = "nodes")]
    Node {
        /// The nodes.
        nodes: Vec<String>,
    },
    /// Make a context the current one.
    #[command(visible_alias = "use-context")]
    Context {
        /// The context.
        name: String,
    },
    /// Add a new context (replacing one of the same name) from certificate files.
    Add {
        /// The context's name.
        name: String,
        /// The path to the CA certificate (PEM).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// The path to the client certificate (PEM).
        #[arg(long)]
        crt: Option<PathBuf>,
        /// The path to the client key (PEM).
        #[arg(long)]
        key: Option<PathBuf>,
    },
    /// Remove the contexts matching a pattern (`*` matches anything); the current context is
    /// never removed.
    Remove {
        /// The context name or pattern.
        pattern: String,
        /// Do not ask for confirmation.
        #[arg(short = 'y', long)]
        noconfirm: bool,
        /// Say what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List the contexts of the talosconfig; `*` marks the current one.
    #[command(visible_alias = "get-contexts")]
    Contexts,
    /// Merge the contexts of another talosconfig into this one; a context whose name is
    /// taken is renamed `name-1`, `name-2`…; the other file's current context becomes current.
    Merge {
        /// The talosconfig to merge from.
        from: PathBuf,
    },
    /// Generate a new client configuration (a talosconfig with a new client certificate of the
    /// node's OS CA) through the Talos API: admin only, on a control plane.
    New(NewArgs),
    /// Show the current context: nodes, endpoints, the certificate's roles and expiry.
    Info {
        /// Output format: text, json or yaml.
        #[arg(short = 'o', long, default_value = "text")]
        output: String,
    },
}

/// `talosctl config new`.
#[derive(Debug, Clone, clap::Args)]
pub struct NewArgs {
    /// Where to write it (it must not exist).
    #[arg(default_value = "talosconfig")]
    pub path: PathBuf,
    /// The roles of the certificate (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "os:admin")]
    pub roles: Vec<String>,
    /// The certificate's validity (e.g. 8760h, 30m).
    #[arg(long, default_value = "87600h", value_parser = crate::apply::parse_duration)]
    pub crt_ttl: std::time::Duration,
}

/// Whether `name` matches `pattern`, where `*` stands for any text (upstream's go-glob: no
/// other wildcard). Hand-written: ten lines, and the `glob` crates' syntax (`?`, `[...]`) is
/// not upstream's.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name.ends_with(last) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// go-humanize's `RelTime(then, now, "ago", "from now")`, as `config info` prints expiry.
pub fn rel_time(then: SystemTime, now: SystemTime) -> String {
    const S: u64 = 1;
    const MIN: u64 = 60;
    const H: u64 = 3600;
    const DAY: u64 = 24 * H;
    const WEEK: u64 = 7 * DAY;
    const MONTH: u64 = 30 * DAY;
    const YEAR: u64 = 12 * MONTH;
    // (below this, format, divide by); a divisor of 0 prints no number.
    const MAGNITUDES: &[(u64, &str, u64)] = &[
        (S, "now", 0),
        (2 * S, "1 second", 0),
        (MIN, "seconds", S),
        (2 * MIN, "1 minute", 0),
        (H, "minutes", MIN),
        (2 * H, "1 hour", 0),
        (DAY, "hours", H),
        (2 * DAY, "1 day", 0),
        (WEEK, "days", DAY),
        (2 * WEEK, "1 week", 0),
        (MONTH, "weeks", WEEK),
        (2 * MONTH, "1 month", 0),
        (YEAR, "months", MONTH),
        (18 * MONTH, "1 year", 0),
        (2 * YEAR, "2 years", 0),
        (37 * YEAR, "years", YEAR),
        (u64::MAX, "a long while", 0),
    ];
    let (diff, label) = match then.duration_since(now) {
        Ok(d) => (d.as_secs(), "from now"),
        Err(e) => (e.duration().as_secs(), "ago"),
    };
    let (_, text, div) = MAGNITUDES
        .iter()
        .find(|(below, _, _)| diff < *below)
        .copied()
        .unwrap_or((0, "a long while", 0));
    match (text, div) {
        ("now", _) => "now".to_string(),
        (t, 0) => format!("{t} {label}"),
        (t, d) => format!("{} {t} {label}", diff / d),
    }
}

/// What `config info` shows (upstream's field names in json and yaml).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Info {
    context: String,
    nodes: Vec<String>,
    endpoints: Vec<String>,
    roles: Vec<String>,
    #[serde(rename = "certTTL")]
    cert_ttl: String,
    cert_not_after: String,
}

fn info(name: &str, c: &Context, now: SystemTime) -> anyhow::Result<Info> {
    let mut out = Info {
        context: name.to_string(),
        nodes: c.nodes.clone(),
        endpoints: c.endpoints.clone(),
        roles: Vec::new(),
        cert_ttl: String::new(),
        cert_not_after: String::new(),
    };
    if !c.crt.trim().is_empty() {
        use base64::Engine as _;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(c.crt.trim())
            .with_context(|| format!("context {name:?}: crt is not base64"))?;
        let crt = machinery::secrets::x509::Certificate::from_pem(&pem)
            .and_then(|c| c.info())
            .with_context(|| format!("context {name:?}: crt"))?;
        let mut roles: Vec<String> = crt
            .organizations
            .into_iter()
            .filter(|o| machinery::resources::apid::KNOWN_ROLES.contains(&o.as_str()))
            .collect();
        roles.sort();
        roles.dedup();
        out.roles = roles;
        out.cert_ttl = rel_time(crt.not_after, now);
        out.cert_not_after = crate::output::rfc3339(crt.not_after)
            .chars()
            .take(10)
            .collect();
    }
    Ok(out)
}

fn read_b64(what: &str, path: &Path) -> anyhow::Result<String> {
    use base64::Engine as _;
    let bytes = std::fs::read(path).with_context(|| format!("error reading {what}"))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Asks on stderr, reads the answer from stdin: yes only for `y` or `yes`.
fn confirm(prompt: &str) -> bool {
    eprint!("{prompt} [y/N]: ");
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

impl TalosConfig {
    /// Merges another talosconfig in as upstream's `Config.Merge`: a context whose name is
    /// taken becomes `name-1`, `name-2`…; the other's current context becomes current. Returns
    /// the renames.
    pub fn merge_config(&mut self, other: TalosConfig) -> Vec<(String, String)> {
        let mut renames = Vec::new();
        let mut mapped = BTreeMap::new();
        for (name, ctx) in other.contexts {
            let mut chosen = name.clone();
            let mut i = 0;
            while self.contexts.contains_key(&chosen) {
                i += 1;
                chosen = format!("{name}-{i}");
            }
            if chosen != name {
                renames.push((name.clone(), chosen.clone()));
            }
            mapped.insert(name, chosen.clone());
            self.contexts.insert(chosen, ctx);
        }
        if let Some(current) = other.context.filter(|c| !c.is_empty()) {
            self.context = mapped.get(&current).cloned();
        }
        renames
    }

    /// The context `name` (or the current one), to change.
    fn context_mut(&mut self, name: Option<&str>) -> anyhow::Result<&mut Context> {
        let name = self.context(name)?.0.to_string();
        self.contexts
            .get_mut(&name)
            .context("the context vanished (a bug)")
    }
}

/// Runs a `config` subcommand on the talosconfig at `path` (`config new` is [`new`]).
pub fn run(
    cmd: &Command,
    path: &Path,
    context: Option<&str>,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let mut config = TalosConfig::load(path)?;
    match cmd {
        Command::Endpoint { endpoints } => {
            config.context_mut(context)?.endpoints =
                endpoints.iter().map(|e| e.trim().to_string()).collect();
            config.save(path)?;
        }
        Command::Node { nodes } => {
            config.context_mut(context)?.nodes =
                nodes.iter().map(|e| e.trim().to_string()).collect();
            config.save(path)?;
        }
        Command::Add { name, ca, crt, key } => {
            let mut c = Context::default();
            if let Some(ca) = ca {
                c.ca = read_b64("CA", ca)?;
            }
            match (crt, key) {
                (Some(crt), Some(key)) => {
                    c.crt = read_b64("certificate", crt)?;
                    c.key = read_b64("key", key)?;
                }
                (None, None) => {}
                _ => anyhow::bail!(
                    "if either the 'crt' or 'key' flag is specified, both are required"
                ),
            }
            config.contexts.insert(name.clone(), c);
            config.save(path)?;
        }
        Command::Remove {
            pattern,
            noconfirm,
            dry_run,
        } => {
            if pattern.is_empty() {
                anyhow::bail!("no context specified");
            }
            if config.contexts.is_empty() {
                anyhow::bail!("no contexts defined");
            }
            let matches: Vec<String> = config
                .contexts
                .keys()
                .filter(|n| glob(pattern, n))
                .cloned()
                .collect();
            if matches.is_empty() {
                anyhow::bail!("no contexts matched {pattern:?}");
            }
            let mut changed = false;
            for m in matches {
                if config.context.as_deref() == Some(m.as_str()) {
                    eprintln!(
                        "skipping removal of current context {m:?}, please change it to another before removing"
                    );
                    continue;
                }
                if *noconfirm {
                    eprintln!("removing context {m:?}");
                } else if !confirm(&format!("remove context {m:?}?")) {
                    continue;
                }
                config.contexts.remove(&m);
                changed = true;
            }
            if changed && !dry_run {
                config.save(path)?;
            }
        }
        Command::Merge { from } => {
            if !from.exists() {
                anyhow::bail!("error reading config: {} does not exist", from.display());
            }
            let other = TalosConfig::load(from)?;
            for (a, b) in config.merge_config(other) {
                eprintln!("renamed talosconfig context {a:?} -> {b:?}");
            }
            config.save(path)?;
        }
        Command::New(_) => anyhow::bail!("config new talks to a node (a bug: see new())"),
        Command::Contexts => {
            let mut rows = vec![vec![
                "CURRENT".to_string(),
                "NAME".to_string(),
                "ENDPOINTS".to_string(),
                "NODES".to_string(),
                "LOCAL CLUSTER".to_string(),
            ]];
            for (name, c) in &config.contexts {
                let nodes = if c.nodes.len() > 3 {
                    format!("{}...", c.nodes[..3].join(","))
                } else {
                    c.nodes.join(",")
                };
                rows.push(vec![
                    if config.context.as_deref() == Some(name) {
                        "*"
                    } else {
                        ""
                    }
                    .to_string(),
                    name.clone(),
                    c.endpoints.join(","),
                    nodes,
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
                anyhow::bail!("context {name:?} is not defined in {}", path.display());
            }
            config.context = Some(name.clone());
            config.save(path)?;
            writeln!(out, "current context: {name}")?;
        }
        Command::Info { output } => {
            let (name, c) = config.context(context)?;
            let i = info(name, c, SystemTime::now())?;
            match output.as_str() {
                "text" => {
                    let list = |v: &[String]| {
                        if v.is_empty() {
                            "not defined".to_string()
                        } else {
                            v.join(", ")
                        }
                    };
                    writeln!(out, "Current context:     {}", i.context)?;
                    writeln!(out, "Nodes:               {}", list(&i.nodes))?;
                    writeln!(out, "Endpoints:           {}", list(&i.endpoints))?;
                    if !i.roles.is_empty() {
                        writeln!(out, "Roles:               {}", i.roles.join(", "))?;
                    }
                    if !i.cert_ttl.is_empty() {
                        writeln!(
                            out,
                            "Certificate expires: {} ({})",
                            i.cert_ttl, i.cert_not_after
                        )?;
                    }
                    if let Some(l) = &c.local_cluster {
                        writeln!(out, "Local cluster:       {}", l.display())?;
                    }
                }
                "json" => writeln!(out, "{}", serde_json::to_string_pretty(&i)?)?,
                "yaml" => write!(out, "{}", serde_yaml_ng::to_string(&i)?)?,
                other => anyhow::bail!("unknown output format: {other:?}"),
            }
        }
    }
    Ok(())
}

/// `talosctl config new`: GenerateClientConfiguration on one node; the talosconfig it returns
/// gets `endpoints` (those of the command line or the context, so that it is usable at once)
/// and is written to a new file.
pub async fn new(
    api: &crate::api::Api,
    args: &NewArgs,
    endpoints: Vec<String>,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    use proto::machine::machine_service_client::MachineServiceClient;
    if api.nodes.len() > 1 {
        anyhow::bail!("command \"talosconfig\" is not supported with multiple nodes");
    }
    let unknown: Vec<&str> = args
        .roles
        .iter()
        .map(|r| r.trim())
        .filter(|r| !r.is_empty() && !machinery::resources::apid::KNOWN_ROLES.contains(r))
        .collect();
    if !unknown.is_empty() {
        anyhow::bail!("unknown roles: {}", unknown.join(", "));
    }
    if args.path.exists() {
        anyhow::bail!(
            "talosconfig file already exists: {:?}",
            args.path.display().to_string()
        );
    }
    let ttl = prost_types::Duration {
        seconds: i64::try_from(args.crt_ttl.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(args.crt_ttl.subsec_nanos()).unwrap_or(0),
    };
    let reply = MachineServiceClient::new(api.channel()?)
        .generate_client_configuration(api.for_nodes(
            proto::machine::GenerateClientConfigurationRequest {
                roles: args.roles.clone(),
                crt_ttl: Some(ttl),
            },
        )?)
        .await
        .map_err(|s| crate::api::explain(api, &s))?
        .into_inner();
    let [message] = reply.messages.as_slice() else {
        anyhow::bail!("expected 1 message, got {}", reply.messages.len());
    };
    if let Some(meta) = message.metadata.as_ref().filter(|m| !m.error.is_empty()) {
        anyhow::bail!(
            "{}",
            crate::api::node_error(&meta.hostname, meta.status.as_ref(), &meta.error)
        );
    }
    let text =
        std::str::from_utf8(&message.talosconfig).context("the node's talosconfig is not UTF-8")?;
    let mut config: TalosConfig =
        serde_yaml_ng::from_str(text).context("the node's talosconfig does not parse")?;
    let name = config
        .context
        .clone()
        .context("the node's talosconfig has no current context")?;
    if let Some(c) = config.contexts.get_mut(&name) {
        c.endpoints = endpoints;
    }
    config.save(&args.path)?;
    writeln!(out, "wrote {} (context {name})", args.path.display())?;
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
    fn merge_config_renames_as_upstream() {
        let mut c = TalosConfig::default();
        c.contexts.insert("a".into(), Context::default());
        c.contexts.insert("a-1".into(), Context::default());
        c.context = Some("a".into());
        let mut other = TalosConfig::default();
        other.contexts.insert("a".into(), Context::default());
        other.contexts.insert("b".into(), Context::default());
        other.context = Some("a".into());
        let renames = c.merge_config(other);
        assert_eq!(renames, vec![("a".to_string(), "a-2".to_string())]);
        assert_eq!(c.context.as_deref(), Some("a-2"));
        assert_eq!(c.contexts.len(), 4);
    }

    #[test]
    fn glob_is_star_only() {
        assert!(glob("demo*", "demo-1"));
        assert!(glob("*-1", "demo-1"));
        assert!(glob("d*m*1", "demo-1"));
        assert!(glob("*", ""));
        assert!(!glob("demo", "demo-1"));
        assert!(!glob("d?mo", "demo"));
        assert!(!glob("ab*ba", "aba"));
    }

    #[test]
    fn rel_time_reads_as_go_humanize() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        let at = |s: u64| now + std::time::Duration::from_secs(s);
        assert_eq!(rel_time(now, now), "now");
        assert_eq!(rel_time(at(1), now), "1 second from now");
        assert_eq!(rel_time(at(90), now), "1 minute from now");
        assert_eq!(rel_time(at(3 * 3600), now), "3 hours from now");
        assert_eq!(rel_time(at(87_600 * 3600), now), "10 years from now");
        assert_eq!(
            rel_time(now - std::time::Duration::from_secs(3 * 86_400), now),
            "3 days ago"
        );
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
