//! networkd's controllers.
// ---- Config, Merge, NodeAddress, Status and etc files (the resource side) ----
pub mod address_filter;
pub mod cmdline;
pub mod config;
pub mod etc_file;
pub mod hostname_config;
pub mod machine_network;
pub mod merge;
pub mod node_address;
pub mod plan;
pub mod resolver_config;
pub mod resolver_spec;
pub mod selector;
pub mod source;
pub mod status;
pub mod time_server_config;
pub mod time_server_spec;

/// Settings of the controllers that touch the node outside the kernel.
#[derive(Debug, Clone)]
pub struct Options {
    /// Root under which `etc/hosts`, `etc/resolv.conf` and `etc/hostname` are written
    /// (`/` on a node; a temporary directory in tests).
    pub etc_root: std::path::PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            etc_root: std::path::PathBuf::from("/"),
        }
    }
}

/// Every networkd controller, with the default [`Options`].
///
/// # Errors
///
/// A registration conflict (a bug: two controllers claiming one exclusive output).
pub fn registry() -> Result<cosi::runtime::Registry, cosi::runtime::RuntimeError> {
    registry_with(&Options::default())
}

/// Every networkd controller.
///
/// # Errors
///
/// As [`registry`].
pub fn registry_with(
    options: &Options,
) -> Result<cosi::runtime::Registry, cosi::runtime::RuntimeError> {
    let mut r = cosi::runtime::Registry::new();
    register_resource_side(&mut r, options)?;
    register_kernel_side(&mut r)?;
    Ok(r)
}

/// The controllers that need no kernel: Config (machine config, cmdline, defaults →
/// `network-config`), Merge (`network-config` → `network`), resolver and time server statuses,
/// NodeAddress and its filters, the network Status and the etc files.
///
/// # Errors
///
/// As [`registry`].
pub fn register_resource_side(
    r: &mut cosi::runtime::Registry,
    options: &Options,
) -> Result<(), cosi::runtime::RuntimeError> {
    r.register(config::LinkConfigController::new())?;
    r.register(config::AddressConfigController::new())?;
    r.register(config::RouteConfigController::new())?;
    r.register(config::OperatorConfigController::new())?;
    r.register(hostname_config::HostnameConfigController::new())?;
    r.register(resolver_config::ResolverConfigController::new())?;
    r.register(time_server_config::TimeServerConfigController::new())?;
    r.register(merge::address_merge())?;
    r.register(merge::link_merge())?;
    r.register(merge::route_merge())?;
    r.register(merge::operator_merge())?;
    r.register(merge::hostname_merge())?;
    r.register(merge::ResolverMergeController)?;
    r.register(merge::time_server_merge())?;
    r.register(resolver_spec::ResolverSpecController::new(
        resolver_spec::ResolverSpec,
    ))?;
    r.register(time_server_spec::TimeServerSpecController::new(
        time_server_spec::TimeServerSpec,
    ))?;
    r.register(node_address::NodeAddressController::default())?;
    r.register(address_filter::AddressFilterController::default())?;
    r.register(status::StatusController::default())?;
    r.register(etc_file::EtcFileController::default())?;
    r.register(etc_file::EtcFileWriterController::new(&options.etc_root))?;
    Ok(())
}

// ---- Spec, Status and operator controllers (the kernel side) ----
pub mod address_spec;
pub mod address_status;
pub mod hostname_spec;
pub mod kernel_model;
pub mod link_spec;
pub mod link_status;
pub mod operator_spec;
pub mod route_spec;
pub mod route_status;

/// The controllers that touch the kernel: Spec (merged specs → kernel, with finalizers; the
/// hostname is only observed, init sets it), Status (kernel → statuses, woken by netlink
/// multicast events) and the DHCPv4 and DHCPv6 operators.
///
/// # Errors
///
/// As [`registry`].
pub fn register_kernel_side(
    r: &mut cosi::runtime::Registry,
) -> Result<(), cosi::runtime::RuntimeError> {
    r.register(link_spec::LinkSpecController::default())?;
    r.register(address_spec::AddressSpecController::default())?;
    r.register(route_spec::RouteSpecController::default())?;
    r.register(hostname_spec::HostnameSpecController::default())?;
    r.register(link_status::LinkStatusController::default())?;
    r.register(address_status::AddressStatusController::default())?;
    r.register(route_status::RouteStatusController::default())?;
    r.register(operator_spec::OperatorSpecController::default())?;
    Ok(())
}
