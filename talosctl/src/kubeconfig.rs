//! `talosctl kubeconfig [PATH]`: an admin kubeconfig from a control plane node (the
//! `Kubeconfig` RPC: a tar.gz holding one file `kubeconfig`), merged into the user's
//! kubeconfig or written as a file, as upstream's talosctl:
//! - no PATH: the first file of `$KUBECONFIG`, else `~/.kube/config`; a directory: its
//!   `kubeconfig`;
//! - `--merge` (the default): clusters, users and contexts are added; one whose name is taken
//!   by a different entry is renamed `<name>-1`, `-2`… (`--force`: replaced instead); the new
//!   context becomes the current one;
//! - `--merge=false`: the file is written whole; an existing file only with `--force`.
//!
//! Files are written 0600 through a temporary file and a rename: a failure leaves the old file.

use std::io::{Read as _, Write};
use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use crate::api::Api;

/// `talosctl kubeconfig`.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeconfigArgs {
    /// Where to write it: a file, or a directory (its `kubeconfig`). Default: the first file
    /// of $KUBECONFIG, else ~/.kube/config.
    pub path: Option<PathBuf>,
    /// Replace what is there: the whole file with --merge=false, entries of the same name when
    /// merging.
    #[arg(short, long)]
    pub force: bool,
    /// Merge into an existing kubeconfig (--merge=false writes the file whole).
    #[arg(short, long, default_value_t = true, action = clap::ArgAction::Set)]
    pub merge: bool,
    /// The name of the new context (default: admin@<cluster>).
    #[arg(long, value_name = "NAME")]
    pub force_context_name: Option<String>,
}

/// Where the kubeconfig goes.
fn target(path: Option<&Path>) -> anyhow::Result<PathBuf> {
    let p = match path {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("KUBECONFIG")
            .and_then(|v| std::env::split_paths(&v).find(|p| !p.as_os_str().is_empty()))
        {
            Some(p) => p,
            None => {
                let home = std::env::var_os("HOME")
                    .ok_or_else(|| anyhow::anyhow!("no PATH given and $HOME is not set"))?;
                PathBuf::from(home).join(".kube").join("config")
            }
        },
    };
    Ok(if p.is_dir() { p.join("kubeconfig") } else { p })
}

/// The `kubeconfig` file of upstream's tar.gz.
///
/// # Errors
///
/// A broken archive, or one without that file.
pub fn extract(archive: &[u8]) -> anyhow::Result<String> {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    for entry in tar.entries()? {
        let mut e = entry?;
        if e.path()?.as_os_str() == "kubeconfig" {
            // A kubeconfig is a few KiB: refuse a giant.
            if e.header().size()? > 1024 * 1024 {
                anyhow::bail!("the node sent a kubeconfig larger than 1 MiB");
            }
            let mut text = String::new();
            e.read_to_string(&mut text)?;
            return Ok(text);
        }
    }
    anyhow::bail!("the node's answer holds no kubeconfig")
}

fn entries<'a>(doc: &'a mut Mapping, key: &str) -> &'a mut Vec<Value> {
    let v = doc
        .entry(Value::from(key))
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if !v.is_sequence() {
        *v = Value::Sequence(Vec::new());
    }
    match v {
        Value::Sequence(s) => s,
        _ => unreachable!("made a sequence above"),
    }
}

fn name_of(v: &Value) -> Option<&str> {
    v.get("name").and_then(Value::as_str)
}

