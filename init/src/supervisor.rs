//! Supervision: every daemon and requested service is a [`Unit`] run by its own task, which
//! waits for the unit's dependencies, spawns it in its sandbox, waits for its readiness, and on
//! its end restarts it with exponential backoff capped at the policy's maximum, forever: a
//! daemon of the manifest is never given up on (a node without its broker is no node); only its
//! own permanent-failure exit code leaves it failed. Stop is SIGTERM to its process group, then SIGKILL after the
//! grace period. Commands (start, stop, restart) reach the task over a channel; its state is a
//! `watch` that dependents, the publisher and the control API read.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use machinery::resources::runtime::{
    DaemonSecuritySpec, ServiceState, ServiceStatusSpec, UnitKind, SERVICE_OUTPUT_MAX,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use sandbox::Policy;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

use crate::logs::LogBuffer;
use crate::manifest::{Readiness, RestartPolicy, PERMANENT_FAILURE_EXIT};
use crate::reaper::{Exit, Reaper};

/// How to run a unit.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its sandbox.
    pub policy: Policy,
    /// How it reports readiness.
    pub readiness: Readiness,
    /// A listening socket held by init and handed to every start.
    pub listen: Option<Arc<OwnedFd>>,
    /// Restart policy.
    pub restart: RestartPolicy,
    /// Restart it when it ends (daemons always; services as they ask).
    pub restart_always: bool,
    /// Grace period between SIGTERM and SIGKILL.
    pub stop_timeout: Duration,
    /// How long it may take to become ready.
    pub ready_timeout: Duration,
    /// For daemons: how to describe its sandbox once it runs.
    pub audit: Option<crate::security::Audit>,
}

/// A command to a unit's task.
enum Cmd {
    Start(oneshot::Sender<()>),
    Stop(oneshot::Sender<()>),
    Restart(oneshot::Sender<()>),
}

/// One supervised program.
pub struct Unit {
    /// Daemon name or service ID.
    pub id: String,
    /// How to run it; `None` for a refused service (it only carries its status).
    pub launch: Option<Launch>,
    /// Its state.
    pub status: watch::Sender<ServiceStatusSpec>,
    /// Its observed sandbox, once it ran ready (daemons only).
    pub security: Mutex<Option<DaemonSecuritySpec>>,
    /// The pid of the run being observed and what the sandbox applied to it.
    applied: Mutex<Option<(i32, sandbox::Applied)>>,
    /// Its output.
    pub logs: Arc<LogBuffer>,
    cmd: mpsc::UnboundedSender<Cmd>,
}

impl Unit {
    /// The current status.
    pub fn snapshot(&self) -> ServiceStatusSpec {
        self.status.borrow().clone()
    }

