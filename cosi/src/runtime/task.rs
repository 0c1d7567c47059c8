//! The task that runs one controller: wait for a wake-up, reconcile, clean up unasserted
//! outputs, and on failure or panic retry with exponential backoff.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::Chain;
use crate::runtime::context::Context;
use crate::runtime::controller::{Action, Controller};
use crate::runtime::error::ReconcileError;

/// First delay before a failed controller is retried.
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between retries of a failing controller.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How soon a controller is reconciled again when an output waits for finalizers in a kind that
/// none of its inputs watches.
pub const PENDING_POLL: Duration = Duration::from_secs(2);

/// Exponential backoff: `initial`, doubling, capped at `max`; `reset` starts over.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay to wait now; the one after it is twice as long (up to the cap).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// What the controller task is given by the runtime.
pub(crate) struct TaskEnv {
    pub(crate) ctx: Context,
    pub(crate) wake: mpsc::Receiver<()>,
}

/// Runs a controller until its wake channel closes (the runtime stopped).
pub(crate) async fn run_controller<C: Controller>(mut controller: C, env: TaskEnv) {
    let TaskEnv { mut ctx, mut wake } = env;
    let mut backoff = Backoff::new(RESTART_BACKOFF_INITIAL, RESTART_BACKOFF_MAX);
    let mut deadline: Option<Instant> = None;
    let mut cycle: u64 = 0;
    loop {
        let woken = match deadline {
            Some(at) => tokio::select! {
                w = wake.recv() => w.is_some(),
                () = tokio::time::sleep_until(at) => true,
            },
            None => wake.recv().await.is_some(),
        };
        if !woken {
            return;
        }
        loop {
            // A wake-up that arrived before the cycle starts is covered by it.
            let _ = wake.try_recv();
            cycle += 1;
            let span = tracing::debug_span!("reconcile", cycle);
            let outcome = AssertUnwindSafe(run_cycle(&mut controller, &mut ctx))
                .catch_unwind()
                .instrument(span)
                .await;
            let error = match outcome {
                Ok(Ok(action)) => {
                    backoff.reset();
                    let now = Instant::now();
                    deadline = match action {
                        Action::AwaitChange => None,
                        Action::RequeueAfter(d) => Some(now + d),
                    };
                    if ctx.needs_poll() {
                        let poll = now + PENDING_POLL;
                        deadline = Some(deadline.map_or(poll, |d| d.min(poll)));
                    }
                    break;
                }
                Ok(Err(e)) => Chain(&e).to_string(),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            let delay = backoff.next_delay();
            tracing::error!(error = %error, retry_in = ?delay, "reconcile failed");
            tokio::time::sleep(delay).await;
        }
    }
}

/// One cycle: reconcile, then tear down what it did not assert.
async fn run_cycle<C: Controller>(
    controller: &mut C,
    ctx: &mut Context,
) -> Result<Action, ReconcileError> {
    ctx.begin_cycle();
    let action = controller.reconcile(ctx).await?;
    ctx.cleanup().await?;
    Ok(action)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::new(RESTART_BACKOFF_INITIAL, RESTART_BACKOFF_MAX);
        let delays: Vec<u64> = (0..11).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        b.reset();
        assert_eq!(b.next_delay(), RESTART_BACKOFF_INITIAL);
    }

    /// Plays a script of outcomes and records when each attempt started.
    struct Scripted {
        script: std::collections::VecDeque<Option<Result<Action, ()>>>,
        started: std::sync::Arc<std::sync::Mutex<Vec<Duration>>>,
        origin: Instant,
    }

    impl Controller for Scripted {
        fn name(&self) -> &'static str {
            "test.Scripted"
        }
        fn inputs(&self) -> Vec<crate::runtime::Input> {
            vec![]
        }
        fn outputs(&self) -> Vec<crate::runtime::Output> {
            vec![]
        }
        async fn reconcile(&mut self, _: &mut Context) -> Result<Action, ReconcileError> {
            self.started
                .lock()
                .expect("lock")
                .push(self.origin.elapsed());
            match self.script.pop_front() {
                Some(Some(Ok(action))) => Ok(action),
                Some(Some(Err(()))) => Err(ReconcileError::other("scripted failure")),
                Some(None) => panic!("scripted panic"),
                None => Ok(Action::AwaitChange),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_success_resets() {
        let client = crate::Client::new("/nonexistent/stated.sock").expect("lazy client");
        let started = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let controller = Scripted {
            script: [
                Some(Err(())),
                None,
                Some(Err(())),
                Some(Ok(Action::RequeueAfter(Duration::from_secs(1)))),
                None,
                Some(Ok(Action::AwaitChange)),
            ]
            .into(),
            started: started.clone(),
            origin: Instant::now(),
        };
        let (tx, wake) = mpsc::channel(1);
        tx.try_send(()).expect("first wake-up");
        let ctx = Context::new(client, "test.Scripted", vec![], vec![]);
        let task = tokio::spawn(run_controller(controller, TaskEnv { ctx, wake }));
        tokio::time::sleep(Duration::from_secs(60)).await;
        let ms: Vec<u128> = started
            .lock()
            .expect("lock")
            .iter()
            .map(Duration::as_millis)
            .collect();
        // 100, 200, 400 ms of backoff; success; requeue after 1 s; a failure backs off 100 ms
        // again (reset); then the controller sleeps until woken.
        assert_eq!(ms, [0, 100, 300, 700, 1700, 1800]);
        tx.try_send(()).expect("wake-up");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(started.lock().expect("lock").len(), 7);
        drop(tx);
        task.await.expect("ends when the runtime drops the channel");
    }

    #[test]
    fn panic_messages() {
        assert_eq!(panic_message(&"boom"), "boom");
        assert_eq!(panic_message(&String::from("bang")), "bang");
        assert_eq!(panic_message(&7u8), "non-string panic payload");
    }
}
