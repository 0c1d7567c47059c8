//! A real stated in-process on a temporary socket, for tests of clients and controllers.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    /// Starts a standalone stated (admin-only access, which a root test process has).
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Starts a stated with a manifest.
    pub async fn start_with(manifest: Option<Manifest>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("stated-test")
            .tempdir()
            .expect("temporary directory");
        let config = Config {
            socket: dir.path().join("state.sock"),
            state_dir: dir.path().join("state"),
            run_dir: dir.path().join("run"),
            manifest,
            history: crate::store::DEFAULT_HISTORY,
        };
        let (store, stop, task) = spawn(&config).await;
        Self {
            client: cosi::Client::new(&config.socket).expect("client"),
            socket: config.socket.clone(),
            store,
            config,
            dir,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The temporary directory holding socket and state.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops the server, as a crash would (no flush beyond what every write already did).
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Restarts the server on the same socket and state, as init restarts stated in place.
    pub async fn restart(&mut self) {
        self.stop().await;
        let (store, stop, task) = spawn(&self.config).await;
        self.store = store;
        self.stop = Some(stop);
        self.task = Some(task);
    }
}

async fn spawn(config: &Config) -> (Arc<Store>, oneshot::Sender<()>, JoinHandle<()>) {
    let store = Arc::new(crate::open_store(config).expect("open store"));
    let listener = crate::bind(&config.socket).expect("bind");
    let (tx, rx) = oneshot::channel();
    let cfg = config.clone();
    let s = store.clone();
    let task = tokio::spawn(async move {
        let _ = crate::serve(s, &cfg, listener, async {
            let _ = rx.await;
        })
        .await;
    });
    (store, tx, task)
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
