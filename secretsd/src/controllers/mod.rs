//! secretsd's controllers: root secrets from the machine configuration ([`root`]), the API
//! certificate's SANs ([`cert_sans`]), the leaf certificates ([`leaf`]) and apid's, which a
//! worker gets through trustd ([`api`]), and apid's client certificates ([`client`]).

pub mod api;
pub mod cert_sans;
pub mod client;
pub mod leaf;
pub mod root;
pub mod source;

use std::time::Duration;

/// Validity of the Talos API's leaf certificates (apid's, trustd's): 24 h, as upstream's
/// `DefaultCertificateValidityDuration`. They are renewed at half of it.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// Settings of the controllers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Validity of apid's and trustd's certificates.
    pub leaf_validity: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            leaf_validity: DEFAULT_LEAF_VALIDITY,
        }
    }
}

/// Every secretsd controller.
///
/// # Errors
///
/// A registration conflict (a bug: two controllers claiming one exclusive output).
pub fn registry(options: &Options) -> Result<cosi::runtime::Registry, cosi::runtime::RuntimeError> {
    let mut r = cosi::runtime::Registry::new();
    r.register(root::RootOsController::default())?;
    r.register(root::RootEtcdController::default())?;
    r.register(root::RootKubernetesController::default())?;
    r.register(root::KubeletController::default())?;
    r.register(cert_sans::ApiCertSansController)?;
    r.register(api::ApiController::new(options))?;
    r.register(leaf::TrustdController::new(options))?;
    r.register(leaf::EtcdController::new(options))?;
    r.register(client::ClientCertificateController)?;
    Ok(r)
}
