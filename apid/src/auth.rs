//! Who is calling and what they may call: roles from the client certificate's Organization, as
//! upstream (`pkg/machinery/role`, `authz.Injector` in mode Enabled), and upstream's per-method
//! rules (`machined.go`'s rules table), enforced by one layer in front of every service so that
//! no handler can forget the check. A method the table does not name is admin-only, as upstream.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use machinery::tls::ConnectInfo;
use tonic::body::Body;
use tonic::Status;

/// Everything.
pub const ADMIN: &str = "os:admin";
/// Reader, plus management that exposes no secret (reboot, services).
pub const OPERATOR: &str = "os:operator";
/// Read-only APIs that expose no secret.
pub const READER: &str = "os:reader";
/// etcd snapshots and etcd reads.
pub const ETCD_BACKUP: &str = "os:etcd:backup";
/// The holder's roles are replaced by those in the `talos-role` metadata (apid to apid).
pub const IMPERSONATOR: &str = "os:impersonator";

/// The roles upstream knows; others are kept (forward compatibility) but grant nothing.
pub const KNOWN: &[&str] = machinery::resources::apid::KNOWN_ROLES;

/// The metadata key carrying the roles of a forwarded request.
pub const ROLE_METADATA: &str = "talos-role";

/// The roles of a caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roles(BTreeSet<String>);

impl Roles {
    /// Roles as upstream's `role.Parse`: trimmed, empty ones skipped.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        Roles(
            values
                .into_iter()
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    /// Whether the caller has `role`.
    pub fn has(&self, role: &str) -> bool {
        self.0.contains(role)
    }

    /// Whether the caller is an admin.
    pub fn is_admin(&self) -> bool {
        self.has(ADMIN)
    }

    /// Whether any of the caller's roles is in `allowed`.
    pub fn any_of(&self, allowed: &[&str]) -> bool {
        allowed.iter().any(|r| self.has(r))
    }

    /// The roles, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no role");
        }
        f.write_str(&self.iter().collect::<Vec<_>>().join(", "))
    }
}

/// The roles of a request: the Organization values of the client's certificate; with
/// `os:impersonator` among them and `talos-role` metadata present, the metadata's values
/// instead (how one apid forwards its user's roles to another).
///
/// # Errors
///
/// UNAUTHENTICATED without a client certificate (the handshake requires one, so only a bug
/// gets here) or with one that does not parse.
pub fn roles_of(info: Option<&ConnectInfo>, metadata: &http::HeaderMap) -> Result<Roles, Status> {
    let organizations = info
        .and_then(|i| i.peer_organizations.as_deref())
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?
        .as_ref()
        .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
    let roles = Roles::parse(organizations.iter().map(String::as_str));
    if roles.has(IMPERSONATOR) {
        let forwarded: Vec<&str> = metadata
            .get_all(ROLE_METADATA)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .collect();
        if !forwarded.is_empty() {
            return Ok(Roles::parse(forwarded));
        }
    }
    Ok(roles)
}

const A: &str = ADMIN;
const O: &str = OPERATOR;
const R: &str = READER;
const E: &str = ETCD_BACKUP;

/// Upstream's rules for the methods apid serves (api-pki.md §1.2): the roles any one of which
/// allows the call. Anything else is [`ADMIN`] only.
const RULES: &[(&str, &[&str])] = &[
    ("/machine.MachineService/Dmesg", &[A, O, R]),
    ("/machine.MachineService/Mounts", &[A, O, R]),
    ("/storage.StorageService/Disks", &[A, O, R]),
    ("/machine.MachineService/Hostname", &[A, O, R]),
    ("/machine.MachineService/Logs", &[A, O, R]),
    ("/machine.MachineService/Reboot", &[A, O]),
    ("/machine.MachineService/ServiceList", &[A, O, R]),
    ("/machine.MachineService/ServiceRestart", &[A, O]),
    ("/machine.MachineService/ServiceStart", &[A, O]),
    ("/machine.MachineService/ServiceStop", &[A, O]),
    ("/machine.MachineService/Shutdown", &[A, O]),
    ("/machine.MachineService/Version", &[A, O, R]),
    // Ours: what every daemon's sandbox is, read-only like the service list.
    ("/talosrs.audit.AuditService/Audit", &[A, O, R]),
    ("/machine.MachineService/EtcdMemberList", &[A, O, R, E]),
    ("/machine.MachineService/EtcdSnapshot", &[A, O, E]),
    ("/machine.MachineService/EtcdStatus", &[A, O, R, E]),
    ("/machine.MachineService/EtcdAlarmList", &[A, O, R, E]),
    ("/machine.MachineService/EtcdAlarmDisarm", &[A, O]),
    ("/machine.MachineService/EtcdDefragment", &[A, O]),
    ("/cosi.resource.State/Get", &[A, O, R]),
    ("/cosi.resource.State/List", &[A, O, R]),
    ("/cosi.resource.State/Watch", &[A, O, R]),
];

