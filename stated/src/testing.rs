//! A real stated in-process on a temporary socket, for tests of clients and controllers.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::runtime::Runtime;

use crate::{Config, Manifest, Store};

/// A running in-process stated. Dropping it stops the server.
pub struct Harness {
    /// A client connected to it.
    pub client: cosi::Client,
    /// Its socket.
    pub socket: PathBuf,
    /// Its configuration (directories inside a temporary directory).
    pub config: Config,
    /// The store, for assertions that bypass the API.
    pub store: Arc<Store>,
    dir: tempfile::TempDir,
    runtime: Option<Runtime>,
}

impl Harness {
    /// Starts a standalone stated (admin-only access, which a root test process has).
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Starts a stated with a manifest.
    pub async fn start_with(manifest: Option<Manifest>) -> Self {
        Self::start_configured(|c| c.manifest = manifest).await
    }

    /// Starts a stated after `f` has adjusted its configuration.
    pub async fn start_configured(f: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("stated-test")
            .tempdir()
            .expect("temporary directory");
        let mut config = Config {
            socket: dir.path().join("state.sock"),
            state_dir: dir.path().join("state"),
            run_dir: dir.path().join("run"),
            manifest: None,
            history: crate::store::DEFAULT_HISTORY,
            limits: crate::store::Limits::default(),
            peer_limits: crate::server::PeerLimits::default(),
        };
        f(&mut config);
        let (store, runtime) = spawn(&config);
        Self {
            client: cosi::Client::new(&config.socket).expect("client"),
            socket: config.socket.clone(),
            store,
            config,
            dir,
            runtime: Some(runtime),
        }
    }

    /// The temporary directory holding socket and state.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops the server as a crash would: every connection and task of it is dropped, nothing
    /// is flushed beyond what every write already did.
    pub async fn stop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            let _ = tokio::task::spawn_blocking(move || {
                rt.shutdown_timeout(std::time::Duration::from_secs(5))
            })
            .await;
        }
    }

    /// Restarts the server on the same socket and state, as init restarts stated in place.
    pub async fn restart(&mut self) {
        self.stop().await;
        let (store, runtime) = spawn(&self.config);
        self.store = store;
        self.runtime = Some(runtime);
    }
}

/// Runs the server on a runtime of its own, so that stopping it drops every connection as the
/// death of a process would.
fn spawn(config: &Config) -> (Arc<Store>, Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("stated-harness")
        .enable_all()
        .build()
        .expect("harness runtime");
    let store = Arc::new(crate::open_store(config).expect("open store"));
    let listener = {
        let _guard = rt.enter();
        crate::bind(&config.socket).expect("bind")
    };
    let cfg = config.clone();
    let s = store.clone();
    rt.spawn(async move {
        let _ = crate::serve(s, &cfg, listener, std::future::pending()).await;
    });
    (store, rt)
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
