//! The node's `/etc/hosts`, `/etc/resolv.conf` and `/etc/hostname`:
//!
//! - `network.EtcFileController` renders them as EtcFileSpec resources from HostnameStatus,
//!   ResolverStatus, the `default` NodeAddress and `machine.network.extraHostEntries`
//!   (upstream `network/etcfile.go`);
//! - `files.EtcFileController` writes each EtcFileSpec under a root directory (`/` on a node,
//!   a temporary directory in tests), atomically where it can, and records an EtcFileStatus
//!   with the spec version it wrote.
//!
//! networkd runs no host DNS cache, so `/etc/resolv.conf` lists the upstream resolvers (at most
//! three, as the C library reads no more) where upstream points at `127.0.0.53`.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use cosi::{Phase, Resource};
use machinery::resources::network::{
    EtcFileSpecSpec, EtcFileStatusSpec, HostnameStatusSpec, NodeAddressSpec, ResolverStatusSpec,
    ETC_HOSTNAME_ID, ETC_HOSTS_ID, ETC_RESOLV_CONF_ID, HOSTNAME_ID, NAMESPACE,
    NODE_ADDRESS_DEFAULT_ID, RESOLVER_ID,
};

use super::source::{self, Machine, Sources};

/// Mode of the rendered files.
pub const ETC_FILE_MODE: u32 = 0o644;
/// At most this many `nameserver` lines (glibc `MAXNS`).
pub const MAX_NAMESERVERS: usize = 3;

/// `/etc/resolv.conf` for these resolvers.
pub fn render_resolv_conf(status: &ResolverStatusSpec) -> String {
    let mut out = String::new();
    for server in status.dns_servers.iter().take(MAX_NAMESERVERS) {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !status.search_domains.is_empty() {
        out.push_str(&format!("\nsearch {}\n", status.search_domains.join(" ")));
    }
    out
}

/// `/etc/hosts`: localhost, the node's default address with its names, the IPv6 standard
/// entries, then the extra entries grouped by address and sorted; columns aligned as Go's
/// tabwriter does (padding 1).
pub fn render_hosts(
    hostname: &HostnameStatusSpec,
    default_address: Option<IpAddr>,
    extra: &[(IpAddr, Vec<String>)],
) -> String {
    let mut rows: Vec<(String, String)> = vec![("127.0.0.1".into(), "localhost".into())];
    if let Some(addr) = default_address {
        rows.push((addr.to_string(), hostname.dns_names().join(" ")));
    }
    rows.push(("::1".into(), "localhost ip6-localhost ip6-loopback".into()));
    rows.push(("ff02::1".into(), "ip6-allnodes".into()));
    rows.push(("ff02::2".into(), "ip6-allrouters".into()));
    let mut grouped: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for (ip, names) in extra {
        let entry = grouped.entry(*ip).or_default();
        for n in names {
            if !entry.contains(n) {
                entry.push(n.clone());
            }
        }
    }
    rows.extend(
        grouped
            .into_iter()
            .map(|(ip, names)| (ip.to_string(), names.join(" "))),
    );
    let width = rows.iter().map(|(ip, _)| ip.len()).max().unwrap_or(0) + 1;
    rows.iter()
        .map(|(ip, names)| format!("{ip:<width$}{names}\n"))
        .collect()
}

/// `network.EtcFileController`.
#[derive(Debug, Default)]
pub struct EtcFileController {
    sources: Sources,
}

impl EtcFileController {
    async fn run(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let extra = match self.sources.machine(ctx).await? {
            Machine::Valid(m) => m.extra_hosts.clone(),
            Machine::Absent => Vec::new(),
            Machine::Keep => {
                source::keep_outputs::<EtcFileSpecSpec>(ctx, NAMESPACE).await?;
                return Ok(Action::AwaitChange);
            }
        };
        let hostname = ctx
            .get::<HostnameStatusSpec>(NAMESPACE, HOSTNAME_ID)
            .await?
            .filter(|h| h.metadata.phase == Phase::Running);
        let resolvers = ctx
            .get::<ResolverStatusSpec>(NAMESPACE, RESOLVER_ID)
            .await?
            .filter(|r| r.metadata.phase == Phase::Running);
        let default = ctx
            .get::<NodeAddressSpec>(NAMESPACE, NODE_ADDRESS_DEFAULT_ID)
            .await?
            .and_then(|n| n.spec.addresses.first().map(|a| a.addr()));
        let file = |contents: String| EtcFileSpecSpec {
            contents,
            mode: ETC_FILE_MODE,
        };
        if let Some(r) = resolvers {
            ctx.apply(Resource::new(
                NAMESPACE,
                ETC_RESOLV_CONF_ID,
                file(render_resolv_conf(&r.spec)),
            ))
            .await?;
        }
        if let Some(h) = hostname {
            ctx.apply(Resource::new(
                NAMESPACE,
                ETC_HOSTS_ID,
                file(render_hosts(&h.spec, default, &extra)),
            ))
            .await?;
            ctx.apply(Resource::new(
                NAMESPACE,
                ETC_HOSTNAME_ID,
                file(format!("{}\n", h.spec.hostname)),
            ))
            .await?;
        }
        Ok(Action::AwaitChange)
    }
}

impl Controller for EtcFileController {
    fn name(&self) -> &'static str {
        "network.EtcFileController"
    }

    fn inputs(&self) -> Vec<Input> {
        let mut inputs = source::inputs();
        inputs.extend([
            Input::weak::<HostnameStatusSpec>(NAMESPACE).with_id(HOSTNAME_ID),
            Input::weak::<ResolverStatusSpec>(NAMESPACE).with_id(RESOLVER_ID),
            Input::weak::<NodeAddressSpec>(NAMESPACE).with_id(NODE_ADDRESS_DEFAULT_ID),
        ]);
        inputs
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<EtcFileSpecSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

/// `files.EtcFileController`: writes EtcFileSpecs under `root/etc/`.
#[derive(Debug)]
pub struct EtcFileWriterController {
    root: PathBuf,
}

impl EtcFileWriterController {
    /// A writer into `root/etc` (`/` on a node).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    async fn run(&self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let specs = ctx.list::<EtcFileSpecSpec>(NAMESPACE).await?;
        let dir = self.root.join("etc");
        for spec in specs.iter().filter(|s| s.metadata.phase == Phase::Running) {
            let name = match machinery::path_id::file_name(spec.id()) {
                Ok(name) => name,
                Err(e) => {
                    tracing::warn!(error = %e, "not written");
                    continue;
                }
            };
            let path = dir.join(name);
            let version = spec.metadata.version.to_string();
            let written = ctx
                .get::<EtcFileStatusSpec>(NAMESPACE, spec.id())
                .await?
                .is_some_and(|s| s.spec.spec_version == version);
            let current = tokio::fs::read_to_string(&path).await.ok();
            if !written || current.as_deref() != Some(spec.spec.contents.as_str()) {
                write_file(&path, &spec.spec.contents, spec.spec.mode)
                    .await
                    .map_err(|e| ReconcileError::failed(format!("write {}", path.display()), e))?;
                tracing::info!(path = %path.display(), version = %version, "etc file written");
            }
            ctx.apply(Resource::new(
                NAMESPACE,
                spec.id(),
                EtcFileStatusSpec {
                    spec_version: version,
                    path: path.display().to_string(),
                },
            ))
            .await?;
        }
        Ok(Action::AwaitChange)
    }
}

/// Writes through a temporary file and a rename, so that readers see the old or the new
/// file; where the target cannot be replaced (a bind mount in a container) it is rewritten in
/// place.
async fn write_file(path: &Path, contents: &str, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.networkd-tmp"));
    tokio::fs::write(&tmp, contents).await?;
    tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).await?;
    match tokio::fs::rename(&tmp, path).await {
        Ok(()) => Ok(()),
        Err(_) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            tokio::fs::write(path, contents).await
        }
    }
}