/// The roles that may call `method` (a gRPC path, `/package.Service/Method`).
pub fn allowed(method: &str) -> &'static [&'static str] {
    RULES
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, roles)| *roles)
        .unwrap_or(&[A])
}

/// Checks that `roles` may call `method`.
///
/// # Errors
///
/// PERMISSION_DENIED, naming the roles that would do.
pub fn authorize(method: &str, roles: &Roles) -> Result<(), Status> {
    let allowed = allowed(method);
    if roles.any_of(allowed) {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "not authorized: {method} needs {}; the client has {roles}",
        allowed.join(" or ")
    )))
}

/// Who is calling, for fair shares ([`crate::share`]): one client certificate, or without one
/// the caller's address; whether it may write (os:admin, os:operator) and whether it has no
/// certificate. In every request's extensions (put there by [`AuthzLayer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The certificate's fingerprint, or the address (`ConnectInfo::client_key`).
    pub key: String,
    /// os:admin or os:operator: gets the part of every share kept for admins.
    pub admin: bool,
    /// No client certificate (the maintenance API): a smaller share.
    pub anonymous: bool,
}

/// The method a client without a certificate may call in maintenance beside the reader's.
pub const MAINTENANCE_APPLY: &str = "/machine.MachineService/ApplyConfiguration";

/// In a request's extensions: the caller came in through the maintenance API, without a
/// certificate (only [`AuthzLayer`] puts it there).
#[derive(Clone, Copy, Debug)]
pub struct Maintenance;

/// The roles of a caller without a certificate while the node is in maintenance: upstream's
/// (reader, plus ApplyConfiguration, which the node itself refuses once it is configured).
fn maintenance_roles(method: &str) -> Result<Roles, Status> {
    let reader = Roles::parse([READER]);
    if method == MAINTENANCE_APPLY {
        return Ok(reader);
    }
    // Not to anyone on the network: the kernel log and the mounts say much about the machine
    // (upstream's maintenance service has neither).
    let not_anonymous = [
        "/machine.MachineService/Dmesg",
        "/machine.MachineService/Mounts",
    ];
    if not_anonymous.contains(&method) {
        return Err(Status::permission_denied(format!(
            "{method} is not available in maintenance mode (the node has no configuration yet)"
        )));
    }
    authorize(method, &reader).map(|()| reader).map_err(|_| {
        Status::permission_denied(format!(
            "{method} is not available in maintenance mode (the node has no configuration yet)"
        ))
    })
}

/// The layer that authenticates and authorizes every request before any service sees it, and
/// hands the caller's [`Roles`] to the handler in the request's extensions.
#[derive(Clone, Debug, Default)]
pub struct AuthzLayer {
    open: machinery::tls::ClientCas,
}

impl AuthzLayer {
    /// The layer of a server whose client CAs are `cas`: while they are open (maintenance), a
    /// caller without a certificate gets the maintenance API.
    pub fn new(cas: machinery::tls::ClientCas) -> Self {
        AuthzLayer { open: cas }
    }
}

impl<S> tower::Layer<S> for AuthzLayer {
    type Service = Authz<S>;

    fn layer(&self, inner: S) -> Authz<S> {
        Authz {
            inner,
            open: self.open.clone(),
        }
    }
}

/// See [`AuthzLayer`].
#[derive(Clone, Debug)]
pub struct Authz<S> {
    inner: S,
    open: machinery::tls::ClientCas,
}

