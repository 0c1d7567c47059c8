//! `talosrs.audit.AuditService` (ours, not upstream's): the audit of every daemon's observed
//! sandbox, which init reads from `/proc` when asked over its control socket. The reply has
//! upstream's shape (one message with `common.Metadata`), so apid fans it out to nodes as it
//! does the machine service.

use proto::init::init_client::InitClient;
use proto::init::AuditRequest as InitAudit;
use proto::talosrs::audit::audit_service_server::AuditService;
use proto::talosrs::audit::{Audit, AuditRequest, AuditResponse, DaemonAudit};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The audit service, asking init.
#[derive(Clone, Debug)]
pub struct Auditor {
    init: InitClient<Channel>,
}

impl Auditor {
    /// An auditor asking the init at the other end of `init` (its control socket).
    pub fn new(init: Channel) -> Self {
        Self {
            init: InitClient::new(init),
        }
    }
}

#[tonic::async_trait]
impl AuditService for Auditor {
    async fn audit(&self, _: Request<AuditRequest>) -> Result<Response<AuditResponse>, Status> {
        let reply = self
            .init
            .clone()
            .audit(InitAudit {})
            .await
            .map_err(crate::machine::from_init)?
            .into_inner();
        Ok(Response::new(AuditResponse {
            messages: vec![Audit {
                metadata: None,
                daemons: reply
                    .daemons
                    .into_iter()
                    .map(|d| DaemonAudit {
                        name: d.name,
                        security_json: d.security_json,
                        error: d.error,
                    })
                    .collect(),
            }],
        }))
    }
}
