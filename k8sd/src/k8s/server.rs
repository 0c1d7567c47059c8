//! `k8s.StaticPodServerController`: every `StaticPod` as one YAML `PodList`, served over HTTP
//! on `127.0.0.1:<port>` (the kernel picks the port; `StaticPodServerStatuses` publishes the
//! URL), as upstream's: `/` answers the list (500 until it is first built), rebuilt on every
//! change of the pods. Loopback only; at most [`MAX_CONNECTIONS`] connections at once, each
//! closed after [`CONNECTION_TIMEOUT`]: what a client of the node's loopback sends cannot hold
//! k8sd's memory.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::Resource;
use http_body_util::Full;
use hyper::body::Bytes;
use machinery::resources::k8s::{
    StaticPodServerStatusSpec, StaticPodSpec, NAMESPACE, STATIC_POD_SERVER_ID,
};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection may stay open.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What the status says about who runs the pods.
pub const NOT_RUN: &str = "rendered and served, not run: no kubelet runs on a talos-rs node yet";

/// `k8s.StaticPodServerController`.
#[derive(Default)]
pub struct StaticPodServerController {
    /// The served list (`None` until built).
    list: Arc<RwLock<Option<Bytes>>>,
    /// Where it listens, once bound.
    addr: Option<SocketAddr>,
}

async fn serve(listener: tokio::net::TcpListener, list: Arc<RwLock<Option<Bytes>>>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let list = list.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |_req| {
                let body = list.read().ok().and_then(|l| l.clone());
                async move {
                    let resp = match body {
                        Some(b) => hyper::Response::builder()
                            .header("content-type", "application/yaml")
                            .body(Full::new(b)),
                        None => hyper::Response::builder().status(500).body(Full::new(
                            Bytes::from_static(b"static pod list not rendered yet\n"),
                        )),
                    };
                    Ok::<_, Infallible>(resp.unwrap_or_else(|_| {
                        hyper::Response::new(Full::new(Bytes::from_static(b"")))
                    }))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .max_buf_size(16 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
    }
}

impl Controller for StaticPodServerController {
    fn name(&self) -> &'static str {
        "k8s.StaticPodServerController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<StaticPodSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<StaticPodServerStatusSpec>()]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        if self.addr.is_none() {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| ReconcileError::failed("cannot listen on 127.0.0.1", e))?;
            let addr = listener
                .local_addr()
                .map_err(|e| ReconcileError::failed("the listener has no address", e))?;
            tokio::spawn(serve(listener, self.list.clone()));
            tracing::info!(%addr, "static pod server listening");
            self.addr = Some(addr);
        }
        let mut pods = ctx.list::<StaticPodSpec>(NAMESPACE).await?;
        pods.sort_by(|a, b| a.id().cmp(b.id()));
        let items: Vec<serde_json::Value> = pods.iter().map(|p| p.spec.pod.clone()).collect();
        let bytes = super::pods::pod_list(&items)
            .map_err(|e| ReconcileError::failed("cannot render the static pod list", e))?;
        if let Ok(mut l) = self.list.write() {
            *l = Some(Bytes::from(bytes));
        }
        if let Some(addr) = self.addr {
            ctx.apply(Resource::new(
                NAMESPACE,
                STATIC_POD_SERVER_ID,
                StaticPodServerStatusSpec {
                    url: format!("http://{addr}"),
                    note: NOT_RUN.to_string(),
                },
            ))
            .await?;
        }
        Ok(Action::AwaitChange)
    }
}