impl<S> tower::Service<http::Request<Body>> for Authz<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let method = req.uri().path().to_string();
        let info = req.extensions().get::<ConnectInfo>();
        let anonymous = info.is_none_or(|i| i.peer_certificates.is_empty());
        let maintenance = anonymous && self.open.is_open();
        let checked = if maintenance {
            maintenance_roles(&method)
        } else {
            roles_of(info, req.headers())
                .and_then(|roles| authorize(&method, &roles).map(|()| roles))
        };
        match checked {
            Ok(roles) => {
                let who = Caller {
                    key: info.map_or_else(|| "unknown".to_string(), ConnectInfo::client_key),
                    admin: roles.any_of(&[ADMIN, OPERATOR]),
                    anonymous,
                };
                req.extensions_mut().insert(Arc::new(who));
                req.extensions_mut().insert(Arc::new(roles));
                if maintenance {
                    req.extensions_mut().insert(Maintenance);
                }
                let fut = self.inner.call(req);
                Box::pin(fut)
            }
            Err(status) => {
                let remote = req
                    .extensions()
                    .get::<ConnectInfo>()
                    .map(|i| i.remote.to_string())
                    .unwrap_or_default();
                tracing::info!(%remote, %method, error = %status.message(), "request refused");
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// Who the caller is, as [`AuthzLayer`] found it.
///
/// # Errors
///
/// UNAUTHENTICATED when the layer did not run (a bug).
pub fn who<T>(req: &tonic::Request<T>) -> Result<Arc<Caller>, Status> {
    req.extensions()
        .get::<Arc<Caller>>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the caller is unknown"))
}

/// The caller's roles, as [`AuthzLayer`] found them.
///
/// # Errors
///
/// UNAUTHENTICATED when the layer did not run (a bug).
pub fn caller<T>(req: &tonic::Request<T>) -> Result<Arc<Roles>, Status> {
    req.extensions()
        .get::<Arc<Roles>>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the caller's roles are unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_trimmed_and_empty_ones_skipped() {
        let r = Roles::parse([" os:reader ", "", "os:future"]);
        assert!(r.has(READER));
        assert!(r.has("os:future"));
        assert_eq!(r.iter().count(), 2);
        assert_eq!(Roles::parse([""]).to_string(), "no role");
    }

    #[test]
    fn anonymous_maintenance_callers_get_no_kernel_log() {
        assert!(maintenance_roles("/machine.MachineService/Version").is_ok());
        assert!(maintenance_roles(MAINTENANCE_APPLY).is_ok());
        let e = maintenance_roles("/machine.MachineService/Dmesg").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(maintenance_roles("/machine.MachineService/Reboot").is_err());
        // A reader with a certificate may read it.
        assert!(authorize("/machine.MachineService/Dmesg", &Roles::parse([READER])).is_ok());
        assert!(maintenance_roles("/machine.MachineService/Mounts").is_err());
        assert!(authorize("/machine.MachineService/Mounts", &Roles::parse([READER])).is_ok());
    }

    #[test]
    fn etcd_and_kubeconfig_calls_follow_upstreams_roles() {
        let m = |name: &str| format!("/machine.MachineService/{name}");
        let backup = Roles::parse([ETCD_BACKUP]);
        let reader = Roles::parse([READER]);
        let operator = Roles::parse([OPERATOR]);
        // A backup role takes snapshots and reads status, nothing else.
        authorize(&m("EtcdSnapshot"), &backup).unwrap();
        authorize(&m("EtcdStatus"), &backup).unwrap();
        for admin_only in [
            "EtcdRecover",
            "EtcdLeaveCluster",
            "EtcdRemoveMemberByID",
            "EtcdForfeitLeadership",
            "Kubeconfig",
            "Bootstrap",
        ] {
            for who in [&backup, &reader, &operator] {
                assert!(
                    authorize(&m(admin_only), who).is_err(),
                    "{admin_only}: {who}"
                );
            }
            authorize(&m(admin_only), &Roles::parse([ADMIN])).unwrap();
        }
        // An operator defragments and disarms; a reader only lists.
        authorize(&m("EtcdDefragment"), &operator).unwrap();
        authorize(&m("EtcdAlarmDisarm"), &operator).unwrap();
        assert!(authorize(&m("EtcdDefragment"), &reader).is_err());
        assert!(authorize(&m("EtcdSnapshot"), &reader).is_err());
        authorize(&m("EtcdAlarmList"), &reader).unwrap();
    }

    #[test]
    fn unknown_methods_are_admin_only() {
        assert_eq!(allowed("/machine.MachineService/Read"), &[ADMIN]);
        assert_eq!(allowed("/cosi.resource.State/Create"), &[ADMIN]);
        let reader = Roles::parse([READER]);
        let operator = Roles::parse([OPERATOR]);
        authorize("/machine.MachineService/Version", &reader).unwrap();
        authorize("/talosrs.audit.AuditService/Audit", &reader).unwrap();
        authorize("/cosi.resource.State/List", &reader).unwrap();
        let e = authorize("/machine.MachineService/Reboot", &reader).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("os:admin or os:operator"),
            "{}",
            e.message()
        );
        authorize("/machine.MachineService/Reboot", &operator).unwrap();
        assert!(authorize("/cosi.resource.State/Update", &operator).is_err());
        assert!(authorize("/machine.MachineService/Version", &Roles::default()).is_err());
        authorize("/anything/Else", &Roles::parse([ADMIN])).unwrap();
        // An impersonator is nobody until it names the roles it forwards.
        assert!(authorize(
            "/machine.MachineService/Version",
            &Roles::parse([IMPERSONATOR])
        )
        .is_err());
    }
}