/// Merges `new` into `existing` (both kubeconfig documents); returns the merged document and
/// the name of the new context, now the current one.
///
/// # Errors
///
/// A document that is not a kubeconfig mapping.
pub fn merge(
    existing: &str,
    new: &str,
    force: bool,
    context_name: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let mut base: Value = if existing.trim().is_empty() {
        Value::Mapping(Mapping::new())
    } else {
        serde_yaml_ng::from_str(existing)
            .map_err(|e| anyhow::anyhow!("the existing kubeconfig is not YAML: {e}"))?
    };
    let new: Value = serde_yaml_ng::from_str(new)?;
    let Value::Mapping(base_map) = &mut base else {
        anyhow::bail!("the existing kubeconfig is not a mapping");
    };
    for (k, v) in [("apiVersion", "v1"), ("kind", "Config")] {
        base_map
            .entry(Value::from(k))
            .or_insert_with(|| Value::from(v));
    }
    // Each section: the new entries, renamed when their name is taken by a different entry.
    let mut renamed: std::collections::BTreeMap<(String, String), String> = Default::default();
    for section in ["clusters", "users"] {
        let incoming = new
            .get(section)
            .and_then(Value::as_sequence)
            .cloned()
            .unwrap_or_default();
        let list = entries(base_map, section);
        for mut item in incoming {
            let Some(name) = name_of(&item).map(str::to_string) else {
                continue;
            };
            let final_name = place(list, &mut item, &name, force, None);
            renamed.insert((section.to_string(), name), final_name);
        }
    }
    let mut current = String::new();
    let incoming = new
        .get("contexts")
        .and_then(Value::as_sequence)
        .cloned()
        .unwrap_or_default();
    let list = entries(base_map, "contexts");
    for mut item in incoming {
        let Some(name) = name_of(&item).map(str::to_string) else {
            continue;
        };
        if let Some(Value::Mapping(ctx)) = item.get_mut("context") {
            for (field, section) in [("cluster", "clusters"), ("user", "users")] {
                let old = ctx.get(field).and_then(Value::as_str).map(str::to_string);
                if let Some(to) = old.and_then(|o| renamed.get(&(section.to_string(), o))) {
                    ctx.insert(Value::from(field), Value::from(to.as_str()));
                }
            }
        }
        current = place(list, &mut item, &name, force, context_name);
    }
    if !current.is_empty() {
        base_map.insert(
            Value::from("current-context"),
            Value::from(current.as_str()),
        );
    }
    Ok((serde_yaml_ng::to_string(&base)?, current))
}

/// Puts `item` into `list` under `wanted` (or `name`): an identical entry is kept, a different
/// one of that name replaced (`force`) or the item renamed `<name>-N`. Its final name.
fn place(
    list: &mut Vec<Value>,
    item: &mut Value,
    name: &str,
    force: bool,
    wanted: Option<&str>,
) -> String {
    let mut final_name = wanted.unwrap_or(name).to_string();
    let set_name = |item: &mut Value, n: &str| {
        if let Value::Mapping(m) = item {
            m.insert(Value::from("name"), Value::from(n));
        }
    };
    set_name(item, &final_name);
    if let Some(i) = list.iter().position(|v| name_of(v) == Some(&final_name)) {
        if list[i] == *item {
            return final_name;
        }
        if force {
            list[i] = item.clone();
            return final_name;
        }
        let base = final_name.clone();
        let mut n = 1;
        loop {
            let candidate = format!("{base}-{n}");
            set_name(item, &candidate);
            match list.iter().position(|v| name_of(v) == Some(&candidate)) {
                None => {
                    final_name = candidate;
                    break;
                }
                Some(j) if list[j] == *item => return candidate,
                Some(_) => n += 1,
            }
        }
    }
    list.push(item.clone());
    final_name
}

/// Writes `text` to `path` 0600 through a temporary file in its directory (made 0700 if new).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("cannot make {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.talosctl-{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("kubeconfig"),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        anyhow::bail!("cannot write {}: {e}", path.display());
    }
    Ok(())
}

