//! `talosctl health`: the cluster's health checks, run from the client through the Talos API
//! (upstream's `--server=false` mode), one after another, each retried until it passes or
//! `--wait-timeout` runs out, with upstream's progress lines (`waiting for etcd to be
//! healthy: …`, then `…: OK`). The nodes are the targets (`-n`, else the context's nodes);
//! each is a control plane or a worker by its configuration.
//!
//! Checks: apid answers on every node; every node's daemons and services are up; on the control
//! planes, etcd is healthy, every member lists the same members, and those are the control
//! planes, all voting; the control plane's static pods are rendered. Kubernetes itself (nodes,
//! kubelets, pods running) is not checked: no kubelet runs on a talos-rs node yet, and the
//! output says so.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use machinery::config::Config;
use machinery::resources::config::{
    MachineConfigSpec, MachineTypeSpec, ACTIVE_ID, MACHINE_TYPE_ID, NAMESPACE as CONFIG,
    REDACTED_NAMESPACE,
};
use machinery::resources::etcd::{EtcdSpecSpec, EtcdStatusSpec, ETCD_ID, NAMESPACE as ETCD};
use machinery::resources::k8s::{
    StaticPodSpec, APISERVER_ID, CONTROLLER_MANAGER_ID, NAMESPACE as K8S, SCHEDULER_ID,
};
use proto::machine::machine_service_client::MachineServiceClient;

use crate::api::Api;

/// `talosctl health`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// How long to wait for each check to pass (Go duration: 30s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_timeout)]
    pub wait_timeout: Duration,
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    machinery::config::parse_go_duration(s)
}

/// One node, as the checks see it.
struct Node {
    label: String,
    state: cosi::Client,
    node: Option<String>,
}

