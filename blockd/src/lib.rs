//! blockd: the block daemon of a talos-rs node (DESIGN.md §1). It writes only the `block`
//! namespace: `Disk`s from sysfs and `DiscoveredVolume`s probed from the disks themselves
//! (read-only: a shared lock, no write), and the system volumes' `VolumeConfig`s with where
//! each stands (`VolumeStatus`, located by CEL locators as upstream's). Partitioning,
//! formatting and mounting (STATE, EPHEMERAL) are not here yet.

pub mod controllers;
pub mod probe;
pub mod provision;
pub mod run;
pub mod sysfs;
pub mod volumes;
