//! The `runtime` namespace (written by init): what the node observed about itself.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

/// The namespace init writes.
pub const NAMESPACE: &str = "runtime";
/// ID of the kernel command line resource.
pub const CMDLINE_ID: &str = "cmdline";

/// The kernel command line of the node (from `/proc/cmdline` in a VM, from the node's own
/// configuration in container mode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelCmdlineSpec {
    /// The whole command line.
    pub cmdline: String,
}

impl ResourceSpec for KernelCmdlineSpec {
    const TYPE: &'static str = "KernelCmdlines.runtime.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE).with_columns(&[("Cmdline", "{.cmdline}")])
    }
}

/// A `KernelCmdline` resource.
pub type KernelCmdline = Resource<KernelCmdlineSpec>;
