//! The root controllers: the machine configuration → the root secrets of the node, as
//! upstream's `secrets.Root{OS,Etcd,Kubernetes}Controller` and `secrets.KubeletController`.
//! They share one shape ([`RootController`] over a [`RootPart`]): read the configuration
//! ([`super::source`]), derive one resource or none, keep the last good one on a problem.

use std::future::Future;
use std::marker::PhantomData;
use std::net::IpAddr;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Resource, ResourceSpec};
use machinery::config::{Config, MachineType};
use machinery::resources::secrets::{
    EtcdRootSpec, KubeletSpec, KubernetesRootSpec, OsRootSpec, ETCD_ROOT_ID, KUBELET_ID,
    KUBERNETES_ROOT_ID, OS_ROOT_ID,
};

use super::source::{self, Machine, Source};

/// One root secret derived from the configuration.
pub trait RootPart: Send + Sync + 'static {
    /// The spec written.
    type Spec: ResourceSpec;
    /// The controller name (upstream's).
    const NAME: &'static str;
    /// The resource ID.
    const ID: &'static str;
    /// Whether only control planes have it.
    const CONTROL_PLANE_ONLY: bool;

    /// The spec, or why the configuration does not give one.
    fn derive(config: &Config) -> Result<Self::Spec, String>;
}

/// A root controller of `P`.
#[derive(Debug)]
pub struct RootController<P> {
    source: Source,
    part: PhantomData<fn() -> P>,
}

impl<P: RootPart> Default for RootController<P> {
    fn default() -> Self {
        Self {
            source: Source::default(),
            part: PhantomData,
        }
    }
}

impl<P: RootPart> RootController<P> {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let config = match self.source.machine(ctx).await? {
            Machine::Absent => return Ok(Action::AwaitChange),
            Machine::Keep => {
                source::keep::<P::Spec>(ctx).await?;
                return Ok(Action::AwaitChange);
            }
            Machine::Valid(config) => config,
        };
        // No v1alpha1 document, or not a control plane: no such root on this node.
        if config.v1alpha1.is_none() {
            return Ok(Action::AwaitChange);
        }
        if P::CONTROL_PLANE_ONLY && !is_control_plane(&config) {
            return Ok(Action::AwaitChange);
        }
        match P::derive(&config) {
            Ok(spec) => {
                self.source.clear();
                ctx.apply(Resource::<P::Spec>::new_default(P::ID, spec))
                    .await?;
            }
            Err(problem) => {
                self.source.report(P::NAME, &problem);
                source::keep::<P::Spec>(ctx).await?;
            }
        }
        Ok(Action::AwaitChange)
    }
}

impl<P: RootPart> Controller for RootController<P> {
    fn name(&self) -> &'static str {
        P::NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![source::input()]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<P::Spec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

/// Whether the configuration is a control plane's (`controlplane` or the legacy `init`).
pub fn is_control_plane(config: &Config) -> bool {
    matches!(
        config.machine_type(),
        Some(MachineType::ControlPlane | MachineType::Init)
    )
}

/// `OSRootSecrets/os`.
#[derive(Debug)]
pub struct OsRoot;

/// `secrets.RootOSController`.
pub type RootOsController = RootController<OsRoot>;

impl RootPart for OsRoot {
    type Spec = OsRootSpec;
    const NAME: &'static str = "secrets.RootOSController";
    const ID: &'static str = OS_ROOT_ID;
    const CONTROL_PLANE_ONLY: bool = false;

