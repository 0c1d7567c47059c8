//! sandbox: how talos-rs runs a program with less than root's power, and how it checks the result.
//!
//! - [`Policy`]: the sandbox of one program, as the daemon manifest declares it (uid/gid,
//!   capabilities, landlock paths and ports, seccomp profile, environment, fds, working dir).
//! - [`Prepared`]: a policy and a [`Command`] resolved before fork (C strings, BPF program,
//!   landlock ruleset fd, capability masks), so that the child only issues system calls.
//! - [`spawn()`]: fork, apply the sandbox in the order of DESIGN.md §5, exec; a failed step comes
//!   back as [`SpawnError::Child`] naming the [`Step`] and errno.
//! - [`observe()`]: what `/proc/<pid>/task/*/status` says for every thread ([`Observed`]).
//! - [`score()`]: the exposure on the `systemd-analyze security` model ([`Exposure`]).
//!
//! fork/exec and the raw system calls around them live only in this crate; `unsafe_code` is
//! allowed here (see `Cargo.toml`), and every `unsafe` block says why it is sound.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod block;
pub mod capset;
pub mod daemon;
pub mod landlock;
pub mod netns;
pub mod observe;
pub mod packet;
pub mod policy;
pub mod prepare;
pub mod score;
pub mod seccomp;
pub mod spawn;

pub use capset::CapSet;
pub use landlock::{kernel_abi as landlock_kernel_abi, LandlockApplied, LandlockEnforcement};
pub use observe::{observe, ObserveError, Observed, SeccompMode, ThreadStatus};
pub use policy::{LandlockPolicy, PathAccess, PathRule, Policy, SeccompPolicy, SeccompProfileRef};
pub use prepare::{Applied, Command, PrepareError, Prepared};
pub use score::{score, Check, Exposure, IpcReach, Level};
pub use seccomp::{SeccompAction, SeccompApplied};
pub use spawn::{spawn, Child, SpawnError, Step};
