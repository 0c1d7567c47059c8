//! The COSI State API (`cosi.resource.State`) as generated Rust types, wire-compatible with upstream
//! COSI: same package, service, message names, field numbers and enum values.
#![allow(missing_docs, clippy::all)]

pub mod codec;
pub mod encoded;

/// `cosi.resource`: resources, events and the State service.
pub mod resource {
    tonic::include_proto!("cosi.resource");
    pub use crate::encoded::{ResourceResponse, WatchResponse};
    /// `cosi.resource.GetResponse`.
    pub type GetResponse = ResourceResponse;
    /// `cosi.resource.ListResponse`.
    pub type ListResponse = ResourceResponse;
    /// `cosi.resource.CreateResponse`.
    pub type CreateResponse = ResourceResponse;
    /// `cosi.resource.UpdateResponse`.
    pub type UpdateResponse = ResourceResponse;

    /// `cosi.resource.meta`: the spec messages of the meta namespace.
    pub mod meta {
        tonic::include_proto!("cosi.resource.meta");
    }
}

/// `cosi`: the path other packages' generated code takes to `cosi.resource`.
pub mod cosi {
    pub use crate::resource;
}

/// `talos.init`: init's control API (list, start, stop, restart, logs, shutdown, reboot).
pub mod init {
    tonic::include_proto!("talos.init");
}

/// `securityapi`: trustd's Certificate RPC (upstream's package and messages).
pub mod securityapi {
    tonic::include_proto!("securityapi");
}

/// `google.rpc`: the status embedded in `common.Metadata`.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// `common`: upstream Talos's shared reply metadata and data messages.
pub mod common {
    tonic::include_proto!("common");
}

/// `machine`: the subset of upstream Talos's MachineService that apid serves.
pub mod machine {
    tonic::include_proto!("machine");
}

/// `storage`: upstream Talos's StorageService (Disks), served by apid from blockd's disks.
pub mod storage {
    tonic::include_proto!("storage");
}

/// `talosrs`: talos-rs's own APIs beside upstream's.
pub mod talosrs {
    /// `talosrs.audit`: the audit RPC, served by apid.
    pub mod audit {
        tonic::include_proto!("talosrs.audit");
    }

    /// `talosrs.state`: several State writes in one call, served by stated.
    pub mod state {
        tonic::include_proto!("talosrs.state");
    }
}

pub use prost_types::Timestamp;
pub use resource::*;
