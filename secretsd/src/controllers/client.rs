//! `secrets.ClientCertificateController` (ours): Talos API client certificates for apid's
//! `GenerateClientConfiguration`. Upstream's machined signs them itself, holding the whole
//! configuration; here only secretsd holds the OS CA key, so apid asks through a resource
//! (`apid/ClientCertificateRequests`: a CSR for a key apid made and keeps, the roles, the
//! validity) and secretsd answers under the same ID in `secrets/ClientCertificates`: the
//! certificate and the OS CA's, or why none was signed (a worker holds no CA key). An answer
//! whose request is gone is destroyed; at most
//! [`MAX_CLIENT_CERTIFICATE_REQUESTS`] requests are answered with a certificate, the others with
//! an error, so a flood of requests cannot make secretsd sign without bound.
//!
//! Only apid may write its namespace (stated checks the writer's uid), so a request comes from
//! apid, which admits GenerateClientConfiguration from `os:admin` only. The roles are
//! re-checked against upstream's known set here: an unknown role is not signed.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, SystemTime};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use machinery::resources::apid::{
    ClientCertificateRequestSpec, AUTHORITY_KUBERNETES, AUTHORITY_OS, KNOWN_ROLES,
    MAX_CLIENT_CERTIFICATE_REQUESTS, NAMESPACE as APID_NS,
};
use machinery::resources::secrets::{
    ClientCertificateSpec, KubernetesRootSpec, OsRootSpec, KUBERNETES_ROOT_ID, NAMESPACE,
    OS_ROOT_ID,
};
use machinery::secrets::x509::{self, Certificate, PrivateKey};

/// Upstream's refusal on a worker, word for word.
pub const WORKER_REFUSAL: &str =
    "client configuration (talosconfig) can't be generated on worker nodes";

/// `secrets.ClientCertificateController`.
#[derive(Debug, Default)]
pub struct ClientCertificateController;

/// The admin of `talosctl kubeconfig` (upstream's defaults of `cluster.adminKubeconfig`).
pub const KUBERNETES_ADMIN: (&str, &str) = ("admin", "system:masters");

/// The answer to one request: the certificate or why none.
fn answer(
    roots: (Option<&OsRootSpec>, Option<&KubernetesRootSpec>),
    request: &ClientCertificateRequestSpec,
    now: SystemTime,
) -> ClientCertificateSpec {
    let mut out = ClientCertificateSpec {
        csr: request.csr.clone(),
        ..ClientCertificateSpec::default()
    };
    let signed = match request.authority.as_str() {
        AUTHORITY_OS => sign(roots.0, request, now),
        AUTHORITY_KUBERNETES => sign_kubernetes(roots.1, request, now),
        other => Err(format!("unknown authority {other:?}")),
    };
    match signed {
        Ok((crt, ca)) => {
            out.crt = crt;
            out.ca = ca;
        }
        Err(e) => out.error = e,
    }
    out
}

fn sign(
    root: Option<&OsRootSpec>,
    request: &ClientCertificateRequestSpec,
    now: SystemTime,
) -> Result<(String, String), String> {
    let Some(root) = root else {
        return Err("the node has no OS CA yet (no machine configuration)".into());
    };
    let Some(ca) = &root.issuing_ca else {
        return Err(WORKER_REFUSAL.into());
    };
    if let Some(bad) = request
        .roles
        .iter()
        .find(|r| !KNOWN_ROLES.contains(&r.as_str()))
    {
        return Err(format!("unknown role {bad:?}"));
    }
    if request.ttl_seconds == 0 {
        return Err("crt_ttl should be positive".into());
    }
    let crt = Certificate::from_pem(ca.crt.as_bytes()).map_err(|e| format!("the OS CA: {e}"))?;
    let key = PrivateKey::from_pem(ca.key.as_bytes()).map_err(|e| format!("the OS CA key: {e}"))?;
    let signed = x509::sign_client_csr(
        (&crt, &key),
        request.csr.as_bytes(),
        &request.roles,
        now,
        Duration::from_secs(request.ttl_seconds),
    )
    .map_err(|e| e.to_string())?;
    Ok((signed.to_pem(), ca.crt.clone()))
}

