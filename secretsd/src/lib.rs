//! secretsd: the node's secrets daemon. It reads the full machine configuration (one of the two
//! daemons that may), publishes the root secrets of the node (`OSRootSecrets`,
//! `EtcdRootSecrets`, `KubernetesRootSecrets`, `KubeletSecrets`) and mints the leaf
//! certificates others serve with (`ApiCertificates` for apid, `TrustdCertificates`,
//! `EtcdSecrets`), renewing them at half their lifetime. It has no capability, no network and
//! writes no file: its only peer is stated.

pub mod controllers;
pub mod run;
#[cfg(feature = "testing")]
pub mod testing;
