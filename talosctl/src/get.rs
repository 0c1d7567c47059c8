//! `talosctl get`: read one resource or list a kind, or watch them: through apid from each
//! node (`node` metadata, a NODE column), or from a stated socket (`--socket`).

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use cosi::{Client, EventKind, Query, RawResource, ResourceSpec as _, WatchSpec};
use serde_json::Value;

use crate::output::{printer, Format, Item, Printer};
use crate::resolve::{resolve, Kind};

/// Arguments of `talosctl get`.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// Resource type: full name (`Hostnames.net.talos.dev`), display name (`HostnameStatus`) or
    /// any alias (`hostname`), in any case. `talosctl get rd` lists the types and their aliases.
    #[arg(value_name = "TYPE")]
    pub r#type: String,

    /// ID of one resource; without it, every resource of the type in the namespace.
    #[arg(value_name = "ID")]
    pub id: Option<String>,

    /// Namespace to read [default: the type's default namespace from its resource definition].
    /// Required for a type that has no resource definition.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, value_name = "FORMAT")]
    pub output: Format,

    /// Print the current state, then every change until interrupted. Table rows start with `+`
    /// (created), `-` (destroyed) or a blank (updated); YAML and JSON carry `event:`.
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// Read through the maintenance API of a node that has no configuration yet (`-n IP`),
    /// without a client certificate, trusting the node's certificate as it is (as upstream;
    /// `apply-config --insecure --cert-fingerprint` pins it).
    #[arg(short = 'i', long)]
    pub insecure: bool,
}

/// Long help of `get`, with examples.
pub const LONG_ABOUT: &str = "\
Get a resource, list the resources of a type, or watch them.

The type may be given as its full name, its display name or any alias, in any case; talosctl
resolves it through the ResourceDefinitions in the `meta` namespace (`talosctl get rd` lists them,
with their aliases) and reads the type's default namespace unless --namespace is given. A type
without a definition is read verbatim, and then needs --namespace.

The table shows NAMESPACE, TYPE, ID, VERSION and the columns the type's definition declares;
YAML and JSON show the full metadata and the spec, whatever the type.";

/// Examples shown after the help of `get`.
pub const EXAMPLES: &str = "\
Examples:
  # list all resource types, with their aliases
  talosctl get rd

  # one resource, as YAML
  talosctl get hostnamestatus hostname -o yaml

  # every namespace, as JSON lines (one object per line)
  talosctl get ns -o json

  # follow changes of a type in a given namespace
  talosctl get addresses --namespace network --watch";

/// One node `get` reads from: its State API, and what names it in the output.
pub struct Source {
    /// The NODE column's value; `None`: the local node, no NODE column.
    pub node: Option<String>,
    /// Its State API (stated's socket, or apid with the `node` metadata).
    pub client: Client,
    /// Through apid: the full machine configuration is not served there, its redacted copy is.
    pub remote: bool,
}

/// Runs `get` against the stated at `socket`, printing to `out`.
pub async fn run(socket: &Path, args: &GetArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if !socket.exists() {
        anyhow::bail!(
            "stated socket {} does not exist: is stated running? (set --socket or TALOS_SOCKET)",
            socket.display()
        );
    }
    let client = Client::new(socket)
        .with_context(|| format!("cannot use stated socket {}", socket.display()))?;
    let source = Source {
        node: None,
        client,
        remote: false,
    };
    run_on(&[source], args, out).await
}

/// Runs `get` on every source: one table (or stream of documents) with a NODE column when
/// the sources are named. A node that fails does not hide the others: the error names it.
pub async fn run_on(sources: &[Source], args: &GetArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let Some(first) = sources.first() else {
        anyhow::bail!("no node to read from");
    };
    let mut kind = resolve(&first.client, &args.r#type, args.namespace.as_deref())
        .await
        .map_err(|e| match &first.node {
            Some(n) => e.context(format!("node {n}")),
            None => e,
        })?;
    // apid serves no key material: the machine configuration comes from its redacted copy.
    if first.remote
        && args.namespace.is_none()
        && kind.r#type == machinery::resources::config::MachineConfigSpec::TYPE
        && kind.namespace == machinery::resources::config::NAMESPACE
    {
        kind.namespace = machinery::resources::config::REDACTED_NAMESPACE.to_string();
        eprintln!(
            "note: through the Talos API the machine configuration is read from namespace {:?}, \
             its copy without secrets (talos-rs keeps keys out of apid)",
            kind.namespace
        );
    }
    let named = first.node.is_some();
    let mut printer = printer(
        args.output,
        &kind.display_type,
        kind.columns.clone(),
        args.watch,
        named,
    );
    printer.begin(out)?;
    if args.watch {
        return watch(sources, &kind, args.id.as_deref(), printer.as_mut(), out).await;
    }
    let mut errors = Vec::new();
    for source in sources {
        let resources = match &args.id {
            Some(id) => get_one(&source.client, &kind, id).await.map(|r| vec![r]),
            None => source
                .client
                .list(&kind.namespace, &kind.r#type, &Query::default())
                .await
                .with_context(|| format!("cannot list {}", describe(&kind))),
        };
        match resources {
            Ok(resources) => {
                for r in &resources {
                    print(printer.as_mut(), out, r, None, source.node.as_deref())?;
                }
            }
            Err(e) if sources.len() == 1 && source.node.is_none() => return Err(e),
            Err(e) => errors.push(format!(
                "{}: {}",
                source.node.as_deref().unwrap_or("local"),
                cosi::error::Chain(e.as_ref())
            )),
        }
    }
    printer.flush(out)?;
    out.flush()?;
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("\n"))
    }
}

