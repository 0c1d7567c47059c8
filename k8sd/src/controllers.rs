//! k8sd's controllers.

use crate::{etcd, k8s};

/// What k8sd runs with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// etcd's program, files and sandbox.
    pub etcd: etcd::service::EtcdOptions,
    /// The VIP elections' leases, given back when k8sd stops.
    pub vip: etcd::vip::Holdings,
    /// Where the kubelet's files are written (`/system/kubernetes`).
    pub kubernetes_dir: std::path::PathBuf,
}

/// Every controller of k8sd.
///
/// # Errors
///
/// A controller that cannot be registered (a bug).
pub fn registry(options: &Options) -> Result<cosi::runtime::Registry, cosi::runtime::RuntimeError> {
    let mut r = cosi::runtime::Registry::new();
    r.register(etcd::config::ConfigController::default())?;
    r.register(etcd::config::SpecController)?;
    r.register(etcd::pki::PkiController::new(options.etcd.pki_dir.clone()))?;
    r.register(etcd::service::ServiceController::new(options.etcd.clone()))?;
    r.register(etcd::health::HealthController::default())?;
    r.register(k8s::ComponentController::<
        machinery::resources::k8s::ApiServerConfigSpec,
    >::default())?;
    r.register(k8s::ComponentController::<
        machinery::resources::k8s::ControllerManagerConfigSpec,
    >::default())?;
    r.register(k8s::ComponentController::<
        machinery::resources::k8s::SchedulerConfigSpec,
    >::default())?;
    r.register(k8s::StaticPodController)?;
    r.register(k8s::server::StaticPodServerController::default())?;
    r.register(k8s::kubelet::KubeletConfigController)?;
    r.register(k8s::kubelet::KubeletSpecController::default())?;
    r.register(etcd::recover::RecoverController::new(
        options.etcd.recover_dir.clone(),
    ))?;
    r.register(etcd::operation::OperationController::new(
        options.etcd.data_dir.clone(),
    ))?;
    r.register(etcd::vip::VipController::new(options.vip.clone()))?;
    r.register(k8s::manifests::BootstrapManifestsConfigController::default())?;
    r.register(k8s::manifests::ManifestController)?;
    r.register(k8s::files::KubeletPkiController::new(
        options.kubernetes_dir.clone(),
    ))?;
    Ok(r)
}