/// An admin certificate of the Kubernetes CA; the answer's `ca` is every CA a Kubernetes
/// client should trust (the accepted ones, then the issuing one), as upstream's kubeconfig.
fn sign_kubernetes(
    root: Option<&KubernetesRootSpec>,
    request: &ClientCertificateRequestSpec,
    now: SystemTime,
) -> Result<(String, String), String> {
    let Some(root) = root else {
        return Err("kubeconfig is only available on control plane nodes".into());
    };
    let Some(ca) = &root.issuing_ca else {
        return Err("kubeconfig is only available on control plane nodes".into());
    };
    if !request.roles.is_empty() {
        return Err("a Kubernetes client certificate carries no Talos role".into());
    }
    if request.ttl_seconds == 0 {
        return Err("the certificate lifetime should be positive".into());
    }
    let crt =
        Certificate::from_pem(ca.crt.as_bytes()).map_err(|e| format!("the Kubernetes CA: {e}"))?;
    let key = PrivateKey::from_pem(ca.key.as_bytes())
        .map_err(|e| format!("the Kubernetes CA key: {e}"))?;
    let (cn, o) = KUBERNETES_ADMIN;
    let signed = x509::sign_kubernetes_client_csr(
        (&crt, &key),
        request.csr.as_bytes(),
        cn,
        o,
        now,
        Duration::from_secs(request.ttl_seconds),
    )
    .map_err(|e| e.to_string())?;
    let mut cas: Vec<String> = root.accepted_cas.iter().map(|c| c.crt.clone()).collect();
    if !cas.contains(&ca.crt) {
        cas.push(ca.crt.clone());
    }
    Ok((signed.to_pem(), cas.concat()))
}

impl ClientCertificateController {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let root = ctx
            .get::<OsRootSpec>(NAMESPACE, OS_ROOT_ID)
            .await?
            .map(|r| r.spec);
        let k8s = ctx
            .get::<KubernetesRootSpec>(NAMESPACE, KUBERNETES_ROOT_ID)
            .await?
            .map(|r| r.spec);
        let requests = ctx.list::<ClientCertificateRequestSpec>(APID_NS).await?;
        let answers = ctx.list::<ClientCertificateSpec>(NAMESPACE).await?;
        let wanted: BTreeSet<&str> = requests.iter().map(|r| r.metadata.id.as_str()).collect();
        for a in &answers {
            if !wanted.contains(a.metadata.id.as_str()) {
                ctx.destroy::<ClientCertificateSpec>(NAMESPACE, &a.metadata.id)
                    .await?;
            }
        }
        let now = SystemTime::now();
        for (i, request) in requests.iter().enumerate() {
            let id = &request.metadata.id;
            let answered = answers
                .iter()
                .any(|a| &a.metadata.id == id && a.spec.csr == request.spec.csr);
            if answered {
                continue;
            }
            let spec = if i < MAX_CLIENT_CERTIFICATE_REQUESTS {
                answer((root.as_ref(), k8s.as_ref()), &request.spec, now)
            } else {
                ClientCertificateSpec {
                    csr: request.spec.csr.clone(),
                    error: format!(
                        "more than {MAX_CLIENT_CERTIFICATE_REQUESTS} client certificate requests are open"
                    ),
                    ..ClientCertificateSpec::default()
                }
            };
            if spec.error.is_empty() {
                tracing::info!(request = %id, authority = %request.spec.authority, roles = ?request.spec.roles, ttl_seconds = request.spec.ttl_seconds, "client certificate signed for apid");
            } else {
                tracing::warn!(request = %id, error = %spec.error, "client certificate refused");
            }
            ctx.apply(Resource::new_default(id.clone(), spec)).await?;
        }
        Ok(Action::AwaitChange)
    }
}