async fn get_one(client: &Client, kind: &Kind, id: &str) -> anyhow::Result<RawResource> {
    match client.get(&kind.namespace, &kind.r#type, id).await {
        Ok(r) => Ok(r),
        Err(e) if e.is_not_found() => anyhow::bail!(
            "resource {} {id:?} not found in namespace {:?}",
            kind.r#type,
            kind.namespace
        ),
        Err(e) => Err(e).with_context(|| format!("cannot get {} {id:?}", describe(kind))),
    }
}

/// Watches every source at once; events are printed as they come, each with its node.
async fn watch(
    sources: &[Source],
    kind: &Kind,
    id: Option<&str>,
    printer: &mut dyn Printer,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    for source in sources {
        let mut watch = source.client.watch(WatchSpec {
            namespace: kind.namespace.clone(),
            r#type: kind.r#type.clone(),
            id: id.map(str::to_string),
            bootstrap: id.is_none(),
            // Only the resource is printed.
            omit_old: true,
            ..WatchSpec::default()
        });
        let (tx, node) = (tx.clone(), source.node.clone());
        tokio::spawn(async move {
            while let Some(batch) = watch.next_batch().await {
                let end = batch.is_err();
                if tx.send((node.clone(), batch)).await.is_err() || end {
                    return;
                }
            }
        });
    }
    drop(tx);
    // A kind watch prints a node's initial contents in one go once they are all there; a
    // single resource watch has no bootstrap phase.
    let mut bootstrapped = std::collections::HashSet::new();
    while let Some((node, batch)) = rx.recv().await {
        let batch = batch.with_context(|| {
            let of = node
                .as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default();
            format!("watch of {}{of} failed", describe(kind))
        })?;
        for event in batch {
            match event.kind {
                EventKind::Created | EventKind::Updated | EventKind::Destroyed => {
                    // A single resource watch starts with a tombstone when the resource does not
                    // exist yet: nothing to show.
                    if event.kind == EventKind::Destroyed && event.resource.metadata.version == 0 {
                        continue;
                    }
                    print(
                        printer,
                        out,
                        &event.resource,
                        Some(event.kind),
                        node.as_deref(),
                    )?;
                }
                EventKind::Bootstrapped => {
                    bootstrapped.insert(node.clone());
                }
                EventKind::Noop => {}
            }
        }
        if id.is_some() || bootstrapped.contains(&node) {
            printer.flush(out)?;
            out.flush()?;
        }
    }
    Ok(())
}

fn print(
    printer: &mut dyn Printer,
    out: &mut dyn Write,
    resource: &RawResource,
    event: Option<EventKind>,
    node: Option<&str>,
) -> std::io::Result<()> {
    let item = Item {
        resource,
        spec: spec_of(resource),
        event,
        node,
    };
    printer.resource(out, &item)
}

/// The spec as a generic value: the CBOR spec, else the YAML rendering a COSI client may have sent
/// along, else (with a warning) null.
fn spec_of(resource: &RawResource) -> Value {
    match resource.spec_value() {
        Ok(v) => v,
        Err(e) => {
            if !resource.yaml_spec.is_empty() {
                if let Ok(v) = serde_yaml_ng::from_str::<Value>(&resource.yaml_spec) {
                    return v;
                }
            }
            eprintln!(
                "warning: cannot decode the spec of {}: {}",
                resource.metadata.pointer(),
                cosi::error::Chain(&e)
            );
            Value::Null
        }
    }
}

fn describe(kind: &Kind) -> String {
    format!("{} in namespace {:?}", kind.r#type, kind.namespace)
}