/// Retries `check` until it passes or `timeout` runs out, printing upstream's progress lines
/// (a line each time the reason changes).
async fn wait_for<F, Fut>(
    out: &mut dyn Write,
    what: &str,
    timeout: Duration,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    let mut last = None;
    loop {
        match check().await {
            Ok(()) => {
                writeln!(out, "waiting for {what}: OK")?;
                return Ok(());
            }
            Err(why) => {
                if last.as_ref() != Some(&why) {
                    writeln!(out, "waiting for {what}: {why}")?;
                    out.flush()?;
                    last = Some(why.clone());
                }
                if start.elapsed() >= timeout {
                    anyhow::bail!("the cluster is not healthy: {what}: {why}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether the node is a control plane: its `MachineTypes/machine-type` (not sensitive, so
/// an os:reader can run the checks), or for a node whose init does not write it yet, its
/// configuration (which needs os:admin).
async fn control_plane(n: &Node) -> Result<bool, String> {
    match n
        .state
        .get_typed::<MachineTypeSpec>(CONFIG, MACHINE_TYPE_ID)
        .await
    {
        Ok(t) => return Ok(t.spec.is_control_plane()),
        Err(e) if e.is_not_found() || e.kind() == cosi::ErrorKind::PermissionDenied => {}
        Err(e) => return Err(format!("{}: its machine type: {e}", n.label)),
    }
    let c = n
        .state
        .get_typed::<MachineConfigSpec>(REDACTED_NAMESPACE, ACTIVE_ID)
        .await
        .map_err(|e| format!("{}: its machine type and configuration: {e}", n.label))?;
    let config = Config::from_yaml(&c.spec.0).map_err(|e| format!("{}: {e}", n.label))?;
    Ok(config.machine_type().is_some_and(|t| t.is_control_plane()))
}

async fn etcd_status(n: &Node) -> Result<EtcdStatusSpec, String> {
    n.state
        .get_typed::<EtcdStatusSpec>(ETCD, ETCD_ID)
        .await
        .map(|s| s.spec)
        .map_err(|e| format!("{}: {e}", n.label))
}

/// Runs every check; an error names the first that did not pass in time.
///
/// # Errors
///
/// A check that did not pass within `--wait-timeout`.
pub async fn run(api: &Api, args: &HealthArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let t = args.wait_timeout;
    let nodes: Vec<Node> = api
        .state_sources()?
        .into_iter()
        .zip(api.targets())
        .map(|(s, (label, node))| Node {
            label,
            state: s.client,
            node,
        })
        .collect();
    if nodes.is_empty() {
        anyhow::bail!("no node to check: give them with -n");
    }
    let machine = MachineServiceClient::new(api.channel()?);

    wait_for(out, "apid to be ready", t, || async {
        for n in &nodes {
            let mut m = machine.clone();
            m.version(
                api.for_node((), n.node.as_deref())
                    .map_err(|e| e.to_string())?,
            )
            .await
            .map_err(|s| format!("{}: {}", n.label, s.message()))?;
        }
        Ok(())
    })
    .await?;

    wait_for(
        out,
        "every node's daemons and services to be up",
        t,
        || async {
            for n in &nodes {
                let mut m = machine.clone();
                let list = m
                    .service_list(
                        api.for_node((), n.node.as_deref())
                            .map_err(|e| e.to_string())?,
                    )
                    .await
                    .map_err(|s| format!("{}: {}", n.label, s.message()))?
                    .into_inner();
                for s in list.messages.iter().flat_map(|m| &m.services) {
                    let healthy = s.health.as_ref().is_none_or(|h| h.healthy || h.unknown);
                    let fine = matches!(s.state.as_str(), "Running" | "Finished") && healthy;
                    if !fine {
                        return Err(format!("{}: {} is {}", n.label, s.id, s.state));
                    }
                }
            }
            Ok(())
        },
    )
    .await?;

    let mut cps = Vec::new();
    for n in &nodes {
        if control_plane(n).await.map_err(|e| anyhow::anyhow!(e))? {
            cps.push(n);
        }
    }
    if cps.is_empty() {
        writeln!(
            out,
            "no control plane among the nodes: etcd and the control plane not checked"
        )?;
    } else {
        wait_for(out, "etcd to be healthy", t, || async {
            for n in &cps {
                let s = etcd_status(n).await?;
                if !s.healthy {
                    return Err(format!("{}: etcd is {}: {}", n.label, s.phase, s.message));
                }
            }
            Ok(())
        })
        .await?;

        wait_for(
            out,
            "etcd members to be consistent across nodes",
            t,
            || async {
                let mut seen: Option<(String, BTreeSet<u64>)> = None;
                for n in &cps {
                    let ids: BTreeSet<u64> =
                        etcd_status(n).await?.members.iter().map(|m| m.id).collect();
                    match &seen {
                        None => seen = Some((n.label.clone(), ids)),
                        Some((first, s)) if *s != ids => {
                            return Err(format!(
                                "{} lists {} members, {} lists {}",
                                first,
                                s.len(),
                                n.label,
                                ids.len()
                            ))
                        }
                        Some(_) => {}
                    }
                }
                Ok(())
            },
        )
        .await?;

        wait_for(out, "etcd members to be control plane nodes", t, || async {
            let mut names = BTreeSet::new();
            for n in &cps {
                let spec = n
                    .state
                    .get_typed::<EtcdSpecSpec>(ETCD, ETCD_ID)
                    .await
                    .map_err(|e| format!("{}: {e}", n.label))?;
                names.insert(spec.spec.name);
            }
            let members = etcd_status(cps[0]).await?.members;
            if let Some(l) = members.iter().find(|m| m.is_learner) {
                return Err(format!("{} is a learner (not voting yet)", l.hostname));
            }
            let member_names: BTreeSet<String> =
                members.iter().map(|m| m.hostname.clone()).collect();
            if member_names != names {
                return Err(format!(
                    "etcd's members {member_names:?} are not the control planes {names:?}"
                ));
            }
            Ok(())
        })
        .await?;

        wait_for(
            out,
            "the control plane static pods to be rendered",
            t,
            || async {
                for n in &cps {
                    let pods: BTreeSet<String> = n
                        .state
                        .list_typed::<StaticPodSpec>(K8S)
                        .await
                        .map_err(|e| format!("{}: {e}", n.label))?
                        .iter()
                        .map(|p| p.id().to_string())
                        .collect();
                    for want in [APISERVER_ID, CONTROLLER_MANAGER_ID, SCHEDULER_ID] {
                        if !pods.contains(want) {
                            return Err(format!("{}: no static pod {want}", n.label));
                        }
                    }
                }
                Ok(())
            },
        )
        .await?;
    }
    writeln!(
        out,
        "not checked: Kubernetes nodes, kubelets and running pods (no kubelet runs on a talos-rs node yet)"
    )?;
    Ok(())
}
