//! The talos-rs resource model, the State API client and the controller runtime.
//!
//! - [`resource`]: metadata, opaque and typed resources, the CBOR spec encoding;
//! - [`definition`]: resource definitions and namespaces (`meta`);
//! - [`error`]: [`StateError`] and its mapping to gRPC codes;
//! - [`client`]: the State client over a Unix socket, with resuming watches;
//! - [`runtime`]: the controller runtime (controllers, wake-ups, restarts, output tracking);
//! - [`generic`]: transform and layered merge controllers.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod client;
pub mod definition;
pub mod error;
pub mod generic;
pub mod resource;
pub mod runtime;

pub use client::{unix_channel, BatchWrite, Client, Event, EventKind, Query, Watch, WatchSpec};
pub use definition::{NamespaceSpec, ResourceDefinition, META_NAMESPACE};
pub use error::{ErrorKind, StateError};
pub use resource::{Metadata, Phase, Pointer, RawResource, Resource, ResourceSpec};
pub use runtime::{Action, Context, Controller, Input, Output, ReconcileError, Runtime, Waker};