impl Controller for ClientCertificateController {
    fn name(&self) -> &'static str {
        "secrets.ClientCertificateController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<OsRootSpec>(NAMESPACE).with_id(OS_ROOT_ID),
            Input::weak::<KubernetesRootSpec>(NAMESPACE).with_id(KUBERNETES_ROOT_ID),
            Input::weak::<ClientCertificateRequestSpec>(APID_NS),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<ClientCertificateSpec>()]
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
    use machinery::resources::secrets::CertificateAndKey;
    use machinery::secrets::x509::{KeyAlgorithm, LeafRequest, Subject};

    fn root() -> OsRootSpec {
        let subject = Subject {
            organizations: vec!["talos".into()],
            common_name: None,
        };
        let (crt, key) =
            x509::self_signed_ca(&subject, KeyAlgorithm::Ed25519, SystemTime::now()).unwrap();
        OsRootSpec {
            issuing_ca: Some(CertificateAndKey {
                crt: crt.to_pem(),
                key: key.to_pem().unwrap(),
            }),
            ..OsRootSpec::default()
        }
    }

    fn request(roles: &[&str]) -> ClientCertificateRequestSpec {
        let (csr, _) = LeafRequest::default().csr(KeyAlgorithm::Ed25519).unwrap();
        ClientCertificateRequestSpec {
            csr,
            roles: roles.iter().map(|r| r.to_string()).collect(),
            ttl_seconds: 3600,
            authority: String::new(),
        }
    }

    #[test]
    fn signs_known_roles_and_refuses_the_rest_by_name() {
        let root = root();
        let now = SystemTime::now();
        let ok = answer((Some(&root), None), &request(&["os:reader"]), now);
        assert!(ok.error.is_empty(), "{}", ok.error);
        let info = Certificate::from_pem(ok.crt.as_bytes())
            .unwrap()
            .info()
            .unwrap();
        assert_eq!(info.organizations, vec!["os:reader".to_string()]);
        assert!(info.client_auth && !info.server_auth && !info.is_ca);
        assert_eq!(ok.ca, root.issuing_ca.as_ref().unwrap().crt);

        let bad = answer((Some(&root), None), &request(&["os:root"]), now);
        assert_eq!(bad.error, "unknown role \"os:root\"");
        assert!(bad.crt.is_empty());

        let mut worker = root.clone();
        worker.issuing_ca = None;
        assert_eq!(
            answer((Some(&worker), None), &request(&["os:admin"]), now).error,
            WORKER_REFUSAL
        );
        let mut forever = request(&["os:admin"]);
        forever.ttl_seconds = u64::MAX;
        assert!(answer((Some(&root), None), &forever, now)
            .error
            .contains("longer than 100 years"));
        let mut garbage = request(&["os:admin"]);
        garbage.csr =
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".into();
        assert!(!answer((Some(&root), None), &garbage, now).error.is_empty());
    }

    #[test]
    fn a_kubernetes_admin_is_signed_by_the_kubernetes_ca_only_on_a_control_plane() {
        let os = root();
        let k8s_ca = root().issuing_ca.unwrap();
        let k8s = KubernetesRootSpec {
            issuing_ca: Some(k8s_ca.clone()),
            ..KubernetesRootSpec::default()
        };
        let now = SystemTime::now();
        let mut req = request(&[]);
        req.authority = AUTHORITY_KUBERNETES.into();
        let ok = answer((Some(&os), Some(&k8s)), &req, now);
        assert!(ok.error.is_empty(), "{}", ok.error);
        let crt = Certificate::from_pem(ok.crt.as_bytes()).unwrap();
        let info = crt.info().unwrap();
        assert_eq!(info.common_name.as_deref(), Some("admin"));
        assert_eq!(info.organizations, vec!["system:masters".to_string()]);
        assert!(info.client_auth && !info.server_auth && !info.is_ca);
        assert_eq!(ok.ca, k8s_ca.crt);

        // Roles are the Talos API's: refused here; no Kubernetes CA key: refused.
        let mut with_role = req.clone();
        with_role.roles = vec!["os:admin".into()];
        assert!(!answer((Some(&os), Some(&k8s)), &with_role, now)
            .error
            .is_empty());
        let worker = KubernetesRootSpec::default();
        assert!(answer((Some(&os), Some(&worker)), &req, now)
            .error
            .contains("only available on control plane nodes"));
        let mut unknown = req.clone();
        unknown.authority = "etcd".into();
        assert!(answer((Some(&os), Some(&k8s)), &unknown, now)
            .error
            .contains("unknown authority"));
    }
}
