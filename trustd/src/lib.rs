//! trustd: signs the apid certificates of joining nodes with the OS CA, over upstream's
//! `securityapi.SecurityService/Certificate` on TCP 50001 (TLS 1.3, server authentication
//! only; the trustd token in the `token` metadata). It runs on every node but listens only
//! where secretsd gave it a serving certificate and the OS CA has its key: on control planes.
//!
//! On a worker it is the joining side ([`join`]): it sends the CSR secretsd made for apid to a
//! control plane's trustd and writes the answer into its own namespace.
//!
//! It reads three resources of `secrets` and nothing else there: `TrustdCertificates/trustd`
//! (what it serves with), `OSRootSecrets/os` (the CA it signs with, the token) and
//! `ApiCertificateRequests/api` (a worker's CSR, no key).

pub mod client;
pub mod controller;
pub mod join;
pub mod run;
pub mod service;
