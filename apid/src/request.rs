//! What apid asks another daemon for, one shape for every call that needs one
//! (`GenerateClientConfiguration` → secretsd, `Bootstrap` → k8sd): a request resource in apid's
//! own namespace under a random ID, the other daemon's answer under the same ID in its own
//! namespace, polled until it comes. The request is destroyed however the call ends (answered,
//! refused, timed out, or cancelled by the client going away), and those of a previous apid
//! when apid starts ([`forget_stale`]).

use std::time::Duration;

use cosi::{Resource, ResourceSpec};
use machinery::resources::apid::NAMESPACE;
use tonic::Status;

/// `Unavailable`: stated did not answer.
pub fn unavailable(e: &cosi::StateError) -> Status {
    Status::unavailable(format!("stated is not answering apid: {e}"))
}

/// A request in stated; destroyed when dropped.
#[derive(Debug)]
pub struct Pending {
    client: cosi::Client,
    r#type: &'static str,
    owner: &'static str,
    id: String,
    /// The stored version (for [`Pending::update`]).
    version: u64,
}

impl Pending {
    /// Writes `spec` under a new random ID, owned by `owner`.
    ///
    /// # Errors
    ///
    /// `Unavailable` without stated; `Internal` for an encoding error.
    pub async fn create<S: ResourceSpec>(
        client: &cosi::Client,
        owner: &'static str,
        spec: S,
    ) -> Result<Self, Status> {
        let id = machinery::secrets::x509::random(16)
            .map_err(|e| Status::internal(e.to_string()))?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        let raw = Resource::<S>::new(NAMESPACE, id.clone(), spec)
            .to_raw()
            .map_err(|e| Status::internal(e.to_string()))?;
        let stored = client
            .create(&raw, owner)
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(Self {
            client: client.clone(),
            r#type: S::TYPE,
            owner,
            id,
            version: stored.metadata.version,
        })
    }

    /// Replaces the request's spec (of the type it was created with).
    ///
    /// # Errors
    ///
    /// `Unavailable` without stated (or when the request is gone); `Internal` for an
    /// encoding error.
    pub async fn update<S: ResourceSpec>(&mut self, spec: S) -> Result<(), Status> {
        let mut raw = Resource::<S>::new(NAMESPACE, self.id.clone(), spec)
            .to_raw()
            .map_err(|e| Status::internal(e.to_string()))?;
        raw.metadata.version = self.version;
        let stored = self
            .client
            .update(&raw, self.owner, None)
            .await
            .map_err(|e| unavailable(&e))?;
        self.version = stored.metadata.version;
        Ok(())
    }

    /// stated.
    pub fn client(&self) -> &cosi::Client {
        &self.client
    }

    /// Its ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The answer of type `A` under this request's ID in `namespace` that `fits` (e.g. answers
    /// this very CSR), polled with backoff up to 200 ms, within `timeout`.
    ///
    /// # Errors
    ///
    /// `Unavailable` without stated; `DeadlineExceeded` (`late` says who did not answer).
    pub async fn answer<A: ResourceSpec>(
        &self,
        namespace: &str,
        timeout: Duration,
        late: &str,
        fits: impl Fn(&A) -> bool,
    ) -> Result<A, Status> {
        self.answer_polled(namespace, timeout, late, fits, Duration::from_millis(200))
            .await
    }

    /// [`Pending::answer`], polled from 1 ms up to `cap` (an upload waits for each chunk's
    /// acknowledgement: a short cap keeps it going).
    ///
    /// # Errors
    ///
    /// As [`Pending::answer`].
    pub async fn answer_polled<A: ResourceSpec>(
        &self,
        namespace: &str,
        timeout: Duration,
        late: &str,
        fits: impl Fn(&A) -> bool,
        cap: Duration,
    ) -> Result<A, Status> {
        let poll = async {
            let mut wait = Duration::from_millis(1).min(cap);
            loop {
                match self.client.get_typed::<A>(namespace, &self.id).await {
                    Ok(a) if fits(&a.spec) => return Ok(a.spec),
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(unavailable(&e)),
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(cap);
            }
        };
        tokio::time::timeout(timeout, poll).await.map_err(|_| {
            Status::deadline_exceeded(format!("{late} within {} s", timeout.as_secs()))
        })?
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let client = self.client.clone();
        let (r#type, owner) = (self.r#type, self.owner);
        let id = std::mem::take(&mut self.id);
        tokio::spawn(async move {
            if let Err(e) = client.destroy(NAMESPACE, r#type, &id, owner).await {
                if !e.is_not_found() {
                    tracing::warn!(request = %id, r#type, error = %e, "cannot remove a request");
                }
            }
        });
    }
}

/// Destroys the requests of type `r#type` a previous apid left (it was killed mid-call).
pub async fn forget_stale(client: &cosi::Client, r#type: &str) {
    let stale = match client
        .list(NAMESPACE, r#type, &cosi::Query::default())
        .await
    {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(r#type, error = %e, "cannot list stale requests");
            return;
        }
    };
    for r in stale {
        let m = &r.metadata;
        if let Err(e) = client
            .destroy(&m.namespace, &m.r#type, &m.id, &m.owner)
            .await
        {
            tracing::warn!(request = %m.id, error = %e, "cannot remove a stale request");
        }
    }
}
