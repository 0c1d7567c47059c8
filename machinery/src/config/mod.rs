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

mod checks;
mod document;
mod error;
mod patch;
mod strict;
mod unapplied;
pub mod v1alpha1;
mod validate;

pub use document::{Config, DocumentId, RawDocument};
pub use error::{ConfigError, ConfigErrors, Warning};
pub use patch::{apply_patches, Patch, PatchError, StrategicMergePatch};
pub use unapplied::{unapplied, UNAPPLIED_NETWORK_DOCUMENTS};
pub use v1alpha1::{MachineType, V1Alpha1};
pub use validate::{ParseValidationModeError, ValidationMode};
