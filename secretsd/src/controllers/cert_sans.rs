//! `secrets.APICertSANsController`: the SANs of the node's Talos API certificate, from
//! `machine.certSANs` (OSRoot), the node's addresses (`accumulative-no-k8s`: every address the
//! node had, without the pod and service networks, so that a leaf never loses a name a client
//! used) and its hostname and FQDN (the CN).

use std::future::Future;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::network::{
    filtered_node_address_id, HostnameStatusSpec, NodeAddressSpec, FILTER_NO_K8S, HOSTNAME_ID,
    NAMESPACE as NETWORK_NS, NODE_ADDRESS_ACCUMULATIVE_ID,
};
use machinery::resources::secrets::{
    CertSanSpec, OsRootSpec, CERT_SAN_API_ID, NAMESPACE, OS_ROOT_ID,
};

/// `secrets.APICertSANsController`.
#[derive(Debug, Default)]
pub struct ApiCertSansController;

fn addresses_id() -> String {
    filtered_node_address_id(NODE_ADDRESS_ACCUMULATIVE_ID, FILTER_NO_K8S)
}

/// The SANs of the API certificate.
pub fn api_cert_sans(
    root: &OsRootSpec,
    hostname: &HostnameStatusSpec,
    addresses: &NodeAddressSpec,
) -> CertSanSpec {
    let mut spec = CertSanSpec {
        ips: root.cert_san_ips.clone(),
        dns_names: root.cert_san_dns_names.clone(),
        fqdn: hostname.fqdn(),
    };
    spec.ips
        .extend(addresses.addresses.iter().map(ipnet::IpNet::addr));
    spec.dns_names.push(hostname.hostname.clone());
    spec.dns_names.push(hostname.fqdn());
    spec.normalize();
    spec
}

impl ApiCertSansController {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(root) = ctx.get::<OsRootSpec>(NAMESPACE, OS_ROOT_ID).await? else {
            return Ok(Action::AwaitChange);
        };
        // Until networkd has published both, keep what there is (a restart of networkd must not
        // take apid's certificate away).
        let hostname = ctx
            .get::<HostnameStatusSpec>(NETWORK_NS, HOSTNAME_ID)
            .await?;
        let addresses = ctx
            .get::<NodeAddressSpec>(NETWORK_NS, &addresses_id())
            .await?;
        let (Some(hostname), Some(addresses)) = (hostname, addresses) else {
            super::source::keep::<CertSanSpec>(ctx).await?;
            return Ok(Action::AwaitChange);
        };
        let spec = api_cert_sans(&root.spec, &hostname.spec, &addresses.spec);
        ctx.apply(Resource::new_default(CERT_SAN_API_ID, spec))
            .await?;
        Ok(Action::AwaitChange)
    }
}

impl Controller for ApiCertSansController {
    fn name(&self) -> &'static str {
        "secrets.APICertSANsController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<OsRootSpec>(NAMESPACE).with_id(OS_ROOT_ID),
            Input::weak::<HostnameStatusSpec>(NETWORK_NS).with_id(HOSTNAME_ID),
            Input::weak::<NodeAddressSpec>(NETWORK_NS).with_id(addresses_id()),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        // Shared, as upstream: the Kubernetes SANs (`k8s`) get a controller of their own.
        vec![Output::shared::<CertSanSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sans_join_config_addresses_and_names() {
        let root = OsRootSpec {
            cert_san_ips: vec!["127.0.0.1".parse().expect("ip")],
            cert_san_dns_names: vec!["api.example".into()],
            ..OsRootSpec::default()
        };
        let hostname = HostnameStatusSpec {
            hostname: "cp-1".into(),
            domainname: "lab".into(),
        };
        let addresses = NodeAddressSpec {
            addresses: vec![
                "10.5.0.2/24".parse().expect("net"),
                "127.0.0.1/8".parse().expect("net"),
            ],
            ..NodeAddressSpec::default()
        };
        let s = api_cert_sans(&root, &hostname, &addresses);
        assert_eq!(s.fqdn, "cp-1.lab");
        assert_eq!(s.dns_names, ["api.example", "cp-1", "cp-1.lab"]);
        assert_eq!(
            s.ips,
            [
                "10.5.0.2".parse::<std::net::IpAddr>().expect("ip"),
                "127.0.0.1".parse().expect("ip")
            ]
        );
    }
}
