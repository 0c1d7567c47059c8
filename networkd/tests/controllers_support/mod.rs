//! Shared harness of the controller tests: a real stated in process, networkd's resource-side
//! controllers on the real runtime, helpers that write inputs as an administrator would and
//! wait for outputs (polling with a deadline; every wait says what it waited for).

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use cosi::runtime::Runtime;
use cosi::{Client, Resource, ResourceSpec};
use machinery::resources::config::{MachineConfigSpec, ACTIVE_ID, REDACTED_NAMESPACE as CONFIG_NS};
use machinery::resources::network::{
    HardwareAddr, LinkStatusSpec, LinkType, OperationalState, NAMESPACE,
};
use machinery::resources::runtime::{KernelCmdlineSpec, CMDLINE_ID, NAMESPACE as RUNTIME_NS};
use networkd::controllers::{register_resource_side, Options};
use stated::testing::Harness;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long any expectation may take.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// stated + networkd's resource-side controllers + a temporary etc root.
pub struct Node {
    pub harness: Harness,
    pub client: Client,
    pub etc_root: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Node {
    /// Starts stated and the controllers.
    pub async fn start() -> Self {
        let harness = Harness::start().await;
        let client = harness.client.clone();
        let etc_root = tempfile::tempdir().expect("etc root");
        let mut node = Self {
            harness,
            client,
            etc_root,
            stop: None,
            task: None,
        };
        node.start_controllers();
        node
    }

    /// (Re)starts the controllers, as a networkd restart would.
    pub fn start_controllers(&mut self) {
        let mut registry = cosi::runtime::Registry::new();
        register_resource_side(
            &mut registry,
            &Options {
                etc_root: self.etc_root.path().to_path_buf(),
            },
        )
        .expect("registrations do not conflict");
        let runtime = Runtime::with_registry(self.client.clone(), registry);
        let (tx, rx) = oneshot::channel::<()>();
        self.stop = Some(tx);
        self.task = Some(tokio::spawn(async move {
            runtime.run(rx).await.expect("runtime");
        }));
    }

    /// Stops the controllers (their outputs stay in stated).
    pub async fn stop_controllers(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task)
                .await
                .expect("runtime stops")
                .expect("no panic");
        }
    }

    /// Creates or replaces a resource (as admin, no owner).
    pub async fn put<S: ResourceSpec>(&self, ns: &str, id: &str, spec: S) {
        let raw = Resource::new(ns, id, spec).to_raw().expect("encode");
        match self.client.get(ns, S::TYPE, id).await {
            Ok(cur) => {
                let mut raw = raw;
                raw.metadata.version = cur.metadata.version;
                self.client.update(&raw, "", None).await.expect("update");
            }
            Err(e) if e.is_not_found() => {
                self.client.create(&raw, "").await.expect("create");
            }
            Err(e) => panic!("get {ns}/{id}: {e}"),
        }
    }

    /// Destroys a resource written with [`put`](Self::put).
    pub async fn remove<S: ResourceSpec>(&self, ns: &str, id: &str) {
        self.client
            .destroy(ns, S::TYPE, id, "")
            .await
            .expect("destroy");
    }

    /// Writes the machine configuration.
    pub async fn config(&self, yaml: &str) {
        self.put(CONFIG_NS, ACTIVE_ID, MachineConfigSpec(yaml.to_string()))
            .await;
    }

    /// Writes the kernel command line.
    pub async fn cmdline(&self, cmdline: &str) {
        self.put(
            RUNTIME_NS,
            CMDLINE_ID,
            KernelCmdlineSpec {
                cmdline: cmdline.to_string(),
            },
        )
        .await;
    }

    /// Adds a physical (Ethernet, kind-less) link with carrier.
    pub async fn physical_link(&self, name: &str, mac: &str) {
        self.put(NAMESPACE, name, physical(name, mac)).await;
    }

    /// Gets a resource, `None` if absent.
    pub async fn get<S: ResourceSpec>(&self, ns: &str, id: &str) -> Option<Resource<S>> {
        match self.client.get_typed::<S>(ns, id).await {
            Ok(r) => Some(r),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("get {ns}/{id}: {e}"),
        }
    }

    /// IDs of every resource of `S` in `ns`.
    pub async fn ids<S: ResourceSpec>(&self, ns: &str) -> Vec<String> {
        self.client
            .list_typed::<S>(ns)
            .await
            .expect("list")
            .into_iter()
            .map(|r| r.metadata.id)
            .collect()
    }

    /// Waits until `ns/id` exists and satisfies `pred`.
    pub async fn expect<S: ResourceSpec>(
        &self,
        ns: &str,
        id: &str,
        pred: impl Fn(&S) -> bool,
    ) -> Resource<S> {
        eventually(&format!("{ns}/{}/{id}", S::TYPE), || async {
            self.get::<S>(ns, id).await.filter(|r| pred(&r.spec))
        })
        .await
    }

    /// Waits until `ns/id` is gone.
    pub async fn expect_gone<S: ResourceSpec>(&self, ns: &str, id: &str) {
        eventually(&format!("{ns}/{}/{id} gone", S::TYPE), || async {
            self.get::<S>(ns, id).await.is_none().then_some(())
        })
        .await;
    }

    /// Waits until the IDs of `S` in `ns` are exactly `want` (sorted).
    pub async fn expect_ids<S: ResourceSpec>(&self, ns: &str, want: &[&str]) {
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        let end = Instant::now() + DEADLINE;
        loop {
            let last = self.ids::<S>(ns).await;
            if last == want {
                return;
            }
            assert!(
                Instant::now() < end,
                "{ns}/{}: expected IDs {want:?}, have {last:?}",
                S::TYPE
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A physical link status.
pub fn physical(name: &str, mac: &str) -> LinkStatusSpec {
    let _ = name;
    LinkStatusSpec {
        r#type: LinkType::ETHER,
        hardware_addr: mac.parse::<HardwareAddr>().expect("mac"),
        permanent_addr: mac.parse::<HardwareAddr>().expect("mac"),
        operational_state: OperationalState::Up,
        link_state: true,
        driver: "virtio_net".into(),
        ..Default::default()
    }
}

/// Polls `f` until it returns `Some`; panics naming `what` after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Lets the controllers settle: waits until `probe` returns the same value `quiet` times in a
/// row, 50 ms apart (for asserting that something does *not* change).
pub async fn settle<T: PartialEq, F, Fut>(mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let mut last = probe().await;
    let mut same = 0;
    while same < 10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let next = probe().await;
        if next == last {
            same += 1;
        } else {
            same = 0;
            last = next;
        }
    }
    last
}