impl Controller for EtcFileWriterController {
    fn name(&self) -> &'static str {
        "files.EtcFileController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<EtcFileSpecSpec>(NAMESPACE)]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<EtcFileStatusSpec>()]
    }

    fn reconcile<'a>(
        &'a mut self,
        ctx: &'a mut Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'a {
        self.run(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_resolv_conf() {
        let h = HostnameStatusSpec {
            hostname: "node-1".into(),
            domainname: "example.com".into(),
        };
        let hosts = render_hosts(
            &h,
            Some("10.0.0.2".parse().expect("ip")),
            &[
                ("10.0.0.10".parse().expect("ip"), vec!["registry".into()]),
                ("10.0.0.1".parse().expect("ip"), vec!["gw".into()]),
                ("10.0.0.10".parse().expect("ip"), vec!["mirror".into()]),
            ],
        );
        assert_eq!(
            hosts,
            "127.0.0.1 localhost\n\
             10.0.0.2  node-1.example.com node-1\n\
             ::1       localhost ip6-localhost ip6-loopback\n\
             ff02::1   ip6-allnodes\n\
             ff02::2   ip6-allrouters\n\
             10.0.0.1  gw\n\
             10.0.0.10 registry mirror\n"
        );
        let r = ResolverStatusSpec {
            dns_servers: ["1.1.1.1", "8.8.8.8", "9.9.9.9", "10.0.0.1"]
                .iter()
                .map(|s| s.parse().expect("ip"))
                .collect(),
            search_domains: vec!["example.com".into(), "corp".into()],
        };
        assert_eq!(
            render_resolv_conf(&r),
            "nameserver 1.1.1.1\nnameserver 8.8.8.8\nnameserver 9.9.9.9\n\nsearch example.com corp\n"
        );
    }
}
