//! `cosi.resource.State` over the network: read-only, through upstream's access filter
//! (`internal/app/resources/access.go`), forwarded to stated as apid's own peer.
//!
//! 1. a write is PERMISSION_DENIED `write access is not allowed`;
//! 2. a type without a ResourceDefinition is PERMISSION_DENIED `resource type "…" is not
//!    supported`;
//! 3. a sensitive type is admin-only (`not authorized`);
//! 4. a namespace that does not exist is PERMISSION_DENIED `namespace "…" is not supported`.
//!
//! Then stated applies its own rule: apid may read only what its manifest entry grants (no CA
//! key, no full machine configuration: talos-rs keeps them out of the network-facing daemon).
//! A read stated refuses says so, and where the redacted copy is.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use cosi::definition::Sensitivity;
use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{NamespaceSpec, ResourceDefinition, ResourceSpec, META_NAMESPACE};
use futures::{Stream, StreamExt};
use proto::state_client::StateClient;
use proto::state_server::State;
use proto::{
    CreateRequest, CreateResponse, DestroyRequest, DestroyResponse, GetRequest, GetResponse,
    ListRequest, ListResponse, TeardownAndDestroyRequest, TeardownAndDestroyResponse,
    TeardownRequest, TeardownResponse, UpdateRequest, UpdateResponse, WatchRequest, WatchResponse,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::auth::caller;

/// How long a forwarded Get or List waits for stated's first answer.
const STATED_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Known {
    types: HashMap<String, Sensitivity>,
    namespaces: HashSet<String>,
}

/// The types and namespaces stated knows, kept by [`CatalogController`], so that the filter
/// costs no round trip.
#[derive(Clone, Debug, Default)]
pub struct Catalog(Arc<RwLock<Known>>);

impl Catalog {
    fn sensitivity(&self, r#type: &str) -> Option<Sensitivity> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .types
            .get(&r#type.to_lowercase())
            .copied()
    }

    fn has_namespace(&self, ns: &str) -> bool {
        ns == META_NAMESPACE
            || self
                .0
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .namespaces
                .contains(ns)
    }
}

/// `apid.CatalogController`: keeps the [`Catalog`] equal to `meta`.
#[derive(Debug)]
pub struct CatalogController {
    catalog: Catalog,
}

impl CatalogController {
    /// A controller filling `catalog`.
    pub fn new(catalog: Catalog) -> Self {
        Self { catalog }
    }

    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let types = ctx
            .list::<ResourceDefinition>(META_NAMESPACE)
            .await?
            .into_iter()
            .map(|d| (d.spec.resource_type.to_lowercase(), d.spec.sensitivity))
            .collect();
        let namespaces = ctx
            .list::<NamespaceSpec>(META_NAMESPACE)
            .await?
            .into_iter()
            .map(|n| n.metadata.id)
            .collect();
        *self.catalog.0.write().unwrap_or_else(|e| e.into_inner()) = Known { types, namespaces };
        Ok(Action::AwaitChange)
    }
}

impl Controller for CatalogController {
    fn name(&self) -> &'static str {
        "apid.CatalogController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::weak::<ResourceDefinition>(META_NAMESPACE),
            Input::weak::<NamespaceSpec>(META_NAMESPACE),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        Vec::new()
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

/// The State service apid serves.
#[derive(Clone, Debug)]
pub struct ReadOnlyState {
    stated: StateClient<Channel>,
    /// For a type or namespace the catalog has not seen yet (just defined).
    client: cosi::Client,
    catalog: Catalog,
    /// Open watches are shared fairly among clients.
    pool: crate::share::Pool,
}

type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl ReadOnlyState {
    /// The service over stated's `channel`.
    pub fn new(
        channel: Channel,
        client: cosi::Client,
        catalog: Catalog,
        pool: crate::share::Pool,
    ) -> Self {
        Self {
            pool,
            stated: StateClient::new(channel)
                .max_decoding_message_size(cosi::client::MAX_MESSAGE)
                .max_encoding_message_size(cosi::client::MAX_MESSAGE),
            client,
            catalog,
        }
    }

    async fn sensitivity(&self, r#type: &str) -> Result<Sensitivity, Status> {
        if let Some(s) = self.catalog.sensitivity(r#type) {
            return Ok(s);
        }
        match self
            .client
            .get_typed::<ResourceDefinition>(META_NAMESPACE, &r#type.to_lowercase())
            .await
        {
            Ok(d) => Ok(d.spec.sensitivity),
            Err(e) if e.is_not_found() => Err(Status::permission_denied(format!(
                "resource type {type:?} is not supported"
            ))),
            Err(e) => Err(unavailable(&e.to_string())),
        }
    }

    async fn has_namespace(&self, ns: &str) -> Result<bool, Status> {
        if self.catalog.has_namespace(ns) {
            return Ok(true);
        }
        match self
            .client
            .get(META_NAMESPACE, NamespaceSpec::TYPE, ns)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(unavailable(&e.to_string())),
        }
    }

    /// Upstream's filter for a read of `type` in `ns` by the request's caller.
    async fn check<T>(&self, req: &Request<T>, ns: &str, r#type: &str) -> Result<(), Status> {
        let roles = caller(req)?;
        if self.sensitivity(r#type).await? == Sensitivity::Sensitive && !roles.is_admin() {
            return Err(Status::permission_denied(format!(
                "not authorized: {type} is sensitive (os:admin only); the client has {roles}"
            )));
        }
        if !self.has_namespace(ns).await? {
            return Err(Status::permission_denied(format!(
                "namespace {ns:?} is not supported"
            )));
        }
        Ok(())
    }
}

fn unavailable(e: &str) -> Status {
    Status::unavailable(format!("stated is not answering apid: {e}"))
}

/// stated's answer, explained where it is apid's own limit; no answer (stated down, frozen
/// or restarting: the call timed out or the connection broke) is Unavailable, saying so.
fn explain(ns: &str, r#type: &str, s: Status) -> Status {
    use tonic::Code;
    match s.code() {
        Code::PermissionDenied => {}
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Unknown => {
            return unavailable(&format!("{ns}/{type}: {}", s.message()));
        }
        _ => return s,
    }
    let hint = if ns == machinery::resources::config::NAMESPACE {
        format!(
            "; the copy without secrets is in namespace {:?}",
            machinery::resources::config::REDACTED_NAMESPACE
        )
    } else {
        String::new()
    };
    Status::permission_denied(format!(
        "apid may not read {ns}/{type} on this node: talos-rs keeps key material out of the \
         network-facing daemon (read it on the node, as root){hint} ({})",
        s.message()
    ))
}

fn write_denied() -> Status {
    Status::permission_denied("write access is not allowed")
}

#[tonic::async_trait]
impl State for ReadOnlyState {
    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let (ns, ty) = (
            req.get_ref().namespace.clone(),
            req.get_ref().r#type.clone(),
        );
        self.check(&req, &ns, &ty).await?;
        let mut forwarded = Request::new(req.into_inner());
        forwarded.set_timeout(STATED_TIMEOUT);
        self.stated
            .clone()
            .get(forwarded)
            .await
            .map_err(|s| explain(&ns, &ty, s))
    }

    type ListStream = Streamed<ListResponse>;

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<Self::ListStream>, Status> {
        let (ns, ty) = (
            req.get_ref().namespace.clone(),
            req.get_ref().r#type.clone(),
        );
        self.check(&req, &ns, &ty).await?;
        let mut forwarded = Request::new(req.into_inner());
        forwarded.set_timeout(STATED_TIMEOUT);
        let stream = self
            .stated
            .clone()
            .list(forwarded)
            .await
            .map_err(|s| explain(&ns, &ty, s))?
            .into_inner();
        let stream = stream.map(move |r| r.map_err(|s| explain(&ns, &ty, s)));
        Ok(Response::new(Box::pin(stream)))
    }

    type WatchStream = Streamed<WatchResponse>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (ns, ty) = (
            req.get_ref().namespace.clone(),
            req.get_ref().r#type.clone(),
        );
        self.check(&req, &ns, &ty).await?;
        let roles = caller(&req)?;
        // Each watch is one of apid's at stated: a client holds its share of them, and a
        // watch its client stops reading is ended (stated's is released with it).
        let share = self.pool.watches.take(&*crate::auth::who(&req)?)?;
        let stream = self
            .stated
            .clone()
            .watch(Request::new(req.into_inner()))
            .await
            .map_err(|s| explain(&ns, &ty, s))?
            .into_inner();
        // The type's sensitivity is checked again before every event: a watch opened while
        // the type was readable (a definition made sensitive later, by an upgrade of its
        // daemon) hands a non-admin nothing from then on, neither live events nor the past
        // ones a tail or a bookmark replays.
        let catalog = self.catalog.clone();
        let mut refused = false;
        let stream = stream
            .map(move |r| {
                if !roles.is_admin() && catalog.sensitivity(&ty) == Some(Sensitivity::Sensitive) {
                    return Err(Status::permission_denied(format!(
                        "not authorized: {ty} is sensitive (os:admin only); the client has {roles}"
                    )));
                }
                r.map_err(|s| explain(&ns, &ty, s))
            })
            .take_while(move |r| {
                let go = !refused;
                refused |= matches!(r, Err(s) if s.code() == tonic::Code::PermissionDenied);
                std::future::ready(go)
            });
        Ok(Response::new(crate::share::stall_bounded(
            Box::pin(stream),
            share,
            crate::share::STALL,
        )))
    }

    async fn create(&self, _: Request<CreateRequest>) -> Result<Response<CreateResponse>, Status> {
        Err(write_denied())
    }

    async fn update(&self, _: Request<UpdateRequest>) -> Result<Response<UpdateResponse>, Status> {
        Err(write_denied())
    }

    async fn destroy(
        &self,
        _: Request<DestroyRequest>,
    ) -> Result<Response<DestroyResponse>, Status> {
        Err(write_denied())
    }

    async fn teardown(
        &self,
        _: Request<TeardownRequest>,
    ) -> Result<Response<TeardownResponse>, Status> {
        Err(write_denied())
    }

    async fn teardown_and_destroy(
        &self,
        _: Request<TeardownAndDestroyRequest>,
    ) -> Result<Response<TeardownAndDestroyResponse>, Status> {
        Err(write_denied())
    }
}
