//! Applying a machine configuration: init is the node's config writer (apid hands it
//! `machine.ApplyConfiguration`; root's talosctl calls it on the control socket). init reads the
//! full configuration (it is admin in stated) so that the secrets never pass through apid:
//! a client that read the redacted copy sends `******` back where a secret was, and the node's
//! own value is kept there ([`machinery::config::apply::restore_redacted`]); the diff it gets
//! back is of the redacted forms.
//!
//! Modes, as upstream since 1.14 (every section of the configuration is reconciled live here):
//! AUTO and NO_REBOOT write `config/MachineConfigs/v1alpha1`; STAGED writes
//! `config/MachineConfigs/staged`, made active by the next boot; TRY writes the active
//! configuration and keeps the one it replaced as `config/MachineConfigs/rollback`, written back
//! when the timeout passes (or at the next boot, if the node went down first) unless another
//! apply came first. REBOOT (deprecated upstream) is refused. Writes are compare-and-set on the
//! version read; one apply at a time.

use std::sync::Arc;
use std::time::Duration;

use cosi::{Resource, ResourceSpec as _};
use machinery::config::apply::{redacted_diff, restore_redacted};
use machinery::config::{Config, ConfigErrors, ValidationMode};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE};
use machinery::resources::runtime::{MachineStage, MachineStatusSpec};
use proto::init::{ApplyRequest, ApplyResponse};
use tokio::sync::{watch, Mutex};
use tonic::Status;

/// The ID of a configuration staged for the next boot.
pub const STAGED_ID: &str = "staged";
/// The ID of the configuration a TRY replaced, written back when the try ends.
pub const ROLLBACK_ID: &str = "rollback";
/// How long a TRY lasts when the request does not say (upstream's default).
pub const DEFAULT_TRY: Duration = Duration::from_secs(60);
/// The longest TRY accepted.
pub const MAX_TRY: Duration = Duration::from_secs(24 * 3600);

/// `machine.ApplyConfigurationRequest.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Deprecated upstream, refused.
    Reboot = 0,
    /// NO_REBOOT here: everything is applied live.
    Auto = 1,
    /// Made active now.
    NoReboot = 2,
    /// Kept for the next boot.
    Staged = 3,
    /// Active until the timeout, then the previous configuration again.
    Try = 4,
}

impl Mode {
    fn from_wire(mode: i32) -> Result<Mode, Status> {
        Ok(match mode {
            0 => Mode::Reboot,
            1 => Mode::Auto,
            2 => Mode::NoReboot,
            3 => Mode::Staged,
            4 => Mode::Try,
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown apply mode {other} (auto=1, no-reboot=2, staged=3, try=4)"
                )))
            }
        })
    }
}

/// The config writer.
pub struct Applier {
    client: cosi::Client,
    mode: ValidationMode,
    /// Held for the whole of an apply (and of a rollback): one at a time.
    busy: Mutex<()>,
    /// The pending rollback of a TRY.
    timer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The machine's stage: Maintenance becomes Running once a configuration is applied.
    machine: watch::Sender<MachineStatusSpec>,
}

fn unavailable(e: &cosi::StateError) -> Status {
    Status::unavailable(format!("stated is not answering init: {e}"))
}

fn listed(errors: &ConfigErrors) -> String {
    errors
        .errors()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  * ")
}

fn details(mode: Mode, timeout: Duration) -> String {
    match mode {
        Mode::Staged => "Staged configuration to be applied after the next reboot".into(),
        Mode::Try => format!(
            "Applied configuration without a reboot\nThe config is applied in 'try' mode and \
             will be automatically reverted back in {}",
            humantime(timeout)
        ),
        _ => "Applied configuration without a reboot".into(),
    }
}

