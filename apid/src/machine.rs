//! `machine.MachineService`, the part that exists on a talos-rs node: version, hostname,
//! applying a configuration, client configurations, services and their logs, the kernel log,
//! reboot and shutdown. Process control goes to init's control
//! socket (the one call that is not a resource, DESIGN.md §1); the rest is read from stated.
//! While stated is down, Version and the service calls keep answering (init does not need
//! stated); Hostname says stated is not answering.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use machinery::resources::network::{HostnameStatusSpec, HOSTNAME_ID, NAMESPACE as NETWORK};
use machinery::resources::runtime::{MachineStatusSpec, MACHINE_STATUS_ID, NAMESPACE as RUNTIME};
use proto::common::Data;
use proto::init::init_client::InitClient;
use proto::init::{
    ApplyRequest, DmesgRequest as InitDmesg, LogsRequest as InitLogs, PowerRequest, ServiceRequest,
};
use proto::machine::machine_service_server::MachineService;
use proto::machine::{
    ApplyConfiguration, ApplyConfigurationRequest, ApplyConfigurationResponse, Bootstrap,
    BootstrapRequest, BootstrapResponse, DmesgRequest, EtcdAlarm, EtcdAlarmDisarm,
    EtcdAlarmDisarmResponse, EtcdAlarmListResponse, EtcdDefragment, EtcdDefragmentResponse,
    EtcdForfeitLeadership, EtcdForfeitLeadershipRequest, EtcdForfeitLeadershipResponse,
    EtcdLeaveCluster, EtcdLeaveClusterRequest, EtcdLeaveClusterResponse, EtcdMemberListRequest,
    EtcdMemberListResponse, EtcdRecover, EtcdRecoverResponse, EtcdRemoveMemberById,
    EtcdRemoveMemberByIdRequest, EtcdRemoveMemberByIdResponse, EtcdSnapshotRequest,
    EtcdStatusResponse, FeaturesInfo, GenerateClientConfigurationRequest,
    GenerateClientConfigurationResponse, Hostname, HostnameResponse, LogsRequest, PlatformInfo,
    Reboot, RebootRequest, RebootResponse, ServiceHealth, ServiceInfo, ServiceList,
    ServiceListResponse, ServiceRestart, ServiceRestartRequest, ServiceRestartResponse,
    ServiceStart, ServiceStartRequest, ServiceStartResponse, ServiceStop, ServiceStopRequest,
    ServiceStopResponse, Shutdown, ShutdownRequest, ShutdownResponse, Version, VersionInfo,
    VersionResponse,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The version apid reports.
pub const TAG: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// The MachineService.
#[derive(Clone, Debug)]
pub struct Machine {
    init: InitClient<Channel>,
    client: cosi::Client,
    generator: std::sync::Arc<crate::client_config::Generator>,
    pool: crate::share::Pool,
}

impl Machine {
    /// The service over init's control socket and stated; what callers hold is shared among
    /// them from `pool`.
    pub fn new(init: Channel, client: cosi::Client, pool: crate::share::Pool) -> Self {
        Self {
            init: InitClient::new(init),
            generator: std::sync::Arc::new(crate::client_config::Generator::new(client.clone())),
            client,
            pool,
        }
    }

    /// The caller's share of the etcd operations in progress.
    fn etcd_share<T>(&self, req: &Request<T>) -> Result<crate::share::Share, Status> {
        self.pool.etcd.take(&*crate::auth::who(req)?)
    }

    /// The caller's share of the followed logs, when `follow` (a log read to its end holds
    /// nothing for long).
    fn follow_share<T>(
        &self,
        req: &Request<T>,
        follow: bool,
    ) -> Result<Option<crate::share::Share>, Status> {
        if !follow {
            return Ok(None);
        }
        self.pool.follows.take(&*crate::auth::who(req)?).map(Some)
    }
}

/// init's refusal or absence, as the caller should see it.
pub(crate) fn from_init(s: Status) -> Status {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown => Status::unavailable(format!(
            "init's control socket is not answering apid: {}",
            s.message()
        )),
        _ => s,
    }
}

