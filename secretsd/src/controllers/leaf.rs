//! The leaf controllers: certificates signed by a root CA, as upstream's
//! `secrets.{API,Trustd,Etcd}Controller`. They share one shape ([`LeafController`] over a
//! [`LeafPart`]): the part says which CA signs which certificates; the engine keeps each
//! certificate it already has while it is still good and reissues the others.
//!
//! # When a certificate is reissued
//!
//! A certificate in stated is kept while all of these hold, and reissued otherwise:
//! - its key is the one beside it, and the current CA's key signed it (a rotated CA reissues);
//! - its subject and SANs are what the inputs ask now (a new address or hostname reissues), and
//!   its key is of the algorithm asked, if one is (an Ed25519 key of apid's or trustd's from
//!   before their keys were ECDSA is reissued);
//! - its lifetime is the configured one;
//! - now lies between its start (a minute of clock slack) and half its lifetime.
//!
//! Upstream mints every leaf again whenever machined starts; secretsd re-adopts what it has, so
//! a restart of secretsd (or of stated) reissues nothing, and apid's clients keep their
//! connections. The controller wakes itself at the earliest half-life of what it keeps.

use std::future::Future;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Resource, ResourceSpec};
use machinery::resources::network::{
    filtered_node_address_id, HostnameStatusSpec, NodeAddressSpec, StatusSpec, FILTER_NO_K8S,
    HOSTNAME_ID, NAMESPACE as NETWORK_NS, NODE_ADDRESS_ACCUMULATIVE_ID, STATUS_ID,
};
use machinery::resources::secrets::{
    ApiCertsSpec, CertSanSpec, CertificateAndKey, CertificatePem, EtcdCertsSpec, EtcdRootSpec,
    OsRootSpec, TrustdCertsSpec, API_ID, CERT_SAN_API_ID, ETCD_ID, ETCD_ROOT_ID, NAMESPACE,
    OS_ROOT_ID, TRUSTD_ID,
};
use machinery::secrets::x509::{
    Certificate, ExtendedUsage, LeafRequest, PrivateKey, Subject, Usage,
};
use machinery::secrets::API_SERVING_KEY;

use super::Options;

/// Validity of etcd's certificates: 10 years, as upstream's (re-minted only when the node's
/// names change).
pub const ETCD_VALIDITY: Duration = Duration::from_secs(87_600 * 3600);

/// The longest a leaf controller sleeps between two looks at its certificates.
const RECHECK: Duration = Duration::from_secs(24 * 3600);

/// Clock slack allowed before a certificate's start.
const START_SLACK: Duration = Duration::from_secs(60);

/// A certificate a part wants: what it says, and for how long.
#[derive(Clone, Debug)]
pub struct Want {
    /// Subject, SANs and uses.
    pub request: LeafRequest,
    /// Lifetime.
    pub validity: Duration,
}

/// What a part wants now: the CA that signs and the certificates, in the order
/// [`LeafPart::current`] and [`LeafPart::build`] use.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The signing CA, PEM, with its key.
    pub ca: CertificateAndKey,
    /// The certificates.
    pub wants: Vec<Want>,
}

/// What a part wants now.
#[derive(Debug)]
pub enum Planned<T> {
    /// The node has none of this kind (a worker, no root): the resource is torn down.
    None,
    /// An input is not there yet or not ready (the network, the SANs): what exists is kept as
    /// it is, so that a flapping link does not tear apid's certificate down.
    Wait,
    /// These certificates ([`Plan`]) and what the resource carries besides them.
    Issue(T),
}

impl<T> Planned<T> {
    /// The same readiness, with `f` applied to what is there.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Planned<U> {
        match self {
            Planned::None => Planned::None,
            Planned::Wait => Planned::Wait,
            Planned::Issue(t) => Planned::Issue(f(t)),
        }
    }
}

