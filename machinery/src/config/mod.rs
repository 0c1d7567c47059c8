//! The v1alpha1 machine configuration: types of the whole schema, strict multi-document
//! decoding that reports every problem with its path, validation, and patches.
//!
//! ```
//! use machinery::config::{Config, ValidationMode};
//!
//! let err = Config::from_yaml("version: v1alpha1\nmachine:\n  network:\n    hostnme: x\n")
//!     .expect_err("unknown key");
//! assert_eq!(err.errors[0].path, "machine.network.hostnme");
//! ```
//!
//! A configuration is a YAML stream: the kind-less `v1alpha1` document ([`V1Alpha1`]) and typed
//! documents (`apiVersion`, `kind`, optional `name`) that are kept as [`RawDocument`]s.

#![warn(missing_docs)]

pub mod apply;
mod checks;
mod document;
mod error;
#[cfg(feature = "pki")]
pub mod generate;
mod patch;
mod redact;
mod strict;
mod unapplied;
pub mod v1alpha1;
mod validate;

pub use checks::parse_go_duration;
pub use document::{Config, DocumentId, RawDocument};
pub use error::{ConfigError, ConfigErrors, Warning};
pub use patch::{apply_patches, Patch, PatchError, StrategicMergePatch};
pub use redact::REDACTED;
pub use unapplied::{unapplied, UNAPPLIED_NETWORK_DOCUMENTS};
pub use v1alpha1::{MachineType, V1Alpha1};
pub use validate::{ParseValidationModeError, ValidationMode};

#[cfg(feature = "fuzzing")]
/// Patches one [`fuzz_config`] input applies at most.
pub const FUZZ_MAX_PATCHES: usize = 4;

#[cfg(feature = "fuzzing")]
/// How far one [`fuzz_config`] input got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuzzConfigOutcome {
    /// The configuration decoded.
    pub decoded: bool,
    /// It decoded and validated for at least one mode.
    pub valid: bool,
    /// Patches that parsed.
    pub patches: usize,
    /// Applying them succeeded (only tried with at least one).
    pub patched: bool,
}

#[cfg(feature = "fuzzing")]
/// The fuzzing entry of the machine configuration decoder and patcher: `data` is a
/// configuration and up to [`FUZZ_MAX_PATCHES`] patches, separated by NUL bytes (bytes that
/// are not UTF-8 become U+FFFD, where reading a file would refuse them). The configuration is
/// decoded, validated in every mode and re-encoded; the patches are parsed and applied to it,
/// and the result decoded and validated, as `talosctl machineconfig patch` and `apply-config`
/// do.
/// Whatever the bytes, nothing panics: bad input is an error.
///
/// A configuration that decodes must re-encode ([`Config::to_yaml`]) into one that decodes and
/// encodes the same again; if not, this panics (a fuzzer finding).
pub fn fuzz_config(data: &[u8]) -> FuzzConfigOutcome {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let config = parts.next().unwrap_or_default();
    let mut outcome = FuzzConfigOutcome::default();
    if let Ok(cfg) = Config::from_yaml(config) {
        outcome.decoded = true;
        outcome.valid = fuzz_validate(&cfg);
        let _ = unapplied(&cfg);
        let encoded = cfg.to_yaml().expect("a decoded configuration encodes");
        match Config::from_yaml(&encoded).map(|again| again.to_yaml()) {
            Ok(Ok(again)) => assert_eq!(again, encoded, "re-encoding changes the configuration"),
            Ok(Err(e)) => panic!("a re-decoded configuration does not encode: {e}"),
            Err(e) => {
                panic!("a configuration re-encodes as one that does not decode:\n{e}\n{encoded}")
            }
        }
    }
    let patches: Vec<Patch> = parts
        .take(FUZZ_MAX_PATCHES)
        .filter_map(|p| Patch::parse(p).ok())
        .collect();
    outcome.patches = patches.len();
    if !patches.is_empty() {
        if let Ok(out) = apply_patches(config, &patches) {
            outcome.patched = true;
            if let Ok(cfg) = Config::from_yaml(&out) {
                fuzz_validate(&cfg);
            }
        }
    }
    outcome
}

#[cfg(feature = "fuzzing")]
/// Validates in every mode; whether any passed.
fn fuzz_validate(cfg: &Config) -> bool {
    let mut any = false;
    for mode in [
        ValidationMode::Container,
        ValidationMode::Metal,
        ValidationMode::Cloud,
    ] {
        any |= cfg.validate(mode).is_ok();
        let _ = cfg.validate_strict(mode);
    }
    any
}