/// Go's name of the architecture (`GOARCH`), as upstream reports it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Upstream's service state names: `Running`, `Waiting`, `Finished`...
fn state_name(state: &str) -> String {
    let mut c = state.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => "Unknown".into(),
    }
}

fn service_info(s: proto::init::Service) -> ServiceInfo {
    let state = state_name(&s.state);
    ServiceInfo {
        id: s.id,
        state,
        events: None,
        health: Some(ServiceHealth {
            unknown: !s.ready && s.state != "running",
            healthy: s.healthy,
            last_message: s.message,
            last_change: None,
        }),
    }
}

type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl MachineService for Machine {
    async fn version(&self, _: Request<()>) -> Result<Response<VersionResponse>, Status> {
        // The platform is what init says it runs as; while stated is down it is not known.
        // Version must answer at once whatever stated does: a second for the platform at most.
        let mode = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            self.client
                .get_typed::<MachineStatusSpec>(RUNTIME, MACHINE_STATUS_ID),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|m| m.spec.mode)
        .unwrap_or_default();
        let platform = match mode.as_str() {
            "vm" => "metal",
            "" => "unknown",
            other => other,
        };
        Ok(Response::new(VersionResponse {
            messages: vec![Version {
                metadata: None,
                version: Some(VersionInfo {
                    tag: TAG.into(),
                    sha: option_env!("TALOS_RS_SHA").unwrap_or("").into(),
                    built: String::new(),
                    go_version: String::new(),
                    os: std::env::consts::OS.into(),
                    arch: arch().into(),
                }),
                platform: Some(PlatformInfo {
                    name: platform.into(),
                    mode: platform.into(),
                }),
                features: Some(FeaturesInfo { rbac: true }),
            }],
        }))
    }

    /// Handed to init, the node's config writer: apid never reads the full configuration, so
    /// init keeps the secrets a client sends back redacted and diffs the redacted forms.
    async fn apply_configuration(
        &self,
        req: Request<ApplyConfigurationRequest>,
    ) -> Result<Response<ApplyConfigurationResponse>, Status> {
        let maintenance = req.extensions().get::<crate::auth::Maintenance>().is_some();
        let r = req.into_inner();
        let is_try = r.mode == proto::machine::apply_configuration_request::Mode::Try as i32;
        let try_timeout_ms = match r.try_mode_timeout {
            None => 0,
            Some(_) if !is_try => 0,
            Some(d) if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) => {
                return Err(Status::invalid_argument(
                    "try_mode_timeout should be positive",
                ))
            }
            Some(d) => u64::try_from(d.seconds)
                .unwrap_or(u64::MAX)
                .saturating_mul(1000)
                .saturating_add(u64::try_from(d.nanos / 1_000_000).unwrap_or(0))
                .max(1),
        };
        let reply = self
            .init
            .clone()
            .apply_configuration(ApplyRequest {
                data: r.data,
                mode: r.mode,
                dry_run: r.dry_run,
                try_timeout_ms,
                maintenance,
                expected_version: r.expected_version,
            })
            .await
            .map_err(from_init)?
            .into_inner();
        Ok(Response::new(ApplyConfigurationResponse {
            messages: vec![ApplyConfiguration {
                metadata: None,
                warnings: reply.warnings,
                mode: reply.mode,
                mode_details: reply.mode_details,
            }],
        }))
    }

    /// Bootstraps etcd on this node: k8sd decides ([`crate::bootstrap`]).
    async fn bootstrap(
        &self,
        req: Request<BootstrapRequest>,
    ) -> Result<Response<BootstrapResponse>, Status> {
        crate::bootstrap::bootstrap(&self.client, req.into_inner()).await?;
        Ok(Response::new(BootstrapResponse {
            messages: vec![Bootstrap { metadata: None }],
        }))
    }

    /// etcd's members as k8sd last listed them ([`crate::etcd`]).
    async fn etcd_member_list(
        &self,
        _: Request<EtcdMemberListRequest>,
    ) -> Result<Response<EtcdMemberListResponse>, Status> {
        Ok(Response::new(EtcdMemberListResponse {
            messages: vec![crate::etcd::members(&self.client).await?],
        }))
    }

    /// Removes another member (by ID) from the etcd cluster; k8sd runs it.
    async fn etcd_remove_member_by_id(
        &self,
        req: Request<EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<EtcdRemoveMemberByIdResponse>, Status> {
        let share = self.etcd_share(&req)?;
        let id = req.into_inner().member_id;
        crate::etcd::operation(&self.client, share, "remove-member", id).await?;
        Ok(Response::new(EtcdRemoveMemberByIdResponse {
            messages: vec![EtcdRemoveMemberById { metadata: None }],
        }))
    }

    /// This node leaves the etcd cluster: its member removed, etcd stopped, its data removed.
    async fn etcd_leave_cluster(
        &self,
        req: Request<EtcdLeaveClusterRequest>,
    ) -> Result<Response<EtcdLeaveClusterResponse>, Status> {
        crate::etcd::operation(&self.client, self.etcd_share(&req)?, "leave", 0).await?;
        Ok(Response::new(EtcdLeaveClusterResponse {
            messages: vec![EtcdLeaveCluster { metadata: None }],
        }))
    }

    /// Moves the leadership away from this member when it leads; names the new leader.
    async fn etcd_forfeit_leadership(
        &self,
        req: Request<EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<EtcdForfeitLeadershipResponse>, Status> {
        let a = crate::etcd::operation(
            &self.client,
            self.etcd_share(&req)?,
            "forfeit-leadership",
            0,
        )
        .await?;
        Ok(Response::new(EtcdForfeitLeadershipResponse {
            messages: vec![EtcdForfeitLeadership {
                metadata: None,
                member: a.member,
            }],
        }))
    }

    /// The alarms the local member knows.
    async fn etcd_alarm_list(
        &self,
        req: Request<()>,
    ) -> Result<Response<EtcdAlarmListResponse>, Status> {
        let a =
            crate::etcd::operation(&self.client, self.etcd_share(&req)?, "alarm-list", 0).await?;
        Ok(Response::new(EtcdAlarmListResponse {
            messages: vec![EtcdAlarm {
                metadata: None,
                member_alarms: crate::etcd::alarms(&a),
            }],
        }))
    }

    /// Disarms every raised alarm; lists those disarmed.
    async fn etcd_alarm_disarm(
        &self,
        req: Request<()>,
    ) -> Result<Response<EtcdAlarmDisarmResponse>, Status> {
        let a =
            crate::etcd::operation(&self.client, self.etcd_share(&req)?, "alarm-disarm", 0).await?;
        Ok(Response::new(EtcdAlarmDisarmResponse {
            messages: vec![EtcdAlarmDisarm {
                metadata: None,
                member_alarms: crate::etcd::alarms(&a),
            }],
        }))
    }

    /// Defragments the local member's database.
    async fn etcd_defragment(
        &self,
        req: Request<()>,
    ) -> Result<Response<EtcdDefragmentResponse>, Status> {
        crate::etcd::operation(&self.client, self.etcd_share(&req)?, "defragment", 0).await?;
        Ok(Response::new(EtcdDefragmentResponse {
            messages: vec![EtcdDefragment { metadata: None }],
        }))
    }

    /// The local etcd member's status as k8sd last read it ([`crate::etcd`]).
    async fn etcd_status(&self, _: Request<()>) -> Result<Response<EtcdStatusResponse>, Status> {
        Ok(Response::new(EtcdStatusResponse {
            messages: vec![crate::etcd::member_status(&self.client).await?],
        }))
    }

    /// A talosconfig with a new client certificate (admin only, control planes only); the
    /// certificate is signed by secretsd ([`crate::client_config`]).
    async fn generate_client_configuration(
        &self,
        req: Request<GenerateClientConfigurationRequest>,
    ) -> Result<Response<GenerateClientConfigurationResponse>, Status> {
        let message = self.generator.generate(req.into_inner()).await?;
        Ok(Response::new(GenerateClientConfigurationResponse {
            messages: vec![message],
        }))
    }

    async fn hostname(&self, _: Request<()>) -> Result<Response<HostnameResponse>, Status> {
        let hostname = match self
            .client
            .get_typed::<HostnameStatusSpec>(NETWORK, HOSTNAME_ID)
            .await
        {
            Ok(h) => h.spec.hostname,
            Err(e) if e.is_not_found() => {
                return Err(Status::not_found("the node has no hostname yet"))
            }
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "stated is not answering apid: {e}"
                )))
            }
        };
        Ok(Response::new(HostnameResponse {
            messages: vec![Hostname {
                metadata: None,
                hostname,
            }],
        }))
    }

    async fn service_list(&self, _: Request<()>) -> Result<Response<ServiceListResponse>, Status> {
        let list = self
            .init
            .clone()
            .list(proto::init::ListRequest {})
            .await
            .map_err(from_init)?
            .into_inner();
        Ok(Response::new(ServiceListResponse {
            messages: vec![ServiceList {
                metadata: None,
                services: list.services.into_iter().map(service_info).collect(),
            }],
        }))
    }

    async fn service_start(
        &self,
        req: Request<ServiceStartRequest>,
    ) -> Result<Response<ServiceStartResponse>, Status> {
        let id = req.into_inner().id;
        self.init
            .clone()
            .start(ServiceRequest { id: id.clone() })
            .await
            .map_err(from_init)?;
        Ok(Response::new(ServiceStartResponse {
            messages: vec![ServiceStart {
                metadata: None,
                resp: format!("Service {id:?} started"),
            }],
        }))
    }

    async fn service_stop(
        &self,
        req: Request<ServiceStopRequest>,
    ) -> Result<Response<ServiceStopResponse>, Status> {
        let id = req.into_inner().id;
        self.init
            .clone()
            .stop(ServiceRequest { id: id.clone() })
            .await
            .map_err(from_init)?;
        Ok(Response::new(ServiceStopResponse {
            messages: vec![ServiceStop {
                metadata: None,
                resp: format!("Service {id:?} stopped"),
            }],
        }))
    }

    async fn service_restart(
        &self,
        req: Request<ServiceRestartRequest>,
    ) -> Result<Response<ServiceRestartResponse>, Status> {
        let id = req.into_inner().id;
        self.init
            .clone()
            .restart(ServiceRequest { id: id.clone() })
            .await
            .map_err(from_init)?;
        Ok(Response::new(ServiceRestartResponse {
            messages: vec![ServiceRestart {
                metadata: None,
                resp: format!("Service {id:?} restarted"),
            }],
        }))
    }

    type LogsStream = Streamed<Data>;

    /// A daemon's or service's output, one `Data` per line (with its newline). Container logs
    /// (`k8s.io`, the CRI driver) do not exist on a talos-rs node yet.
    async fn logs(&self, req: Request<LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        let share = self.follow_share(&req, req.get_ref().follow)?;
        let r = req.into_inner();
        if r.driver == proto::common::ContainerDriver::Cri as i32 || r.namespace == "k8s.io" {
            return Err(Status::unimplemented(
                "container logs: there is no container runtime on this node yet",
            ));
        }
        let stream = self
            .init
            .clone()
            .logs(InitLogs {
                id: r.id,
                tail: r.tail_lines,
                follow: r.follow,
            })
            .await
            .map_err(from_init)?
            .into_inner();
        let stream = stream.map(|line| {
            line.map(|l| {
                let mut bytes = l.line;
                bytes.push(b'\n');
                Data {
                    metadata: None,
                    bytes,
                }
            })
            .map_err(from_init)
        });
        Ok(Response::new(crate::share::stall_bounded(
            Box::pin(stream),
            share,
            crate::share::STALL,
        )))
    }

    /// The node's mounted filesystems, measured by init (root, the node's mount namespace).
    async fn mounts(
        &self,
        _: Request<()>,
    ) -> Result<Response<proto::machine::MountsResponse>, Status> {
        let stats = self
            .init
            .clone()
            .mounts(proto::init::MountsRequest {})
            .await
            .map_err(from_init)?
            .into_inner()
            .stats
            .into_iter()
            .map(|s| proto::machine::MountStat {
                filesystem: s.filesystem,
                size: s.size,
                available: s.available,
                mounted_on: s.mounted_on,
            })
            .collect();
        Ok(Response::new(proto::machine::MountsResponse {
            messages: vec![proto::machine::Mounts {
                metadata: None,
                stats,
            }],
        }))
    }

    type DmesgStream = Streamed<Data>;

    type KubeconfigStream = Streamed<Data>;

    type EtcdSnapshotStream = Streamed<Data>;

    /// A snapshot uploaded for `Bootstrap{recover_etcd}`: passed to k8sd through stated
    /// ([`crate::etcd::recover`]).
    async fn etcd_recover(
        &self,
        req: Request<tonic::Streaming<Data>>,
    ) -> Result<Response<EtcdRecoverResponse>, Status> {
        let share = self.etcd_share(&req)?;
        crate::etcd::recover(&self.client, share, req.into_inner()).await?;
        Ok(Response::new(EtcdRecoverResponse {
            messages: vec![EtcdRecover { metadata: None }],
        }))
    }

    /// The local etcd member's snapshot, streamed by k8sd through stated ([`crate::etcd`]).
    async fn etcd_snapshot(
        &self,
        req: Request<EtcdSnapshotRequest>,
    ) -> Result<Response<Self::EtcdSnapshotStream>, Status> {
        // The share is held by the stream: a client that stops reading loses it after
        // `STALL` (k8sd's snapshot then ends: apid acknowledges no more chunks).
        let share = self.etcd_share(&req)?;
        let stream = crate::etcd::snapshot(&self.client, share).await?;
        Ok(Response::new(crate::share::stall_bounded(
            stream,
            (),
            crate::share::STALL,
        )))
    }

    /// An admin kubeconfig (tar.gz of one file `kubeconfig`), its certificate signed by
    /// secretsd with the Kubernetes CA ([`crate::kubeconfig`]).
    async fn kubeconfig(&self, _: Request<()>) -> Result<Response<Self::KubeconfigStream>, Status> {
        let bytes = self.generator.kubeconfig().await?;
        let chunk = Data {
            metadata: None,
            bytes,
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(chunk)]))))
    }

    /// The node's kernel log, read by init (root): one `Data` per record as upstream's; a
    /// record that could not be read is a `Data` with `metadata.error`, as upstream's.
    async fn dmesg(
        &self,
        req: Request<DmesgRequest>,
    ) -> Result<Response<Self::DmesgStream>, Status> {
        let share = self.follow_share(&req, req.get_ref().follow)?;
        let r = req.into_inner();
        let stream = self
            .init
            .clone()
            .dmesg(InitDmesg {
                follow: r.follow,
                tail: r.tail,
            })
            .await
            .map_err(from_init)?
            .into_inner();
        let stream = stream.map(|record| {
            record
                .map(|r| {
                    if r.error.is_empty() {
                        Data {
                            metadata: None,
                            bytes: r.line,
                        }
                    } else {
                        Data {
                            metadata: Some(proto::common::Metadata {
                                error: r.error,
                                ..Default::default()
                            }),
                            bytes: Vec::new(),
                        }
                    }
                })
                .map_err(from_init)
        });
        Ok(Response::new(crate::share::stall_bounded(
            Box::pin(stream),
            share,
            crate::share::STALL,
        )))
    }

    async fn reboot(&self, _: Request<RebootRequest>) -> Result<Response<RebootResponse>, Status> {
        self.init
            .clone()
            .reboot(PowerRequest {})
            .await
            .map_err(from_init)?;
        Ok(Response::new(RebootResponse {
            messages: vec![Reboot {
                metadata: None,
                actor_id: String::new(),
            }],
        }))
    }

    async fn shutdown(
        &self,
        _: Request<ShutdownRequest>,
    ) -> Result<Response<ShutdownResponse>, Status> {
        self.init
            .clone()
            .shutdown(PowerRequest {})
            .await
            .map_err(from_init)?;
        Ok(Response::new(ShutdownResponse {
            messages: vec![Shutdown {
                metadata: None,
                actor_id: String::new(),
            }],
        }))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn states_are_named_as_upstream() {
        assert_eq!(super::state_name("running"), "Running");
        assert_eq!(super::state_name(""), "Unknown");
    }
}
