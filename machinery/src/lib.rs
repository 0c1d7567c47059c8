//! Typed talos-rs resources of every namespace ([`resources`]) and the v1alpha1 machine
//! configuration ([`config`]), shared by the daemons and talosctl.
pub mod config;
pub mod manifest;
pub mod path_id;
pub mod resources;
pub mod rfc3339;
#[cfg(feature = "pki")]
pub mod secrets;
#[cfg(feature = "tls")]
pub mod tls;
