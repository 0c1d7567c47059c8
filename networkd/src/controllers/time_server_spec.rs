//! `network.TimeServerSpecController`: the merged TimeServerSpec becomes the
//! TimeServerStatus (what the time subsystem syncs with).

use cosi::generic::{Transform, TransformController};
use cosi::runtime::ReconcileError;
use cosi::Resource;
use machinery::resources::network::{
    TimeServerSpecSpec, TimeServerStatusSpec, NAMESPACE, TIME_SERVER_ID,
};

/// TimeServerSpec `timeservers` → TimeServerStatus `timeservers`.
#[derive(Debug, Default)]
pub struct TimeServerSpec;

/// `network.TimeServerSpecController`.
pub type TimeServerSpecController = TransformController<TimeServerSpec>;

impl Transform for TimeServerSpec {
    type Input = TimeServerSpecSpec;
    type Output = TimeServerStatusSpec;

    fn name(&self) -> &'static str {
        "network.TimeServerSpecController"
    }

    fn input_namespace(&self) -> &str {
        NAMESPACE
    }

    fn output_namespace(&self) -> &str {
        NAMESPACE
    }

    fn map_id(&self, input: &Resource<TimeServerSpecSpec>) -> Option<String> {
        (input.id() == TIME_SERVER_ID).then(|| TIME_SERVER_ID.to_string())
    }

    fn transform(
        &self,
        input: &Resource<TimeServerSpecSpec>,
    ) -> Result<TimeServerStatusSpec, ReconcileError> {
        Ok(TimeServerStatusSpec {
            ntp_servers: input.spec.ntp_servers.clone(),
            use_nts: input.spec.use_nts,
        })
    }
}