    fn derive(config: &Config) -> Result<OsRootSpec, String> {
        let machine = config.machine().ok_or("machine is missing")?;
        let mut spec = OsRootSpec {
            accepted_cas: source::accepted("machine.acceptedCAs", &machine.accepted_cas)?,
            token: machine.token.clone().unwrap_or_default(),
            ..OsRootSpec::default()
        };
        if let Some(ca) = machine.ca.as_ref().filter(|ca| ca.has_crt()) {
            let ca = source::cert_and_key("machine.ca", ca)?;
            spec.accepted_cas
                .push(machinery::resources::secrets::CertificatePem {
                    crt: ca.crt.clone(),
                });
            // A worker's configuration holds the CA's certificate only: it cannot issue.
            if !ca.key.is_empty() {
                spec.issuing_ca = Some(ca);
            }
        }
        for san in &machine.cert_sans {
            match san.parse::<IpAddr>() {
                Ok(ip) => spec.cert_san_ips.push(ip),
                Err(_) => spec.cert_san_dns_names.push(san.clone()),
            }
        }
        let talos_api_access = machine
            .features
            .as_ref()
            .and_then(|f| f.kubernetes_talos_api_access.as_ref())
            .and_then(|a| a.enabled)
            .unwrap_or(false);
        if talos_api_access {
            spec.cert_san_dns_names
                .extend(["talos".to_string(), "talos.default".to_string()]);
        }
        Ok(spec)
    }
}

/// `EtcdRootSecrets/etcd`.
#[derive(Debug)]
pub struct EtcdRoot;

/// `secrets.RootEtcdController`.
pub type RootEtcdController = RootController<EtcdRoot>;

impl RootPart for EtcdRoot {
    type Spec = EtcdRootSpec;
    const NAME: &'static str = "secrets.RootEtcdController";
    const ID: &'static str = ETCD_ROOT_ID;
    const CONTROL_PLANE_ONLY: bool = true;

    fn derive(config: &Config) -> Result<EtcdRootSpec, String> {
        let ca = config
            .cluster()
            .and_then(|c| c.etcd.as_ref())
            .and_then(|e| e.ca.as_ref())
            .filter(|ca| ca.has_crt())
            .ok_or("missing cluster.etcd.ca secret")?;
        let etcd_ca = source::cert_and_key("cluster.etcd.ca", ca)?;
        if etcd_ca.key.is_empty() {
            return Err("cluster.etcd.ca.key is missing".into());
        }
        Ok(EtcdRootSpec { etcd_ca })
    }
}

/// `KubernetesRootSecrets/k8s`.
#[derive(Debug)]
pub struct KubernetesRoot;

/// `secrets.RootKubernetesController`.
pub type RootKubernetesController = RootController<KubernetesRoot>;

/// The bootstrap token's ID and secret (`abcdef.0123456789abcdef`); empty parts when it has
/// no dot.
fn split_token(token: &str) -> (String, String) {
    match token.split_once('.') {
        Some((id, secret)) => (id.to_string(), secret.to_string()),
        None => (String::new(), String::new()),
    }
}

/// The first address of a CIDR (`10.96.0.0/12` → `10.96.0.1`): the API server's service IP.
fn first_service_ip(cidr: &str) -> Result<IpAddr, String> {
    let net: ipnet::IpNet = cidr
        .parse()
        .map_err(|_| format!("{cidr:?} is not a CIDR"))?;
    Ok(match net.network() {
        IpAddr::V4(a) => IpAddr::from(u32::from(a).wrapping_add(1).to_be_bytes()),
        IpAddr::V6(a) => IpAddr::from(u128::from(a).wrapping_add(1).to_be_bytes()),
    })
}

impl RootPart for KubernetesRoot {
    type Spec = KubernetesRootSpec;
    const NAME: &'static str = "secrets.RootKubernetesController";
    const ID: &'static str = KUBERNETES_ROOT_ID;
    const CONTROL_PLANE_ONLY: bool = true;

