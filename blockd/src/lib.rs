//! blockd: the block daemon of a talos-rs node (DESIGN.md §1). It writes only the `block`
//! namespace: `Disk`s from sysfs and `DiscoveredVolume`s probed from the disks themselves
//! (read-only: a shared lock, no write), the system volumes' `VolumeConfig`s with where each
//! stands (`VolumeStatus`, located by CEL locators as upstream's) and the disk they are on
//! (`SystemDisk`). On the install disk the configuration names, once nothing is found on it
//! (blockd's probe, its first and last MiB, and blkid: [`blkid`]), it writes the system
//! partitions and asks init for mkfs.xfs on each; init mounts them.

pub mod blkid;
pub mod controllers;
pub mod probe;
pub mod provision;
pub mod run;
pub mod sysfs;
pub mod volumes;
