//! HostnameSpec: the desired hostname and domain name.

use cosi::{Resource, ResourceDefinition, ResourceSpec};
use serde::{Deserialize, Serialize};

use super::config_layer::ConfigLayer;
use super::NAMESPACE;

/// Longest hostname label.
pub const MAX_HOSTNAME_LEN: usize = 63;
/// Longest fully qualified name.
pub const MAX_FQDN_LEN: usize = 253;

/// Desired hostname and domain name: a candidate per layer in `network-config`
/// (`<layer>/hostname`), the winner `hostname` in `network`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostnameSpecSpec {
    /// Short hostname (no dots).
    pub hostname: String,
    /// Domain name, possibly empty.
    pub domainname: String,
    /// Layer the candidate comes from.
    pub layer: ConfigLayer,
}

/// A hostname that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostnameError {
    /// Empty or longer than 63 characters.
    #[error("hostname {0:?} must be 1 to 63 characters long")]
    Length(String),
    /// The FQDN is longer than 253 characters.
    #[error("fully qualified name {0:?} is longer than 253 characters")]
    FqdnLength(String),
    /// A character outside letters, digits and `-`, or a label starting or ending with `-`.
    #[error("{0:?} is not a valid host name")]
    Invalid(String),
}

impl HostnameSpecSpec {
    /// Splits `host.example.com` at the first dot into hostname and domain name (upstream
    /// `ParseFQDN`), validating the result.
    ///
    /// # Errors
    ///
    /// [`HostnameError`] if a part is empty, too long or has invalid characters.
    pub fn parse_fqdn(fqdn: &str, layer: ConfigLayer) -> Result<Self, HostnameError> {
        let fqdn = fqdn.trim_end_matches('.');
        let (hostname, domainname) = fqdn.split_once('.').unwrap_or((fqdn, ""));
        let spec = Self {
            hostname: hostname.to_string(),
            domainname: domainname.to_string(),
            layer,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// `host.example.com`, or the bare hostname without a domain.
    pub fn fqdn(&self) -> String {
        fqdn(&self.hostname, &self.domainname)
    }

    /// Checks the lengths (1..=63, FQDN ≤ 253) and the characters of every label.
    ///
    /// # Errors
    ///
    /// [`HostnameError`].
    pub fn validate(&self) -> Result<(), HostnameError> {
        if self.hostname.is_empty() || self.hostname.len() > MAX_HOSTNAME_LEN {
            return Err(HostnameError::Length(self.hostname.clone()));
        }
        let fqdn = self.fqdn();
        if fqdn.len() > MAX_FQDN_LEN {
            return Err(HostnameError::FqdnLength(fqdn));
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= MAX_HOSTNAME_LEN
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        };
        if !fqdn.split('.').all(label_ok) {
            return Err(HostnameError::Invalid(fqdn));
        }
        Ok(())
    }
}

/// `host.domain`, or `host` when the domain is empty.
pub(crate) fn fqdn(hostname: &str, domainname: &str) -> String {
    if domainname.is_empty() {
        hostname.to_string()
    } else {
        format!("{hostname}.{domainname}")
    }
}

impl ResourceSpec for HostnameSpecSpec {
    const TYPE: &'static str = "HostnameSpecs.net.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = NAMESPACE;

    fn definition() -> ResourceDefinition {
        ResourceDefinition::new(Self::TYPE, NAMESPACE)
    }
}

impl cosi::generic::Layered for HostnameSpecSpec {
    type Layer = ConfigLayer;

    fn layer(&self) -> ConfigLayer {
        self.layer
    }

    /// The ID of the merged resource in `network`.
    fn merge_key(&self) -> String {
        super::id::HOSTNAME_ID.to_string()
    }
}

/// A `HostnameSpec` resource.
pub type HostnameSpec = Resource<HostnameSpecSpec>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fqdn_parsing_and_validation() {
        let s = HostnameSpecSpec::parse_fqdn("node-1.example.com", ConfigLayer::Cmdline)
            .expect("valid");
        assert_eq!(s.hostname, "node-1");
        assert_eq!(s.domainname, "example.com");
        assert_eq!(s.fqdn(), "node-1.example.com");
        assert!(HostnameSpecSpec::parse_fqdn("", ConfigLayer::Default).is_err());
        assert!(HostnameSpecSpec::parse_fqdn(&"a".repeat(64), ConfigLayer::Default).is_err());
        assert!(HostnameSpecSpec::parse_fqdn("bad_name", ConfigLayer::Default).is_err());
        assert!(HostnameSpecSpec::parse_fqdn("-x", ConfigLayer::Default).is_err());
    }
}
