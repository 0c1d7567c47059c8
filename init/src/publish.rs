//! Writes what init knows to stated, in `runtime`: a `ServiceStatus` per daemon and service, a
//! `DaemonSecurity` per observed daemon, the `MachineStatus` and the `KernelCmdline`. Level
//! triggered: on every change (and every few seconds) it computes the whole desired set and
//! writes the differences, so a stated restart (which keeps the run state) or a failed write is
//! repaired by the next pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cosi::{Client, Query, RawResource, Resource, ResourceSpec};
use machinery::resources::runtime::{
    DaemonSecuritySpec, KernelCmdlineSpec, MachineStatusSpec, ServiceStatusSpec, CMDLINE_ID,
    MACHINE_STATUS_ID, NAMESPACE,
};
use tokio::sync::watch;

use crate::supervisor::Supervisor;

/// The owner string of everything init writes.
pub const OWNER: &str = "init";

/// What the publisher needs besides the units.
pub struct Publisher {
    /// stated.
    pub client: Client,
    /// The supervisor whose units are published.
    pub supervisor: Arc<Supervisor>,
    /// The machine's status, set by the boot sequence.
    pub machine: watch::Receiver<MachineStatusSpec>,
    /// The daemons (the machine is ready when they all are).
    pub daemons: Vec<String>,
    /// The kernel command line to publish.
    pub cmdline: String,
}

impl Publisher {
    /// Publishes until the process ends.
    pub async fn run(self) {
        let mut written: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
        let mut machine = self.machine.clone();
        loop {
            if let Err(e) = self.pass(&mut written).await {
                tracing::debug!(error = %e, "publishing to stated failed; retrying");
                written.clear();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            tokio::select! {
                _ = self.supervisor.changed.notified() => {}
                _ = machine.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => { written.clear(); }
            }
        }
    }

    async fn pass(
        &self,
        written: &mut BTreeMap<(String, String), Vec<u8>>,
    ) -> Result<(), cosi::StateError> {
        let mut desired: BTreeMap<(String, String), RawResource> = BTreeMap::new();
        let mut unmet = Vec::new();
        for unit in self.supervisor.units() {
            let status = unit.snapshot();
            if self.daemons.contains(&unit.id) && !status.healthy {
                unmet.push(unit.id.clone());
            }
            put(&mut desired, &unit.id, status)?;
            if let Some(sec) = unit.security() {
                put::<DaemonSecuritySpec>(&mut desired, &unit.id, sec)?;
            }
        }
        let mut machine = self.machine.borrow().clone();
        machine.ready = unmet.is_empty();
        machine.unmet = unmet;
        put(&mut desired, MACHINE_STATUS_ID, machine)?;
        put(
            &mut desired,
            CMDLINE_ID,
            KernelCmdlineSpec {
                cmdline: self.cmdline.clone(),
            },
        )?;

        for ((r#type, id), res) in &desired {
            let key = (r#type.clone(), id.clone());
            if written.get(&key) == Some(&res.spec) {
                continue;
            }
            write(&self.client, res).await?;
            written.insert(key, res.spec.clone());
        }
        // Statuses of units that are gone (removed services).
        for r#type in [ServiceStatusSpec::TYPE, DaemonSecuritySpec::TYPE] {
            for r in self
                .client
                .list(NAMESPACE, r#type, &Query::default())
                .await?
            {
                let key = (r#type.to_string(), r.metadata.id.clone());
                if !desired.contains_key(&key) {
                    match self
                        .client
                        .destroy(NAMESPACE, r#type, &r.metadata.id, &r.metadata.owner)
                        .await
                    {
                        Ok(()) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                    written.remove(&key);
                }
            }
        }
        Ok(())
    }
}

fn put<S: ResourceSpec>(
    desired: &mut BTreeMap<(String, String), RawResource>,
    id: &str,
    spec: S,
) -> Result<(), cosi::StateError> {
    let raw = Resource::new(NAMESPACE, id, spec)
        .to_raw()
        .map_err(|e| cosi::StateError::new(cosi::ErrorKind::InvalidArgument, e.to_string()))?;
    desired.insert((S::TYPE.to_string(), id.to_string()), raw);
    Ok(())
}

/// Creates or updates `res` as [`OWNER`] unless stated already has that spec.
pub async fn write(client: &Client, res: &RawResource) -> Result<(), cosi::StateError> {
    let m = &res.metadata;
    loop {
        match client.get(&m.namespace, &m.r#type, &m.id).await {
            Ok(cur) if cur.spec == res.spec => return Ok(()),
            Ok(cur) => {
                let mut next = res.clone();
                next.metadata.version = cur.metadata.version;
                next.metadata.owner = cur.metadata.owner.clone();
                match client.update(&next, &cur.metadata.owner, None).await {
                    Err(e) if e.is_conflict() => continue,
                    other => return other.map(drop),
                }
            }
            Err(e) if e.is_not_found() => match client.create(res, OWNER).await {
                Err(e) if e.is_conflict() => continue,
                other => return other.map(drop),
            },
            Err(e) => return Err(e),
        }
    }
}