/// `talosctl kubeconfig`: one control plane node.
///
/// # Errors
///
/// The node's refusal, or a file that cannot be read or written.
pub async fn run(api: &Api, args: &KubeconfigArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let targets = api.targets();
    if targets.len() != 1 {
        anyhow::bail!(
            "kubeconfig comes from one control plane node (-n IP): {} nodes are selected",
            targets.len()
        );
    }
    let (label, node) = &targets[0];
    let path = target(args.path.as_deref())?;
    let exists = path.exists();
    if exists && !args.merge && !args.force {
        anyhow::bail!(
            "{} already exists: use --force to overwrite it, or --merge to merge into it",
            path.display()
        );
    }
    let mut c = proto::machine::machine_service_client::MachineServiceClient::new(api.channel()?)
        .max_decoding_message_size(cosi::client::MAX_MESSAGE);
    let mut stream = c
        .kubeconfig(api.for_node((), node.as_deref())?)
        .await
        .map_err(|s| anyhow::anyhow!("{label}: {}", crate::api::explain(api, &s)))?
        .into_inner();
    let mut archive = Vec::new();
    while let Some(d) = stream
        .message()
        .await
        .map_err(|s| anyhow::anyhow!("{label}: {}", crate::api::explain(api, &s)))?
    {
        if archive.len() + d.bytes.len() > 4 * 1024 * 1024 {
            anyhow::bail!("{label}: the kubeconfig archive is larger than 4 MiB");
        }
        archive.extend_from_slice(&d.bytes);
    }
    let mut text = extract(&archive)?;
    let mut context = serde_yaml_ng::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("current-context")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    if args.merge && exists {
        let existing = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        (text, context) = merge(
            &existing,
            &text,
            args.force,
            args.force_context_name.as_deref(),
        )?;
    } else if let Some(name) = &args.force_context_name {
        (text, context) = merge("", &text, true, Some(name))?;
    }
    write_private(&path, &text)?;
    writeln!(
        out,
        "kubeconfig written to {} (context {context})",
        path.display()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, server: &str, key: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\nusers:\n- name: admin@{cluster}\n  user:\n    client-key-data: {key}\ncontexts:\n- context:\n    cluster: {cluster}\n    namespace: default\n    user: admin@{cluster}\n  name: admin@{cluster}\ncurrent-context: admin@{cluster}\n"
        )
    }

    #[test]
    fn merging_adds_renames_on_a_clash_and_is_idempotent() {
        let other = kubeconfig("other", "https://1.2.3.4:6443", "a");
        let demo = kubeconfig("demo", "https://10.5.0.2:6443", "b");
        let (merged, ctx) = merge(&other, &demo, false, None).unwrap();
        assert_eq!(ctx, "admin@demo");
        let v: Value = serde_yaml_ng::from_str(&merged).unwrap();
        assert_eq!(v["contexts"].as_sequence().unwrap().len(), 2);
        assert_eq!(v["current-context"], "admin@demo");
        // Again: nothing new.
        let (again, _) = merge(&merged, &demo, false, None).unwrap();
        assert_eq!(again, merged);
        // The same names with another key: renamed, and the context points at the renamed ones.
        let demo2 = kubeconfig("demo", "https://10.5.0.2:6443", "c");
        let (renamed, ctx) = merge(&merged, &demo2, false, None).unwrap();
        assert_eq!(ctx, "admin@demo-1");
        let v: Value = serde_yaml_ng::from_str(&renamed).unwrap();
        let c = v["contexts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "admin@demo-1")
            .unwrap();
        assert_eq!(c["context"]["user"], "admin@demo-1");
        assert_eq!(c["context"]["cluster"], "demo");
        assert_eq!(v["users"].as_sequence().unwrap().len(), 3);
        // --force: replaced in place.
        let (forced, ctx) = merge(&merged, &demo2, true, None).unwrap();
        assert_eq!(ctx, "admin@demo");
        let v: Value = serde_yaml_ng::from_str(&forced).unwrap();
        assert_eq!(v["users"].as_sequence().unwrap().len(), 2);
        assert!(forced.contains("client-key-data: c"));
        // A context name of one's own.
        let (_, ctx) = merge(&other, &demo, false, Some("mine")).unwrap();
        assert_eq!(ctx, "mine");
    }

    #[test]
    fn a_garbage_archive_is_an_error() {
        assert!(extract(b"not gzip").is_err());
    }
}