/// Go's `Duration.String()`, to the second (`1m0s`, `30s`, `1h0m0s`; `500ms` below one).
fn humantime(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

impl Applier {
    /// The writer over stated, validating for `mode`; it ends the `machine`'s maintenance
    /// stage when it writes the node's first configuration.
    pub fn new(
        client: cosi::Client,
        mode: ValidationMode,
        machine: watch::Sender<MachineStatusSpec>,
    ) -> Arc<Self> {
        Arc::new(Applier {
            client,
            mode,
            busy: Mutex::new(()),
            timer: std::sync::Mutex::new(None),
            machine,
        })
    }

    /// Holds the config writer's lock: no configuration is written until the guard is dropped
    /// (STATE taking over stated's directory).
    pub async fn hold(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.busy.lock().await
    }

    /// The end of the boot: Running with a configuration, else Maintenance (decided under the
    /// apply lock, so that an apply cannot slip between the check and the stage). A stated that
    /// does not answer counts as configured: the maintenance API is never opened on a doubt.
    pub async fn settle(&self) {
        let _busy = self.busy.lock().await;
        let configured = self.read(ACTIVE_ID).await.map_or(true, |c| c.is_some());
        self.machine.send_modify(|m| {
            if m.stage == MachineStage::Booting {
                m.stage = if configured {
                    MachineStage::Running
                } else {
                    tracing::info!("no machine configuration: maintenance mode");
                    MachineStage::Maintenance
                };
            }
        });
    }

    async fn read(&self, id: &str) -> Result<Option<Resource<MachineConfigSpec>>, Status> {
        match self
            .client
            .get_typed::<MachineConfigSpec>(NAMESPACE, id)
            .await
        {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Writes `text` as `id`: an update of `current` (compare-and-set on its version) or a
    /// create. Returns the version stored.
    async fn write(
        &self,
        id: &str,
        current: Option<Resource<MachineConfigSpec>>,
        text: String,
    ) -> Result<u64, Status> {
        let result = match current {
            Some(mut r) => {
                r.spec = MachineConfigSpec(text);
                let raw = r.to_raw().map_err(|e| Status::internal(e.to_string()))?;
                self.client.update(&raw, &raw.metadata.owner, None).await
            }
            None => {
                let raw = Resource::new(NAMESPACE, id, MachineConfigSpec(text))
                    .to_raw()
                    .map_err(|e| Status::internal(e.to_string()))?;
                self.client.create(&raw, "").await
            }
        };
        let result = result.map(|stored| stored.metadata.version);
        result.map_err(|e| {
            if e.is_conflict() {
                Status::aborted(format!(
                    "the machine configuration {id:?} changed while it was being applied; \
                     nothing was written: apply again"
                ))
            } else {
                unavailable(&e)
            }
        })
    }

    async fn remove(&self, id: &str) -> Result<(), Status> {
        match self
            .client
            .destroy(NAMESPACE, MachineConfigSpec::TYPE, id, "")
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(unavailable(&e)),
        }
    }

    fn cancel_try(&self) {
        if let Some(t) = self.timer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }

    /// Validates and applies one request.
    pub async fn apply(self: &Arc<Self>, req: ApplyRequest) -> Result<ApplyResponse, Status> {
        let mut mode = Mode::from_wire(req.mode)?;
        if mode == Mode::Reboot && req.maintenance {
            // Upstream, in maintenance: as no-reboot.
            mode = Mode::NoReboot;
        }
        if mode == Mode::Reboot {
            return Err(Status::unimplemented(
                "apply mode REBOOT is not supported (as upstream since 1.14): every change is \
                 applied without a reboot; use auto, no-reboot, staged or try",
            ));
        }
        let timeout = match req.try_timeout_ms {
            0 => DEFAULT_TRY,
            ms => Duration::from_millis(ms),
        };
        if mode == Mode::Try && timeout > MAX_TRY {
            return Err(Status::invalid_argument(format!(
                "try mode timeout {} is longer than {}",
                humantime(timeout),
                humantime(MAX_TRY)
            )));
        }
        let Ok(_busy) = self.busy.try_lock() else {
            return Err(Status::failed_precondition(
                "another apply configuration is already in progress",
            ));
        };
        let text = String::from_utf8(req.data)
            .map_err(|_| Status::invalid_argument("the machine configuration is not UTF-8 text"))?;
        let current = self.read(ACTIVE_ID).await?;
        if req.expected_version != 0 {
            // The client changed the configuration it read: one applied since then would be
            // undone without a word. Refused as a COSI Update's version conflict is.
            let now = current.as_ref().map(|r| r.metadata.version);
            if now != Some(req.expected_version) {
                return Err(Status::failed_precondition(format!(
                    "the machine configuration changed since it was read: the change was made \
                     on version {}, the node has {}; nothing was written (read it again and \
                     apply the change to that)",
                    req.expected_version,
                    now.map_or_else(|| "none".to_string(), |v| format!("version {v}"))
                )));
            }
        }
        if req.maintenance && current.is_some() {
            return Err(Status::permission_denied(
                "the node has a machine configuration: the maintenance API is over, use a \
                 client certificate of the node's OS CA (talosconfig)",
            ));
        }
        if req.maintenance && matches!(mode, Mode::Staged | Mode::Try) {
            return Err(Status::invalid_argument(
                "in maintenance mode a configuration is applied with auto or no-reboot",
            ));
        }
        let current_text = current.as_ref().map(|r| r.spec.0.as_str());
        let text = match restore_redacted(&text, current_text) {
            Ok(Some(restored)) => restored,
            Ok(None) => text,
            Err(e) => return Err(Status::invalid_argument(e.to_string())),
        };
        let invalid = |e: &ConfigErrors| {
            Status::invalid_argument(format!(
                "the machine configuration is not valid for {} mode; nothing was written:\n  * {}",
                self.mode,
                listed(e)
            ))
        };
        let config = Config::from_yaml(&text).map_err(|e| invalid(&e))?;
        if config.v1alpha1.is_none() {
            return Err(Status::invalid_argument(
                "the machine configuration has no v1alpha1 document (machine, cluster): did you \
                 mean to patch the machine config instead?",
            ));
        }
        let warnings = config.validate(self.mode).map_err(|e| invalid(&e))?;
        let old = current_text.and_then(|t| Config::from_yaml(t).ok());
        let diff = redacted_diff(old.as_ref(), &config);
        let chosen = if mode == Mode::Auto {
            Mode::NoReboot
        } else {
            mode
        };
        let warnings: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        if req.dry_run {
            return Ok(ApplyResponse {
                warnings,
                mode: chosen as i32,
                mode_details: format!(
                    "Dry run summary:\n{} (skipped in dry-run).\n{diff}",
                    details(chosen, timeout)
                ),
            });
        }
        let unchanged = current_text == Some(text.as_str());
        let mut written = None;
        match chosen {
            Mode::Staged => {
                self.cancel_try();
                let staged = self.read(STAGED_ID).await?;
                let v = self.write(STAGED_ID, staged, text).await?;
                written = Some(v);
                self.remove(ROLLBACK_ID).await?;
            }
            Mode::Try => {
                if current.is_none() {
                    return Err(Status::failed_precondition(
                        "try mode needs a configuration to return to: the node has none",
                    ));
                }
                // A try during a try returns, in the end, to what was there before the first.
                let rollback = self.read(ROLLBACK_ID).await?;
                let keep = rollback.is_none();
                if let (Some(cur), true) = (current_text, keep) {
                    self.write(ROLLBACK_ID, None, cur.to_string()).await?;
                }
                if !unchanged {
                    match self.write(ACTIVE_ID, current, text).await {
                        Ok(v) => written = Some(v),
                        Err(e) => {
                            if keep {
                                let _ = self.remove(ROLLBACK_ID).await;
                            }
                            return Err(e);
                        }
                    }
                }
                self.cancel_try();
                let me = Arc::clone(self);
                let handle = tokio::spawn(async move {
                    tokio::time::sleep(timeout).await;
                    me.roll_back().await;
                });
                *self.timer.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
            }
            _ => {
                self.cancel_try();
                if !unchanged {
                    written = Some(self.write(ACTIVE_ID, current, text).await?);
                }
                self.remove(ROLLBACK_ID).await?;
                self.remove(STAGED_ID).await?;
                self.machine.send_if_modified(|m| {
                    let leave = m.stage == MachineStage::Maintenance;
                    if leave {
                        m.stage = MachineStage::Running;
                        tracing::info!("a machine configuration was applied: maintenance is over");
                    }
                    leave
                });
            }
        }
        tracing::info!(mode = ?chosen, version = ?written, "machine configuration applied");
        // Upstream's text, and which version was stored (what a client can wait for).
        let stored = match written {
            Some(v) if chosen == Mode::Staged => format!(" (staged MachineConfig version {v})"),
            Some(v) => format!(" (MachineConfig version {v})"),
            None => " (no changes)".to_string(),
        };
        let mut mode_details = details(chosen, timeout);
        match mode_details.split_once('\n') {
            Some((first, rest)) => mode_details = format!("{first}{stored}\n{rest}"),
            None => mode_details.push_str(&stored),
        }
        Ok(ApplyResponse {
            warnings,
            mode: chosen as i32,
            mode_details,
        })
    }

    /// The end of a TRY: the configuration it replaced is active again.
    async fn roll_back(&self) {
        let _busy = self.busy.lock().await;
        match self.restore(ROLLBACK_ID).await {
            Ok(true) => {
                tracing::info!("try mode ended: the previous machine configuration is back")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(error = %e.message(), "try mode ended but the previous machine configuration could not be restored")
            }
        }
    }

    /// Makes `id` the active configuration and removes it; whether there was one.
    async fn restore(&self, id: &str) -> Result<bool, Status> {
        let Some(saved) = self.read(id).await? else {
            return Ok(false);
        };
        let current = self.read(ACTIVE_ID).await?;
        if current.as_ref().map(|c| &c.spec) != Some(&saved.spec) {
            self.write(ACTIVE_ID, current, saved.spec.0).await?;
        }
        self.remove(id).await?;
        Ok(true)
    }

    /// At boot, before the daemons read the configuration: a TRY the node went down during is
    /// over (its previous configuration comes back), then a staged configuration becomes the
    /// active one.
    pub async fn boot(&self) {
        let _busy = self.busy.lock().await;
        for (id, what) in [
            (ROLLBACK_ID, "a try mode the node went down during is over"),
            (STAGED_ID, "the staged machine configuration is now active"),
        ] {
            match self.restore(id).await {
                Ok(true) => tracing::info!("{what}"),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(id, error = %e.message(), "cannot make the machine configuration active")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(humantime(Duration::from_secs(60)), "1m0s");
        assert_eq!(humantime(Duration::from_secs(30)), "30s");
        assert_eq!(humantime(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(humantime(Duration::from_millis(500)), "500ms");
    }

    #[test]
    fn modes_follow_the_wire() {
        assert_eq!(Mode::from_wire(3).unwrap(), Mode::Staged);
        assert_eq!(
            Mode::from_wire(9).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
