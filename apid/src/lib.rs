//! apid: the Talos API of a talos-rs node on TCP 50000, mutual TLS 1.3.
//!
//! - [`auth`]: roles from the client certificate and upstream's per-method rules, one layer in
//!   front of every service;
//! - [`state`]: `cosi.resource.State`, read-only, with upstream's access filter;
//! - [`machine`]: the part of `machine.MachineService` that exists on a talos-rs node;
//! - [`client_config`]: GenerateClientConfiguration, signed by secretsd through a resource;
//! - [`kubeconfig`]: Kubeconfig, an admin kubeconfig signed by secretsd the same way;
//! - [`bootstrap`], [`etcd`]: Bootstrap and the etcd RPCs, run by k8sd through resources;
//! - [`audit`]: `talosrs.audit.AuditService` (ours): every daemon's observed sandbox;
//! - [`proxy`]: forwarding to other nodes (`node`, `nodes` metadata), as upstream's director;
//! - [`controller`]: the serving certificate and accepted CAs, from secretsd's resources;
//! - [`share`]: fair shares of watches, etcd operations and followed logs among clients;
//! - [`run`]: the daemon.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod audit;
pub mod auth;
pub mod bootstrap;
pub mod client_config;
pub mod controller;
pub mod etcd;
pub mod kubeconfig;
pub mod machine;
pub mod proxy;
pub mod request;
pub mod run;
pub mod share;
pub mod state;
pub mod storage;