/// One kind of leaf resource.
pub trait LeafPart: Send + Sync + 'static {
    /// The spec written.
    type Spec: ResourceSpec;
    /// What the plan carries to the resource besides the certificates (accepted CAs).
    type Extra: Send;
    /// The controller name (upstream's).
    const NAME: &'static str;
    /// The resource ID.
    const ID: &'static str;

    /// Inputs (what [`plan`](Self::plan) reads).
    fn inputs() -> Vec<Input>;

    /// The certificates wanted now.
    fn plan<'a>(
        ctx: &'a Context,
        options: &'a Options,
    ) -> impl Future<Output = Result<Planned<(Plan, Self::Extra)>, ReconcileError>> + Send + 'a;

    /// The certificates the stored resource has, in [`Plan::wants`] order.
    fn current(spec: &Self::Spec) -> Vec<Option<&CertificateAndKey>>;

    /// The resource of these certificates (in [`Plan::wants`] order).
    fn build(extra: Self::Extra, certs: Vec<CertificateAndKey>) -> Self::Spec;
}

/// A leaf controller of `P`.
#[derive(Debug)]
pub struct LeafController<P> {
    options: Options,
    part: PhantomData<fn() -> P>,
}

impl<P: LeafPart> LeafController<P> {
    /// A controller with these options.
    pub fn new(options: &Options) -> Self {
        Self {
            options: options.clone(),
            part: PhantomData,
        }
    }

    pub(crate) async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let (plan, extra) = match P::plan(ctx, &self.options).await? {
            Planned::None => return Ok(Action::AwaitChange),
            Planned::Wait => {
                super::source::keep::<P::Spec>(ctx).await?;
                return Ok(Action::AwaitChange);
            }
            Planned::Issue(issue) => issue,
        };
        let ca_cert = Certificate::from_pem(plan.ca.crt.as_bytes())
            .map_err(|e| failed("cannot read the signing CA's certificate", e))?;
        let ca_key = PrivateKey::from_pem(plan.ca.key.as_bytes())
            .map_err(|e| failed("cannot read the signing CA's key", e))?;
        let existing = ctx.get::<P::Spec>(NAMESPACE, P::ID).await?;
        let current = existing
            .as_ref()
            .map(|r| P::current(&r.spec))
            .unwrap_or_default();
        let now = SystemTime::now();
        let mut next: Option<SystemTime> = None;
        let mut certs = Vec::with_capacity(plan.wants.len());
        let mut issued = Vec::new();
        for (i, want) in plan.wants.iter().enumerate() {
            let kept =
                current.get(i).copied().flatten().and_then(|c| {
                    good_until(c, &ca_cert, want, now).map(|until| (c.clone(), until))
                });
            let (cert, until) = match kept {
                Some(kept) => kept,
                None => {
                    let (crt, key) = want
                        .request
                        .issue((&ca_cert, &ca_key), now, want.validity)
                        .map_err(|e| failed("cannot issue a certificate", e))?;
                    let pem = CertificateAndKey {
                        crt: crt.to_pem(),
                        key: key.to_pem().map_err(|e| failed("cannot encode a key", e))?,
                    };
                    issued.push(want.request.subject.common_name.clone().unwrap_or_default());
                    (pem, now + want.validity / 2)
                }
            };
            next = Some(next.map_or(until, |n| n.min(until)));
            certs.push(cert);
        }
        if !issued.is_empty() {
            tracing::info!(
                controller = P::NAME,
                id = P::ID,
                certificates = ?issued,
                renew_in_s = next.and_then(|n| n.duration_since(now).ok()).map(|d| d.as_secs()),
                "issued certificates"
            );
        }
        ctx.apply(Resource::<P::Spec>::new_default(
            P::ID,
            P::build(extra, certs),
        ))
        .await?;
        // At least once a day anyway: the wait runs on the monotonic clock, so a jump of the
        // wall clock (a time sync) is noticed by the next look at the certificates.
        let wait = next
            .and_then(|n| n.duration_since(SystemTime::now()).ok())
            .unwrap_or_default()
            .clamp(Duration::from_secs(1), RECHECK);
        Ok(Action::RequeueAfter(wait))
    }
}

fn failed(context: &str, e: machinery::secrets::SecretsError) -> ReconcileError {
    ReconcileError::Failed {
        context: context.to_string(),
        source: Box::new(e),
    }
}

