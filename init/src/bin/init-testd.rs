//! init-testd: a small daemon for init's tests, run under a real sandbox like any daemon.
//!
//! It connects to stated as its own uid, adopts or creates `--count` resources in
//! `--namespace` (never recreating one that exists, as a daemon restarted in place must),
//! optionally writes a `ServiceSpec` there, reports readiness on `--notify-fd` and waits for
//! SIGTERM. `--exit N` makes it exit with code N right away instead (a crash loop, or the
//! permanent-failure code 78).
use std::os::fd::RawFd;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cosi::{Resource, ResourceSpec};
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
struct Args {
    /// stated's socket.
    #[arg(long)]
    socket: std::path::PathBuf,
    /// The namespace it writes.
    #[arg(long)]
    namespace: String,
    /// How many resources it keeps.
    #[arg(long, default_value_t = 3)]
    count: u32,
    /// Readiness fd.
    #[arg(long)]
    notify_fd: Option<RawFd>,
    /// Exit at once with this code.
    #[arg(long)]
    exit: Option<u8>,
    /// A `ServiceSpec` (JSON) to write in its namespace, with ID `--service-id`.
    #[arg(long)]
    service_spec: Option<String>,
    /// ID of that `ServiceSpec`.
    #[arg(long, default_value = "workload")]
    service_id: String,
}

/// One resource of the test daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct TestItemSpec {
    value: String,
}

impl ResourceSpec for TestItemSpec {
    const TYPE: &'static str = "TestItems.init.talos.dev";
    const DEFAULT_NAMESPACE: &'static str = "test";
}

const OWNER: &str = "test.ItemController";

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(code) = args.exit {
        eprintln!("init-testd: exiting with {code} as asked");
        return ExitCode::from(code);
    }
    let d = match sandbox::daemon::Daemon::start("init-testd", "info") {
        Ok(d) => d,
        Err(code) => return code,
    };
    let notify = match d.notifier(args.notify_fd) {
        Ok(n) => n,
        Err(code) => return code,
    };
    d.run(
        Some(2),
        async move { run(args, notify).await.map_err(Failed) },
    )
}

/// A failure of the test daemon, as text.
#[derive(Debug)]
struct Failed(String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

async fn run(args: Args, notify: sandbox::daemon::Notifier) -> Result<(), String> {
    let client = cosi::Client::new(&args.socket).map_err(|e| e.to_string())?;
    for i in 0..args.count {
        let id = format!("item-{i}");
        let mut backoff = Duration::from_millis(50);
        loop {
            match client.get(&args.namespace, TestItemSpec::TYPE, &id).await {
                Ok(_) => break, // adopted: a restart in place keeps what exists
                Err(e) if e.is_not_found() => {
                    let r = Resource::new(
                        args.namespace.clone(),
                        id.clone(),
                        TestItemSpec {
                            value: format!("value {i}"),
                        },
                    );
                    let raw = r.to_raw().map_err(|e| e.to_string())?;
                    match client.create(&raw, OWNER).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => break,
                        Err(e) => eprintln!("init-testd: create {id}: {e}"),
                    }
                }
                Err(e) => eprintln!("init-testd: get {id}: {e}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
    if let Some(json) = &args.service_spec {
        let spec: machinery::resources::runtime::ServiceSpecSpec =
            serde_json::from_str(json).map_err(|e| format!("--service-spec: {e}"))?;
        let r = Resource::new(args.namespace.clone(), args.service_id.clone(), spec);
        let raw = r.to_raw().map_err(|e| e.to_string())?;
        match client
            .get(&args.namespace, &raw.metadata.r#type, &args.service_id)
            .await
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                client
                    .create(&raw, OWNER)
                    .await
                    .map_err(|e| format!("create service spec: {e}"))?;
            }
            Err(e) => return Err(format!("get service spec: {e}")),
        }
    }
    notify.ready();
    eprintln!("init-testd: ready with {} items", args.count);
    sandbox::daemon::shutdown_signal().await;
    eprintln!("init-testd: stopping");
    Ok(())
}
