//! The machine configuration as secretsd's root controllers read it (the full one, from the
//! sensitive `config` namespace: secretsd is one of the two daemons that may), and the rule for
//! a configuration that does not decode.
//!
//! # An invalid configuration changes nothing
//!
//! apid writes only validated configurations, but secretsd does not rely on it: a root
//! controller whose configuration does not decode (or lacks a part it needs) keeps deriving from
//! the last configuration that did, and after a restart with none seen yet, re-asserts the
//! outputs it already has in stated, unchanged. Either way the problem is logged once.

use std::sync::Arc;

use base64::Engine as _;
use cosi::runtime::{Context, Input, ReconcileError};
use cosi::{Resource, ResourceSpec};
use machinery::config::Config;
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, NAMESPACE as CONFIG_NS};
use machinery::resources::secrets::{CertificateAndKey, CertificatePem, KeyPem, NAMESPACE};

/// The machine configuration as a root controller may use it.
#[derive(Debug, Clone)]
pub enum Machine {
    /// There is no machine configuration: no root secrets.
    Absent,
    /// The configuration to derive from (the current one, or the last valid one).
    Valid(Arc<Config>),
    /// The current configuration is invalid and no valid one was seen since start: keep the
    /// existing outputs as they are.
    Keep,
}

/// Remembers the last valid configuration and the problem already reported.
#[derive(Debug, Default)]
pub struct Source {
    last_good: Option<(String, Arc<Config>)>,
    reported: Option<String>,
}

/// The input every root controller declares.
pub fn input() -> Input {
    Input::weak::<MachineConfigSpec>(CONFIG_NS).with_id(ACTIVE_ID)
}

impl Source {
    /// Reads and decodes the active machine configuration.
    ///
    /// # Errors
    ///
    /// State errors only.
    pub async fn machine(&mut self, ctx: &Context) -> Result<Machine, ReconcileError> {
        let Some(mc) = ctx.get::<MachineConfigSpec>(CONFIG_NS, ACTIVE_ID).await? else {
            self.reported = None;
            return Ok(Machine::Absent);
        };
        let text = mc.spec.0;
        if let Some((last_text, last)) = &self.last_good {
            if *last_text == text {
                return Ok(Machine::Valid(last.clone()));
            }
        }
        match Config::from_yaml(&text) {
            Ok(config) => {
                let config = Arc::new(config);
                self.last_good = Some((text, config.clone()));
                self.reported = None;
                Ok(Machine::Valid(config))
            }
            Err(errors) => {
                self.report(ctx.name(), &errors.to_string());
                Ok(match &self.last_good {
                    Some((_, last)) => Machine::Valid(last.clone()),
                    None => Machine::Keep,
                })
            }
        }
    }

    /// Logs `problem` once (until it changes or a configuration is good again).
    pub fn report(&mut self, controller: &str, problem: &str) {
        if self.reported.as_deref() != Some(problem) {
            tracing::error!(
                controller,
                problem,
                "machine configuration unusable for the root secrets; keeping the last ones"
            );
            self.reported = Some(problem.to_string());
        }
    }

    /// Forgets the reported problem (the configuration is usable again).
    pub fn clear(&mut self) {
        self.reported = None;
    }
}

/// Re-asserts every output of `S` this controller owns, unchanged.
///
/// # Errors
///
/// State errors.
pub async fn keep<S: ResourceSpec>(ctx: &mut Context) -> Result<(), ReconcileError> {
    let owner = ctx.name();
    let mine: Vec<Resource<S>> = ctx
        .list::<S>(NAMESPACE)
        .await?
        .into_iter()
        .filter(|r| r.metadata.owner == owner)
        .collect();
    for r in mine {
        ctx.apply(Resource::<S>::new_default(r.metadata.id, r.spec))
            .await?;
    }
    Ok(())
}

/// Decodes a base64 field of the configuration into its PEM text.
pub fn pem(field: &str, value: &str) -> Result<String, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| format!("{field} is not base64"))?;
    String::from_utf8(bytes).map_err(|_| format!("{field} is not PEM text"))
}

/// A `crt`/`key` pair of the configuration as PEM (the key empty when the config has none).
pub fn cert_and_key(
    field: &str,
    value: &machinery::config::v1alpha1::CertificateAndKey,
) -> Result<CertificateAndKey, String> {
    let crt = value
        .crt
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("{field}.crt is missing"))?;
    Ok(CertificateAndKey {
        crt: pem(&format!("{field}.crt"), crt)?,
        key: match value.key.as_deref().filter(|k| !k.is_empty()) {
            Some(k) => pem(&format!("{field}.key"), k)?,
            None => String::new(),
        },
    })
}

/// Accepted CAs of the configuration, as PEM.
pub fn accepted(
    field: &str,
    values: &[machinery::config::v1alpha1::Certificate],
) -> Result<Vec<CertificatePem>, String> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.crt.as_deref().map(|crt| (i, crt)))
        .map(|(i, crt)| {
            Ok(CertificatePem {
                crt: pem(&format!("{field}[{i}].crt"), crt)?,
            })
        })
        .collect()
}

/// A key of the configuration as PEM.
pub fn key(field: &str, value: &str) -> Result<KeyPem, String> {
    Ok(KeyPem {
        key: pem(field, value)?,
    })
}
