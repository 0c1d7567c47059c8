//! The sources of the Config controllers (machine configuration, kernel command line, links)
//! and the rule for a configuration that does not decode.
//!
//! # An invalid configuration changes nothing
//!
//! apid does not accept an invalid MachineConfig, but networkd does not rely on it: a
//! configuration whose network settings do not all parse is never half-applied. Each Config
//! controller keeps the last configuration that was valid in memory and goes on deriving its
//! candidates from it (the command line and the links may still change); after a restart with
//! no valid configuration seen yet, it re-asserts the candidates it already has in stated,
//! unchanged. Either way the problems are logged once, with their paths, at `error` level.

use std::sync::Arc;

use cosi::runtime::{Context, Input, ReconcileError};
use cosi::{Phase, Resource, ResourceSpec};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE as CONFIG_NS};
use machinery::resources::network::{LinkStatus, LinkStatusSpec, NAMESPACE};
use machinery::resources::runtime::{KernelCmdlineSpec, CMDLINE_ID, NAMESPACE as RUNTIME_NS};

use super::cmdline::CmdlineNetwork;
use super::machine_network::MachineNetwork;

/// The machine configuration as a Config controller may use it.
#[derive(Debug, Clone)]
pub enum Machine {
    /// There is no machine configuration (yet): only command line and defaults apply.
    Absent,
    /// The configuration to derive candidates from (the current one, or the last valid one
    /// when the current one is invalid).
    Valid(Arc<MachineNetwork>),
    /// The current configuration is invalid and no valid one was seen since start: keep the
    /// existing candidates as they are.
    Keep,
}

/// A machine configuration parsed once for every controller of networkd.
#[derive(Debug)]
pub struct Parsed {
    /// The document, or why it does not decode.
    pub config: Result<machinery::config::Config, Vec<String>>,
    /// Its network settings, or every problem with them.
    pub network: Result<Arc<MachineNetwork>, Vec<String>>,
}

/// The configuration `yaml` parsed. The last one parsed is kept for the whole process: the
/// Config controllers (seven), StatusController and NodeAddressController all read the same
/// configuration, and parsing a large one (thousands of addresses and routes) once each was
/// most of networkd's work when it changed.
pub fn parsed(yaml: &str) -> Arc<Parsed> {
    static LAST: std::sync::Mutex<Option<(String, Arc<Parsed>)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((text, p)) = last.as_ref() {
        if text == yaml {
            return p.clone();
        }
    }
    let config = machinery::config::Config::from_yaml(yaml)
        .map_err(|e| e.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>());
    let network = match &config {
        Ok(c) => MachineNetwork::from_config(c).map(Arc::new),
        Err(problems) => Err(problems.clone()),
    };
    let p = Arc::new(Parsed { config, network });
    *last = Some((yaml.to_string(), p.clone()));
    p
}

/// Remembers the last valid configuration and the problems already reported.
#[derive(Debug, Default)]
pub struct Sources {
    last_good: Option<(String, Arc<MachineNetwork>)>,
    reported: Option<String>,
    cmdline_reported: Option<String>,
}

/// Inputs every Config controller declares.
pub fn inputs() -> Vec<Input> {
    vec![
        Input::weak::<MachineConfigSpec>(CONFIG_NS).with_id(ACTIVE_ID),
        Input::weak::<KernelCmdlineSpec>(RUNTIME_NS).with_id(CMDLINE_ID),
        Input::weak::<LinkStatusSpec>(NAMESPACE),
    ]
}

impl Sources {
    /// Reads and decodes the machine configuration.
    ///
    /// # Errors
    ///
    /// State errors only; an invalid configuration is [`Machine::Valid`] (last good) or
    /// [`Machine::Keep`].
    pub async fn machine(&mut self, ctx: &Context) -> Result<Machine, ReconcileError> {
        let Some(mc) = ctx.get::<MachineConfigSpec>(CONFIG_NS, ACTIVE_ID).await? else {
            self.reported = None;
            return Ok(Machine::Absent);
        };
        let text = &mc.spec.0;
        if let Some((last_text, last)) = &self.last_good {
            if last_text == text {
                return Ok(Machine::Valid(last.clone()));
            }
        }
        match parsed(text).network.clone() {
            Ok(m) => {
                // What of it is not applied is reported (once, as a warning, and in the
                // network Status) by the StatusController.
                self.last_good = Some((text.clone(), m.clone()));
                self.reported = None;
                Ok(Machine::Valid(m))
            }
            Err(problems) => {
                let report = problems.join("; ");
                if self.reported.as_deref() != Some(report.as_str()) {
                    tracing::error!(
                        version = mc.metadata.version,
                        problems = %report,
                        keeping = if self.last_good.is_some() { "last valid configuration" } else { "current network specs" },
                        "machine configuration rejected: its network settings are invalid; nothing of it is applied"
                    );
                    self.reported = Some(report);
                }
                Ok(match &self.last_good {
                    Some((_, last)) => Machine::Valid(last.clone()),
                    None => Machine::Keep,
                })
            }
        }
    }