    /// The last observed sandbox.
    pub fn security(&self) -> Option<DaemonSecuritySpec> {
        self.security
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Why a control request failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No unit has that ID.
    #[error("no daemon or service {0:?}")]
    NotFound(String),
    /// The unit was refused and cannot run.
    #[error("{0:?} was refused and cannot run: {1}")]
    Refused(String, String),
    /// The unit's task is gone (init is shutting down).
    #[error("{0:?} is being removed")]
    Gone(String),
}

/// Every unit, and what they share.
pub struct Supervisor {
    units: Mutex<BTreeMap<String, Arc<Unit>>>,
    reaper: Reaper,
    /// Wakes the publisher on any change.
    pub changed: Arc<Notify>,
    /// Set once shutdown starts: units are not restarted any more.
    stopping: watch::Sender<bool>,
}

impl Supervisor {
    /// A supervisor whose children `reaper` reaps.
    pub fn new(reaper: Reaper) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            units: Mutex::new(BTreeMap::new()),
            reaper,
            changed: Arc::new(Notify::new()),
            stopping: watch::channel(false).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Unit>>> {
        self.units.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The unit called `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Unit>> {
        self.lock().get(id).cloned()
    }

    /// Every unit, by ID.
    pub fn units(&self) -> Vec<Arc<Unit>> {
        self.lock().values().cloned().collect()
    }

    /// Adds a unit and starts its task. It starts once every unit of `deps` is healthy
    /// (`start`), or waits for a start command. Replaces (after stopping) a unit of the same ID.
    pub async fn add(
        self: &Arc<Self>,
        id: &str,
        kind: UnitKind,
        requested_by: &str,
        launch: Launch,
        deps: Vec<String>,
        start: bool,
    ) -> Arc<Unit> {
        self.remove(id).await;
        let dep_status: Vec<(String, watch::Receiver<ServiceStatusSpec>)> = deps
            .iter()
            .filter_map(|d| self.get(d).map(|u| (d.clone(), u.status.subscribe())))
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let unit = Arc::new(Unit {
            id: id.to_string(),
            launch: Some(launch),
            status: watch::channel(ServiceStatusSpec {
                kind,
                requested_by: requested_by.to_string(),
                state: if start {
                    ServiceState::Waiting
                } else {
                    ServiceState::Stopped
                },
                ..Default::default()
            })
            .0,
            security: Mutex::new(None),
            applied: Mutex::new(None),
            logs: Arc::new(LogBuffer::new()),
            cmd: tx,
        });
        self.lock().insert(id.to_string(), unit.clone());
        self.changed.notify_one();
        tokio::spawn(run_unit(unit.clone(), rx, self.clone(), dep_status, start));
        unit
    }

    /// Adds a unit that will not run, with the reason in its status (a refused service).
    pub async fn add_refused(
        self: &Arc<Self>,
        id: &str,
        kind: UnitKind,
        requested_by: &str,
        reason: String,
    ) {
        self.remove(id).await;
        let unit = Arc::new(Unit {
            id: id.to_string(),
            launch: None,
            status: watch::channel(ServiceStatusSpec {
                kind,
                requested_by: requested_by.to_string(),
                state: ServiceState::Failed,
                message: reason,
                ..Default::default()
            })
            .0,
            security: Mutex::new(None),
            applied: Mutex::new(None),
            logs: Arc::new(LogBuffer::new()),
            cmd: mpsc::unbounded_channel().0,
        });
        self.lock().insert(id.to_string(), unit);
        self.changed.notify_one();
    }

    /// Stops a unit (if it runs) and keeps it as one that cannot run again, its status as it
    /// was with `reason` as its message (failed, unless it had finished): a requested service
    /// whose rules reach a device that became protected. A start is then refused with the
    /// reason, as for a refused service.
    pub async fn revoke(&self, id: &str, reason: String) {
        let Some(unit) = self.get(id) else { return };
        if unit.launch.is_none() {
            return;
        }
        let _ = self.command(&unit, Cmd::Stop).await;
        let mut status = unit.snapshot();
        if status.state != ServiceState::Finished {
            status.state = ServiceState::Failed;
        }
        status.pid = 0;
        status.ready = false;
        status.healthy = false;
        status.message = reason;
        let revoked = Arc::new(Unit {
            id: id.to_string(),
            launch: None,
            status: watch::channel(status).0,
            security: Mutex::new(None),
            applied: Mutex::new(None),
            logs: unit.logs.clone(),
            cmd: mpsc::unbounded_channel().0,
        });
        {
            let mut units = self.lock();
            // Unless a new spec replaced it meanwhile (checked against the protected devices).
            if units.get(id).is_some_and(|u| Arc::ptr_eq(u, &unit)) {
                units.insert(id.to_string(), revoked);
            }
        }
        self.changed.notify_one();
    }

    /// Stops a unit and forgets it.
    pub async fn remove(&self, id: &str) {
        let Some(unit) = self.get(id) else { return };
        let _ = self.command(&unit, Cmd::Stop).await;
        self.lock().remove(id);
        self.changed.notify_one();
    }

    async fn command(
        &self,
        unit: &Arc<Unit>,
        cmd: fn(oneshot::Sender<()>) -> Cmd,
    ) -> Result<ServiceStatusSpec, ControlError> {
        if unit.launch.is_none() {
            return Err(ControlError::Refused(
                unit.id.clone(),
                unit.snapshot().message,
            ));
        }
        let (tx, rx) = oneshot::channel();
        unit.cmd
            .send(cmd(tx))
            .map_err(|_| ControlError::Gone(unit.id.clone()))?;
        rx.await.map_err(|_| ControlError::Gone(unit.id.clone()))?;
        Ok(unit.snapshot())
    }

    fn find(&self, id: &str) -> Result<Arc<Unit>, ControlError> {
        self.get(id)
            .ok_or_else(|| ControlError::NotFound(id.to_string()))
    }

    /// Starts a stopped or failed unit (resetting its crash-loop count); returns once it is
    /// spawned (or waits for dependencies).
    pub async fn start(&self, id: &str) -> Result<ServiceStatusSpec, ControlError> {
        let unit = self.find(id)?;
        self.command(&unit, Cmd::Start).await
    }

    /// Stops a unit: SIGTERM, SIGKILL after its grace period; returns once it ended.
    pub async fn stop(&self, id: &str) -> Result<ServiceStatusSpec, ControlError> {
        let unit = self.find(id)?;
        self.command(&unit, Cmd::Stop).await
    }

    /// Stops and starts exactly this unit; returns once it runs again (not necessarily ready).
    pub async fn restart(&self, id: &str) -> Result<ServiceStatusSpec, ControlError> {
        let unit = self.find(id)?;
        self.command(&unit, Cmd::Restart).await
    }

    /// Every daemon's sandbox as /proc shows it now (every thread of its running process),
    /// for `talosctl audit`: a daemon not running gets its reason instead.
    pub async fn audit_now(&self) -> Vec<(String, Result<DaemonSecuritySpec, String>)> {
        let mut out = Vec::new();
        for unit in self.units() {
            let Some(audit) = unit.launch.as_ref().and_then(|l| l.audit.clone()) else {
                continue;
            };
            let pid = unit.snapshot().pid;
            let applied = unit
                .applied
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .filter(|(p, _)| *p == pid && pid > 0);
            let Some((_, applied)) = applied else {
                out.push((unit.id.clone(), Err("not running".to_string())));
                continue;
            };
            let observed = tokio::task::spawn_blocking(move || {
                sandbox::observe(pid).map(|o| audit.describe(o.with_applied(applied)))
            })
            .await;
            match observed {
                Ok(Ok(spec)) => {
                    *unit.security.lock().unwrap_or_else(|e| e.into_inner()) = Some(spec.clone());
                    self.changed.notify_one();
                    out.push((unit.id.clone(), Ok(spec)));
                }
                Ok(Err(e)) => out.push((unit.id.clone(), Err(e.to_string()))),
                Err(e) => out.push((unit.id.clone(), Err(e.to_string()))),
            }
        }
        out
    }

    /// Marks the supervisor as shutting down: nothing restarts any more.
    pub fn begin_shutdown(&self) {
        self.stopping.send_replace(true);
    }

    /// Stops the given units one after the other (reverse dependency order is the caller's).
    pub async fn stop_in_order(&self, ids: &[String]) {
        for id in ids {
            if let Some(unit) = self.get(id) {
                if unit.launch.is_some() {
                    tracing::info!(unit = %id, "stopping");
                    let _ = self.command(&unit, Cmd::Stop).await;
                }
            }
        }
    }
}

/// Sets the unit's status and wakes the publisher.
fn set(unit: &Unit, sup: &Supervisor, f: impl FnOnce(&mut ServiceStatusSpec)) {
    unit.status.send_modify(f);
    sup.changed.notify_one();
}

/// A running child.
struct Running {
    child: sandbox::Child,
    exit: oneshot::Receiver<Exit>,
    notify: Option<tokio::net::unix::pipe::Receiver>,
    /// The task that reads its output into the unit's log buffer (it ends at EOF).
    output: tokio::task::JoinHandle<()>,
}

/// How long, once a one-shot service's run ended, its output pipe is still read (until every
/// writer closed it) before its `output` is taken: a process that left its group and keeps
/// the pipe open does not hold the status back longer.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// How one run ended.
enum RunEnd {
    /// It ended by itself.
    Exited {
        exit: Exit,
        ready_for: Option<Duration>,
        note: String,
    },
    /// Stopped on request.
    Stopped(oneshot::Sender<()>),
    /// Restart requested (it is stopped now).
    Restart(oneshot::Sender<()>),
    /// The command channel closed (the unit was dropped) after the child was stopped.
    Dropped,
}

/// The task of one unit.
async fn run_unit(
    unit: Arc<Unit>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    sup: Arc<Supervisor>,
    deps: Vec<(String, watch::Receiver<ServiceStatusSpec>)>,
    start: bool,
) {
    let Some(launch) = unit.launch.clone() else {
        return;
    };
    let mut want_up = start;
    let initial = Duration::from_millis(launch.restart.backoff_ms.max(1));
    let max = Duration::from_millis(launch.restart.max_backoff_ms.max(1));
    let healthy_run = Duration::from_millis(launch.restart.reset_after_ms);
    let mut backoff = initial;
    let mut started_once = false;
    let mut pending_ack: Option<oneshot::Sender<()>> = None;
    let mut stopping = sup.stopping.subscribe();

    loop {
        if !want_up {
            if let Some(ack) = pending_ack.take() {
                let _ = ack.send(());
            }
            match cmds.recv().await {
                None => return,
                Some(Cmd::Stop(ack)) => {
                    let _ = ack.send(());
                    continue;
                }
                Some(Cmd::Start(ack)) | Some(Cmd::Restart(ack)) => {
                    if *stopping.borrow() {
                        let _ = ack.send(());
                        continue;
                    }
                    want_up = true;
                    backoff = initial;
                    pending_ack = Some(ack);
                    set(&unit, &sup, |s| {
                        s.state = ServiceState::Waiting;
                        s.message.clear();
                    });
                }
            }
        }

        // Dependencies first: each must be healthy (running and ready).
        for (name, rx) in &deps {
            let mut rx = rx.clone();
            if rx.borrow().healthy {
                continue;
            }
            set(&unit, &sup, |s| {
                s.state = ServiceState::Waiting;
                s.message = format!("waiting for {name}");
            });
            loop {
                tokio::select! {
                    // A dependency that went away (removed) no longer holds this one back.
                    _ = rx.wait_for(|s| s.healthy) => break,
                    cmd = cmds.recv() => match cmd {
                        None => return,
                        Some(Cmd::Stop(ack)) => {
                            want_up = false;
                            set(&unit, &sup, |s| { s.state = ServiceState::Stopped; s.message.clear(); });
                            let _ = ack.send(());
                            break;
                        }
                        Some(Cmd::Start(ack)) | Some(Cmd::Restart(ack)) => { let _ = ack.send(()); }
                    }
                }
            }
            if !want_up {
                break;
            }
        }
        if !want_up {
            continue;
        }

        if started_once {
            set(&unit, &sup, |s| s.restarts += 1);
        }
        started_once = true;
        // This run's output starts here (a one-shot service's status carries it once it ended).
        let first_line = unit.logs.next_seq();
        let output = || {
            if launch.restart_always {
                String::new()
            } else {
                unit.logs.text_since(first_line, SERVICE_OUTPUT_MAX)
            }
        };
        set(&unit, &sup, |s| {
            s.state = ServiceState::Starting;
            s.message.clear();
            s.output.clear();
        });
        let end = match spawn(&unit, &launch, &sup.reaper).await {
            Ok(running) => {
                let pid = running.child.pid();
                set(&unit, &sup, |s| {
                    s.pid = pid;
                    if launch.readiness == Readiness::Exec {
                        s.state = ServiceState::Running;
                        s.ready = true;
                        s.healthy = true;
                    }
                });
                if let Some(ack) = pending_ack.take() {
                    let _ = ack.send(());
                }
                supervise(&unit, &launch, &sup, running, &mut cmds).await
            }
            Err(e) => {
                tracing::warn!(unit = %unit.id, error = %e, "cannot start");
                unit.logs
                    .push(format!("init: cannot start: {e}").as_bytes());
                if let Some(ack) = pending_ack.take() {
                    let _ = ack.send(());
                }
                RunEnd::Exited {
                    exit: Exit::Code(-1),
                    ready_for: None,
                    note: format!("cannot start: {e}"),
                }
            }
        };

        match end {
            RunEnd::Dropped => return,
            RunEnd::Stopped(ack) => {
                want_up = false;
                let output = output();
                set(&unit, &sup, |s| {
                    s.state = ServiceState::Stopped;
                    s.message.clear();
                    s.output = output;
                });
                let _ = ack.send(());
            }
            RunEnd::Restart(ack) => {
                backoff = initial;
                pending_ack = Some(ack);
            }
            RunEnd::Exited {
                exit,
                ready_for,
                note,
            } => {
                let last = if note.is_empty() {
                    exit.to_string()
                } else {
                    note.clone()
                };
                tracing::info!(unit = %unit.id, exit = %last, "ended");
                // The output with the exit, before the state says it ended: whoever waits for
                // the end reads both.
                let output = output();
                set(&unit, &sup, |s| {
                    s.last_exit = exit.to_string();
                    s.output = output;
                });
                if *stopping.borrow() {
                    want_up = false;
                    set(&unit, &sup, |s| s.state = ServiceState::Stopped);
                    continue;
                }
                if exit.code() == Some(PERMANENT_FAILURE_EXIT) {
                    want_up = false;
                    set(&unit, &sup, |s| {
                        s.state = ServiceState::Failed;
                        s.message = format!(
                            "permanent failure: exit {PERMANENT_FAILURE_EXIT}, not restarted"
                        );
                    });
                    continue;
                }
                if !launch.restart_always {
                    want_up = false;
                    set(&unit, &sup, |s| {
                        if exit == Exit::Code(0) {
                            s.state = ServiceState::Finished;
                            s.message.clear();
                        } else {
                            s.state = ServiceState::Failed;
                            s.message = format!("ended: {last}");
                        }
                    });
                    continue;
                }
                // A run that was ready long enough was healthy: back off from the start again.
                // Otherwise the delay doubles up to its cap, and the unit is restarted forever.
                if ready_for.is_some_and(|d| d >= healthy_run) {
                    backoff = initial;
                }
                if backoff == max {
                    tracing::warn!(unit = %unit.id, exit = %last,
                        "failing repeatedly; restarting every {} ms", max.as_millis());
                }
                set(&unit, &sup, |s| {
                    s.state = ServiceState::Waiting;
                    s.message = format!("restarting in {} ms after {last}", backoff.as_millis());
                });
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                backoff = (backoff * 2).min(max);
                tokio::select! {
                    _ = &mut sleep => {}
                    _ = stopping.wait_for(|s| *s) => {
                        want_up = false;
                        set(&unit, &sup, |s| { s.state = ServiceState::Stopped; s.message.clear(); });
                    }
                    cmd = cmds.recv() => match cmd {
                        None => return,
                        Some(Cmd::Stop(ack)) => {
                            want_up = false;
                            set(&unit, &sup, |s| { s.state = ServiceState::Stopped; s.message.clear(); });
                            let _ = ack.send(());
                        }
                        Some(Cmd::Restart(ack)) | Some(Cmd::Start(ack)) => pending_ack = Some(ack),
                    }
                }
            }
        }
    }
}

/// Spawns the unit's program in its sandbox with its output and readiness pipes.
async fn spawn(unit: &Arc<Unit>, launch: &Launch, reaper: &Reaper) -> Result<Running, String> {
    let launch = launch.clone();
    let program = unit.id.clone();
    let (child, out, notify) = tokio::task::spawn_blocking(move || {
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let (out_r, out_w) = nix::unistd::pipe2(cloexec).map_err(|e| format!("pipe: {e}"))?;
        let err_w = out_w.try_clone().map_err(|e| format!("pipe: {e}"))?;
        let mut cmd = sandbox::Command::new(&launch.program)
            .args(&launch.args)
            .stdout(out_w)
            .stderr(err_w);
        if let Ok(null) = std::fs::File::open("/dev/null") {
            cmd = cmd.stdin(OwnedFd::from(null));
        }
        let mut notify_r = None;
        if launch.readiness == Readiness::Notify {
            let (r, w) = nix::unistd::pipe2(cloexec).map_err(|e| format!("pipe: {e}"))?;
            cmd = cmd.fd("notify", w);
            notify_r = Some(r);
        }
        if let Some(listen) = &launch.listen {
            let fd = listen
                .try_clone()
                .map_err(|e| format!("dup listen fd: {e}"))?;
            cmd = cmd.fd("listen", fd);
        }
        let prepared = sandbox::Prepared::new(&launch.policy, cmd)
            .map_err(|e| cosi::error::Chain(&e).to_string())?;
        let child = sandbox::spawn(&prepared).map_err(|e| cosi::error::Chain(&e).to_string())?;
        drop(prepared); // our copies of the write ends: EOF comes when the program closes them
        Ok::<_, String>((child, out_r, notify_r))
    })
    .await
    .map_err(|e| format!("spawn task: {e}"))??;
    let exit = reaper.watch(child.pid());
    let output = tokio::spawn(unit.logs.clone().collect(out, program));
    let notify = match notify {
        Some(fd) => Some(
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                .map_err(|e| format!("notify pipe: {e}"))?,
        ),
        None => None,
    };
    tracing::info!(unit = %unit.id, pid = child.pid(), "started");
    Ok(Running {
        child,
        exit,
        notify,
        output,
    })
}

/// Watches one run until it ends or a command ends it.
async fn supervise(
    unit: &Arc<Unit>,
    launch: &Launch,
    sup: &Arc<Supervisor>,
    mut running: Running,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
) -> RunEnd {
    let pid = running.child.pid();
    let mut ready_at: Option<Instant> = (launch.readiness == Readiness::Exec).then(Instant::now);
    if ready_at.is_some() {
        observe_later(
            unit.clone(),
            sup.clone(),
            running.child.applied().clone(),
            pid,
            launch,
        );
    }
    let deadline = tokio::time::sleep(launch.ready_timeout);
    tokio::pin!(deadline);
    let mut buf = [0u8; 64];
    let end = loop {
        tokio::select! {
            exit = &mut running.exit => {
                let exit = exit.unwrap_or(Exit::Code(-1));
                break RunEnd::Exited { exit, ready_for: ready_at.map(|t| t.elapsed()), note: String::new() };
            }
            n = async {
                match running.notify.as_mut() {
                    Some(r) => r.read(&mut buf).await,
                    None => std::future::pending().await,
                }
            } => {
                match n {
                    Ok(n) if n > 0 && ready_at.is_none() => {
                        ready_at = Some(Instant::now());
                        set(unit, sup, |s| {
                            s.state = ServiceState::Running;
                            s.ready = true;
                            s.healthy = true;
                        });
                        tracing::info!(unit = %unit.id, pid, "ready");
                        observe_later(unit.clone(), sup.clone(), running.child.applied().clone(), pid, launch);
                    }
                    Ok(n) if n > 0 => {}
                    _ => running.notify = None, // closed: readiness said, or never will be
                }
            }
            _ = &mut deadline, if ready_at.is_none() => {
                tracing::warn!(unit = %unit.id, pid, "not ready in time: killing it");
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                let exit = (&mut running.exit).await.unwrap_or(Exit::Signal(9));
                break RunEnd::Exited {
                    exit,
                    ready_for: None,
                    note: format!("not ready within {} ms", launch.ready_timeout.as_millis()),
                };
            }
            cmd = cmds.recv() => match cmd {
                Some(Cmd::Start(ack)) => { let _ = ack.send(()); }
                Some(Cmd::Stop(ack)) => {
                    set(unit, sup, |s| s.state = ServiceState::Stopping);
                    let exit = terminate(pid, launch.stop_timeout, &mut running.exit).await;
                    set(unit, sup, |s| s.last_exit = exit.to_string());
                    break RunEnd::Stopped(ack);
                }
                Some(Cmd::Restart(ack)) => {
                    set(unit, sup, |s| s.state = ServiceState::Stopping);
                    let exit = terminate(pid, launch.stop_timeout, &mut running.exit).await;
                    set(unit, sup, |s| s.last_exit = exit.to_string());
                    break RunEnd::Restart(ack);
                }
                None => {
                    let _ = terminate(pid, launch.stop_timeout, &mut running.exit).await;
                    break RunEnd::Dropped;
                }
            }
        }
    };
    // Whatever it left in its process group goes with it.
    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    if !launch.restart_always {
        // Every line it printed is in the buffer before a one-shot run's output is taken.
        let _ = tokio::time::timeout(OUTPUT_DRAIN, &mut running.output).await;
    }
    set(unit, sup, |s| {
        s.pid = 0;
        s.ready = false;
        s.healthy = false;
    });
    end
}

/// SIGTERM to the process group, SIGKILL after `grace`; returns how the leader ended.
async fn terminate(pid: i32, grace: Duration, exit: &mut oneshot::Receiver<Exit>) -> Exit {
    let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
    match tokio::time::timeout(grace, &mut *exit).await {
        Ok(e) => e.unwrap_or(Exit::Code(-1)),
        Err(_) => {
            tracing::warn!(pid, "did not stop within the grace period: SIGKILL");
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            exit.await.unwrap_or(Exit::Signal(9))
        }
    }
}

/// How often a running daemon's sandbox is read back from /proc again, so its `DaemonSecurity`
/// follows what the kernel says (threads come and go) and not a snapshot of its start.
const OBSERVE_EVERY: Duration = Duration::from_secs(10);

/// Reads the unit's sandbox back from /proc (every thread) once it is ready, again a little
/// later (threads a runtime starts lazily), then every [`OBSERVE_EVERY`] while it runs.
fn observe_later(
    unit: Arc<Unit>,
    sup: Arc<Supervisor>,
    applied: sandbox::Applied,
    pid: i32,
    launch: &Launch,
) {
    let Some(audit) = launch.audit.clone() else {
        return;
    };
    *unit.applied.lock().unwrap_or_else(|e| e.into_inner()) = Some((pid, applied.clone()));
    tokio::spawn(async move {
        let delays = [Duration::ZERO, Duration::from_secs(2)]
            .into_iter()
            .chain(std::iter::repeat(OBSERVE_EVERY));
        for delay in delays {
            tokio::time::sleep(delay).await;
            if unit.status.borrow().pid != pid {
                return;
            }
            let applied = applied.clone();
            let audit = audit.clone();
            let observed = tokio::task::spawn_blocking(move || {
                sandbox::observe(pid).map(|o| audit.describe(o.with_applied(applied)))
            })
            .await;
            match observed {
                Ok(Ok(spec)) => {
                    *unit.security.lock().unwrap_or_else(|e| e.into_inner()) = Some(spec);
                    sup.changed.notify_one();
                }
                Ok(Err(e)) => tracing::debug!(unit = %unit.id, error = %e, "cannot observe"),
                Err(_) => return,
            }
        }
    });
}
