//! Helpers shared by stated's integration tests.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use cosi::{Metadata, RawResource};
use hyper_util::rt::TokioIo;
use proto::state_client::StateClient;
use tonic::transport::{Channel, Endpoint};

/// A raw gRPC client, to send what `cosi::Client` would never send.
pub async fn raw(socket: &std::path::Path) -> StateClient<Channel> {
    let p = socket.to_path_buf();
    let ch = Endpoint::from_static("http://stated.local")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
            }
        }))
        .await
        .expect("connect");
    StateClient::new(ch)
}

/// A resource with a small CBOR spec.
pub fn res(ns: &str, ty: &str, id: &str, value: &str) -> RawResource {
    RawResource {
        metadata: Metadata::new(ns, ty, id),
        spec: cosi::resource::encode_spec(&value).expect("encode"),
        yaml_spec: String::new(),
    }
}

/// The string spec of a resource.
pub fn value(r: &RawResource) -> String {
    cosi::resource::decode_spec(&r.spec).expect("decode")
}

/// Waits for the next event of a watch, with a deadline.
pub async fn next(w: &mut cosi::Watch) -> cosi::Event {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("event within 10s")
        .expect("watch open")
        .expect("no watch error")
}