    fn derive(config: &Config) -> Result<KubernetesRootSpec, String> {
        let cluster = config.cluster().ok_or("cluster is missing")?;
        let machine = config.machine();
        let kube_prism = machine
            .and_then(|m| m.features.as_ref())
            .and_then(|f| f.kube_prism.as_ref())
            .filter(|k| k.enabled == Some(true));
        let local_endpoint = match kube_prism {
            Some(k) => format!("https://127.0.0.1:{}", k.port.unwrap_or(7445)),
            None => format!(
                "https://localhost:{}",
                cluster
                    .control_plane
                    .as_ref()
                    .and_then(|c| c.local_api_server_port)
                    .unwrap_or(6443)
            ),
        };
        let network = cluster.network.as_ref();
        let subnets: Vec<String> = match network.map(|n| n.service_subnets.clone()) {
            Some(s) if !s.is_empty() => s,
            _ => vec!["10.96.0.0/12".to_string()],
        };
        let api_server_ips = subnets
            .iter()
            .map(|s| first_service_ip(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("error building API service IPs: {e}"))?;
        let aggregator = cluster
            .aggregator_ca
            .as_ref()
            .filter(|c| c.has_crt())
            .ok_or("missing cluster.aggregatorCA secret")?;
        let mut accepted = source::accepted("cluster.acceptedCAs", &cluster.accepted_cas)?;
        let mut issuing = None;
        if let Some(ca) = cluster.ca.as_ref().filter(|c| c.has_crt()) {
            let ca = source::cert_and_key("cluster.ca", ca)?;
            accepted.push(machinery::resources::secrets::CertificatePem {
                crt: ca.crt.clone(),
            });
            if !ca.key.is_empty() {
                issuing = Some(ca);
            }
        }
        if accepted.is_empty() {
            return Err("missing cluster.CA secret".into());
        }
        let (bootstrap_token_id, bootstrap_token_secret) =
            split_token(cluster.token.as_deref().unwrap_or_default());
        Ok(KubernetesRootSpec {
            name: cluster.cluster_name.clone().unwrap_or_default(),
            endpoint: cluster
                .control_plane
                .as_ref()
                .and_then(|c| c.endpoint.clone())
                .unwrap_or_default(),
            local_endpoint,
            cert_sans: cluster
                .api_server
                .as_ref()
                .map(|a| a.cert_sans.clone())
                .unwrap_or_default(),
            api_server_ips,
            dns_domain: network
                .and_then(|n| n.dns_domain.clone())
                .unwrap_or_else(|| "cluster.local".to_string()),
            issuing_ca: issuing,
            accepted_cas: accepted,
            service_account: match cluster
                .service_account
                .as_ref()
                .and_then(|k| k.key.as_deref())
            {
                Some(k) if !k.is_empty() => Some(source::key("cluster.serviceAccount.key", k)?),
                _ => None,
            },
            aggregator_ca: Some(source::cert_and_key("cluster.aggregatorCA", aggregator)?),
            aescbc_encryption_secret: cluster.aescbc_encryption_secret.clone().unwrap_or_default(),
            bootstrap_token_id,
            bootstrap_token_secret,
            secretbox_encryption_secret: cluster
                .secretbox_encryption_secret
                .clone()
                .unwrap_or_default(),
        })
    }
}

/// `KubeletSecrets/kubelet`.
#[derive(Debug)]
pub struct Kubelet;

/// `secrets.KubeletController`.
pub type KubeletController = RootController<Kubelet>;

impl RootPart for Kubelet {
    type Spec = KubeletSpec;
    const NAME: &'static str = "secrets.KubeletController";
    const ID: &'static str = KUBELET_ID;
    const CONTROL_PLANE_ONLY: bool = false;

    fn derive(config: &Config) -> Result<KubeletSpec, String> {
        let cluster = config.cluster().ok_or("cluster is missing")?;
        let endpoint = cluster
            .control_plane
            .as_ref()
            .and_then(|c| c.endpoint.clone())
            .ok_or("cluster.controlPlane.endpoint is missing")?;
        // A control plane's kubelet talks to its own API server (KubePrism, or localhost);
        // a worker's to the cluster endpoint.
        let endpoint = if is_control_plane(config) {
            KubernetesRoot::derive(config)
                .map(|k| k.local_endpoint)
                .unwrap_or(endpoint)
        } else {
            endpoint
        };
        let mut accepted = source::accepted("cluster.acceptedCAs", &cluster.accepted_cas)?;
        if let Some(ca) = cluster.ca.as_ref().filter(|c| c.has_crt()) {
            accepted.push(machinery::resources::secrets::CertificatePem {
                crt: source::cert_and_key("cluster.ca", ca)?.crt,
            });
        }
        if accepted.is_empty() {
            return Err("missing cluster.CA secret".into());
        }
        let (bootstrap_token_id, bootstrap_token_secret) =
            split_token(cluster.token.as_deref().unwrap_or_default());
        Ok(KubeletSpec {
            endpoint,
            accepted_cas: accepted,
            bootstrap_token_id,
            bootstrap_token_secret,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ips_are_the_first_host_of_each_subnet() {
        assert_eq!(
            first_service_ip("10.96.0.0/12").expect("v4"),
            "10.96.0.1".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(
            first_service_ip("fd00:10:96::/112").expect("v6"),
            "fd00:10:96::1".parse::<IpAddr>().expect("ip")
        );
        assert!(first_service_ip("10.96.0.0/33").is_err());
        assert!(first_service_ip("nonsense").is_err());
    }

    #[test]
    fn tokens_split_at_the_dot() {
        assert_eq!(
            split_token("abcdef.0123456789abcdef"),
            ("abcdef".to_string(), "0123456789abcdef".to_string())
        );
        assert_eq!(split_token("nodot"), (String::new(), String::new()));
    }
}