/// When `stored` must be renewed, if it may be kept at all (see the module's rules).
pub fn good_until(
    stored: &CertificateAndKey,
    ca: &Certificate,
    want: &Want,
    now: SystemTime,
) -> Option<SystemTime> {
    let cert = Certificate::from_pem(stored.crt.as_bytes()).ok()?;
    let key = PrivateKey::from_pem(stored.key.as_bytes()).ok()?;
    let info = cert.info().ok()?;
    let lifetime = info.lifetime();
    let same_lifetime = lifetime.abs_diff(want.validity) <= Duration::from_secs(2);
    let ok = cert.matches_key(&key)
        && cert.is_signed_by(ca)
        && want.request.matches(&info)
        && same_lifetime
        && now + START_SLACK >= info.not_before
        && now < info.half_life();
    ok.then(|| info.half_life())
}

impl<P: LeafPart> Controller for LeafController<P> {
    fn name(&self) -> &'static str {
        P::NAME
    }

    fn inputs(&self) -> Vec<Input> {
        P::inputs()
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

/// Whether the network says its addresses and hostname are ready (upstream waits for both
/// before it mints anything with the node's names).
pub(crate) async fn network_ready(ctx: &Context) -> Result<bool, ReconcileError> {
    Ok(ctx
        .get::<StatusSpec>(NETWORK_NS, STATUS_ID)
        .await?
        .is_some_and(|s| s.spec.address_ready && s.spec.hostname_ready))
}

fn network_inputs() -> Vec<Input> {
    vec![Input::weak::<StatusSpec>(NETWORK_NS).with_id(STATUS_ID)]
}

/// What the API and trustd certificates are made of.
struct OsIssuing {
    ca: CertificateAndKey,
    accepted: Vec<CertificatePem>,
    sans: CertSanSpec,
}

/// The OS root's issuing CA and accepted CAs and the API SANs, once the network is ready.
/// `None` on a node that cannot issue (a worker); `Wait` until the network and the SANs are
/// there.
async fn os_issuing(ctx: &Context) -> Result<Planned<OsIssuing>, ReconcileError> {
    let Some(root) = ctx.get::<OsRootSpec>(NAMESPACE, OS_ROOT_ID).await? else {
        return Ok(Planned::None);
    };
    let Some(ca) = root.spec.issuing_ca.clone() else {
        return Ok(Planned::None);
    };
    if !network_ready(ctx).await? {
        return Ok(Planned::Wait);
    }
    let Some(sans) = ctx.get::<CertSanSpec>(NAMESPACE, CERT_SAN_API_ID).await? else {
        return Ok(Planned::Wait);
    };
    Ok(Planned::Issue(OsIssuing {
        ca,
        accepted: root.spec.accepted_cas,
        sans: sans.spec,
    }))
}

fn os_inputs() -> Vec<Input> {
    let mut inputs = network_inputs();
    inputs.push(Input::weak::<OsRootSpec>(NAMESPACE).with_id(OS_ROOT_ID));
    inputs.push(Input::weak::<CertSanSpec>(NAMESPACE).with_id(CERT_SAN_API_ID));
    inputs
}

/// A Talos API serving certificate (apid's, trustd's) for these SANs: CN = FQDN, server
/// authentication, a key of [`API_SERVING_KEY`] (ECDSA P-256), whatever the OS CA's, so that
/// gRPC's C-core clients get in; one of another algorithm (Ed25519, as before) is reissued.
pub(crate) fn server_request(sans: &CertSanSpec, key_usages: Vec<Usage>) -> LeafRequest {
    LeafRequest {
        subject: Subject {
            organizations: Vec::new(),
            common_name: Some(sans.fqdn.clone()),
        },
        dns_names: sans.dns_names.clone(),
        ips: sans.ips.clone(),
        key_usages,
        extended: vec![ExtendedUsage::ServerAuth],
        key_algorithm: Some(API_SERVING_KEY),
    }
}

/// `ApiCertificates/api` on a control plane: apid's serving certificate (CN = FQDN, the API
/// SANs) and its client certificate for other nodes' apid (O = `os:impersonator`).
#[derive(Debug)]
pub struct Api;

/// The control plane's half of `secrets.APIController` ([`super::api`]).
pub type ApiLeafController = LeafController<Api>;

impl LeafPart for Api {
    type Spec = ApiCertsSpec;
    type Extra = Vec<CertificatePem>;
    const NAME: &'static str = "secrets.APIController";
    const ID: &'static str = API_ID;

    fn inputs() -> Vec<Input> {
        os_inputs()
    }

    async fn plan(
        ctx: &Context,
        options: &Options,
    ) -> Result<Planned<(Plan, Self::Extra)>, ReconcileError> {
        let validity = options.leaf_validity;
        Ok(os_issuing(ctx).await?.map(|os| {
            let server = server_request(&os.sans, vec![Usage::DigitalSignature]);
            let client = LeafRequest {
                subject: Subject {
                    organizations: vec!["os:impersonator".to_string()],
                    common_name: Some(os.sans.fqdn.clone()),
                },
                key_usages: vec![Usage::DigitalSignature],
                extended: vec![ExtendedUsage::ClientAuth],
                ..LeafRequest::default()
            };
            let wants = [server, client]
                .into_iter()
                .map(|request| Want { request, validity })
                .collect();
            (Plan { ca: os.ca, wants }, os.accepted)
        }))
    }

    fn current(spec: &ApiCertsSpec) -> Vec<Option<&CertificateAndKey>> {
        vec![spec.server.as_ref(), spec.client.as_ref()]
    }

    fn build(accepted: Self::Extra, certs: Vec<CertificateAndKey>) -> ApiCertsSpec {
        let mut certs = certs.into_iter();
        ApiCertsSpec {
            accepted_cas: accepted,
            server: certs.next(),
            client: certs.next(),
        }
    }
}

/// `TrustdCertificates/trustd` on a control plane: trustd's serving certificate.
#[derive(Debug)]
pub struct Trustd;

/// `secrets.TrustdController`.
pub type TrustdController = LeafController<Trustd>;

impl LeafPart for Trustd {
    type Spec = TrustdCertsSpec;
    type Extra = Vec<CertificatePem>;
    const NAME: &'static str = "secrets.TrustdController";
    const ID: &'static str = TRUSTD_ID;

    fn inputs() -> Vec<Input> {
        os_inputs()
    }

    async fn plan(
        ctx: &Context,
        options: &Options,
    ) -> Result<Planned<(Plan, Self::Extra)>, ReconcileError> {
        Ok(os_issuing(ctx).await?.map(|os| {
            let request = server_request(
                &os.sans,
                vec![Usage::DigitalSignature, Usage::KeyEncipherment],
            );
            let wants = vec![Want {
                request,
                validity: options.leaf_validity,
            }];
            (Plan { ca: os.ca, wants }, os.accepted)
        }))
    }

    fn current(spec: &TrustdCertsSpec) -> Vec<Option<&CertificateAndKey>> {
        vec![spec.server.as_ref()]
    }

    fn build(accepted: Self::Extra, certs: Vec<CertificateAndKey>) -> TrustdCertsSpec {
        TrustdCertsSpec {
            accepted_cas: accepted,
            server: certs.into_iter().next(),
        }
    }
}

/// `EtcdSecrets/etcd` on a control plane: etcd's server and peer certificates (CN = hostname,
/// the node's names and addresses; the server's also `localhost`, 127.0.0.1 and ::1), the admin
/// client (`talos`) and kube-apiserver's client, all from etcd's CA.
#[derive(Debug)]
pub struct Etcd;

/// `secrets.EtcdController`.
pub type EtcdController = LeafController<Etcd>;

fn etcd_addresses_id() -> String {
    filtered_node_address_id(NODE_ADDRESS_ACCUMULATIVE_ID, FILTER_NO_K8S)
}

/// The four etcd certificates for this hostname and these addresses.
pub fn etcd_wants(hostname: &HostnameStatusSpec, addresses: &NodeAddressSpec) -> Vec<Want> {
    let names = hostname.dns_names();
    let ips: Vec<IpAddr> = addresses.addresses.iter().map(ipnet::IpNet::addr).collect();
    let both = vec![ExtendedUsage::ServerAuth, ExtendedUsage::ClientAuth];
    let usages = vec![Usage::DigitalSignature, Usage::KeyEncipherment];
    let cn = |name: &str| Subject {
        organizations: Vec::new(),
        common_name: Some(name.to_string()),
    };
    let mut server_names = names.clone();
    server_names.push("localhost".to_string());
    let mut server_ips = ips.clone();
    server_ips.extend([
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ]);
    let leaf = |request: LeafRequest| Want {
        request,
        validity: ETCD_VALIDITY,
    };
    let client = |name: &str| LeafRequest {
        subject: cn(name),
        key_usages: usages.clone(),
        extended: vec![ExtendedUsage::ClientAuth],
        ..LeafRequest::default()
    };
    vec![
        leaf(LeafRequest {
            subject: cn(&hostname.hostname),
            dns_names: server_names,
            ips: server_ips,
            key_usages: usages.clone(),
            extended: both.clone(),
            key_algorithm: None,
        }),
        leaf(LeafRequest {
            subject: cn(&hostname.hostname),
            dns_names: names,
            ips,
            key_usages: usages.clone(),
            extended: both,
            key_algorithm: None,
        }),
        leaf(client("talos")),
        leaf(client("kube-apiserver")),
    ]
}

impl LeafPart for Etcd {
    type Spec = EtcdCertsSpec;
    // The CA's certificate, without its key: k8sd reads this type, never the root's.
    type Extra = CertificateAndKey;
    const NAME: &'static str = "secrets.EtcdController";
    const ID: &'static str = ETCD_ID;

    fn inputs() -> Vec<Input> {
        let mut inputs = network_inputs();
        inputs.push(Input::weak::<EtcdRootSpec>(NAMESPACE).with_id(ETCD_ROOT_ID));
        inputs.push(Input::weak::<HostnameStatusSpec>(NETWORK_NS).with_id(HOSTNAME_ID));
        inputs.push(Input::weak::<NodeAddressSpec>(NETWORK_NS).with_id(etcd_addresses_id()));
        inputs
    }

    async fn plan(
        ctx: &Context,
        _options: &Options,
    ) -> Result<Planned<(Plan, Self::Extra)>, ReconcileError> {
        let Some(root) = ctx.get::<EtcdRootSpec>(NAMESPACE, ETCD_ROOT_ID).await? else {
            return Ok(Planned::None);
        };
        if !network_ready(ctx).await? {
            return Ok(Planned::Wait);
        }
        let hostname = ctx
            .get::<HostnameStatusSpec>(NETWORK_NS, HOSTNAME_ID)
            .await?;
        let addresses = ctx
            .get::<NodeAddressSpec>(NETWORK_NS, &etcd_addresses_id())
            .await?;
        let (Some(hostname), Some(addresses)) = (hostname, addresses) else {
            return Ok(Planned::Wait);
        };
        let ca = CertificateAndKey {
            crt: root.spec.etcd_ca.crt.clone(),
            key: String::new(),
        };
        Ok(Planned::Issue((
            Plan {
                ca: root.spec.etcd_ca,
                wants: etcd_wants(&hostname.spec, &addresses.spec),
            },
            ca,
        )))
    }

    fn current(spec: &EtcdCertsSpec) -> Vec<Option<&CertificateAndKey>> {
        vec![
            Some(&spec.etcd),
            Some(&spec.etcd_peer),
            Some(&spec.etcd_admin),
            Some(&spec.etcd_api_server),
        ]
    }

    fn build(ca: CertificateAndKey, certs: Vec<CertificateAndKey>) -> EtcdCertsSpec {
        let mut certs = certs.into_iter();
        let mut next = || certs.next().unwrap_or_default();
        EtcdCertsSpec {
            ca,
            etcd: next(),
            etcd_peer: next(),
            etcd_admin: next(),
            etcd_api_server: next(),
        }
    }
}
