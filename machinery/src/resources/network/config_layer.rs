//! The configuration layer a network spec candidate comes from.

use super::nethelpers::string_enum;

string_enum! {
    /// Where a spec candidate in `network-config` comes from, lowest precedence first: a higher
    /// layer wins the merge (machine configuration beats DHCP, DHCP beats the platform, the
    /// platform beats the kernel command line, which beats the built-in defaults).
    ///
    /// `Ord` follows precedence, not the string form (whose alphabetical order is what a listing
    /// of `network-config` is sorted by).
    ConfigLayer: "config layer" {
        /// Built-in defaults (loopback, default DHCP).
        Default = "default",
        /// The kernel command line (`ip=`, `talos.hostname=` ...).
        Cmdline = "cmdline",
        /// Cloud platform metadata.
        Platform = "platform",
        /// Operators (DHCP, VIP).
        Operator = "operator",
        /// The machine configuration.
        Configuration = "configuration",
    }
    default Default
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_strings() {
        let mut layers = [
            ConfigLayer::Configuration,
            ConfigLayer::Default,
            ConfigLayer::Operator,
            ConfigLayer::Cmdline,
            ConfigLayer::Platform,
        ];
        layers.sort();
        assert_eq!(
            layers.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
            [
                "default",
                "cmdline",
                "platform",
                "operator",
                "configuration"
            ]
        );
        assert_eq!(ConfigLayer::default(), ConfigLayer::Default);
        assert_eq!(
            "configuration".parse::<ConfigLayer>(),
            Ok(ConfigLayer::Configuration)
        );
        assert!("operators".parse::<ConfigLayer>().is_err());
        let bytes = cosi::resource::encode_spec(&ConfigLayer::Platform).expect("encode");
        let value = cosi::resource::spec_to_value(&bytes).expect("decode");
        assert_eq!(value, serde_json::json!("platform"));
    }
}