    /// Reads and parses the kernel command line; a malformed one counts as empty (reported
    /// once).
    ///
    /// # Errors
    ///
    /// State errors.
    pub async fn cmdline(&mut self, ctx: &Context) -> Result<CmdlineNetwork, ReconcileError> {
        let Some(kc) = ctx.get::<KernelCmdlineSpec>(RUNTIME_NS, CMDLINE_ID).await? else {
            return Ok(CmdlineNetwork::default());
        };
        match CmdlineNetwork::parse(&kc.spec.cmdline) {
            Ok(c) => {
                self.cmdline_reported = None;
                Ok(c)
            }
            Err(problems) => {
                let report = problems.join("; ");
                if self.cmdline_reported.as_deref() != Some(report.as_str()) {
                    tracing::error!(problems = %report, "kernel command line network settings ignored");
                    self.cmdline_reported = Some(report);
                }
                Ok(CmdlineNetwork::default())
            }
        }
    }
}

/// The links of the node, sorted by name.
///
/// # Errors
///
/// State errors.
pub async fn links(ctx: &Context) -> Result<Vec<LinkStatus>, ReconcileError> {
    Ok(ctx
        .list::<LinkStatusSpec>(NAMESPACE)
        .await?
        .into_iter()
        .filter(|l| l.metadata.phase == Phase::Running)
        .collect())
}

/// Re-asserts, unchanged, every running resource of `S` in `namespace` that this controller
/// owns (so that the runtime tears none of them down).
///
/// # Errors
///
/// State errors.
pub async fn keep_outputs<S: ResourceSpec>(
    ctx: &mut Context,
    namespace: &str,
) -> Result<(), ReconcileError> {
    let mine: Vec<Resource<S>> = ctx
        .list::<S>(namespace)
        .await?
        .into_iter()
        .filter(|r| r.metadata.owner == ctx.name() && r.metadata.phase == Phase::Running)
        .collect();
    for r in mine {
        let id = r.id().to_string();
        let mut keep = Resource::new(namespace, id, r.spec);
        keep.metadata.labels = r.metadata.labels;
        keep.metadata.annotations = r.metadata.annotations;
        ctx.apply(keep).await?;
    }
    Ok(())
}

/// A value derived from the active machine configuration, derived again only when the
/// configuration changes (another version or another resource): a controller that wakes on
/// every status change (thousands during a burst) must not parse a large configuration each
/// time, which was most of what StatusController and NodeAddressController spent.
#[derive(Debug, Default)]
pub struct FromConfig<T> {
    /// (version, creation time) of the configuration `value` was derived from.
    seen: Option<(u64, Option<std::time::SystemTime>)>,
    value: T,
}

impl<T: Default> FromConfig<T> {
    /// The value for the current configuration: `derive(yaml, previous)` when it changed,
    /// `T::default()` when there is none.
    ///
    /// # Errors
    ///
    /// State errors; a configuration resource whose spec does not decode.
    pub async fn get(
        &mut self,
        ctx: &Context,
        derive: impl FnOnce(&str, &T) -> T,
    ) -> Result<&T, ReconcileError> {
        match ctx
            .get_raw(CONFIG_NS, MachineConfigSpec::TYPE, ACTIVE_ID)
            .await?
        {
            None => {
                self.seen = None;
                self.value = T::default();
            }
            Some(raw) => {
                let key = (raw.metadata.version, raw.metadata.created);
                if self.seen != Some(key) {
                    let mc = Resource::<MachineConfigSpec>::from_raw(&raw)?;
                    self.value = derive(&mc.spec.0, &self.value);
                    self.seen = Some(key);
                }
            }
        }
        Ok(&self.value)
    }
}
