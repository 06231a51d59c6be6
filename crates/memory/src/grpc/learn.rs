//! SessionService calls for learn jobs.

use std::time::Duration;

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{parse_id, require};
use crate::MemoryError;
use crate::store::LearnJob;

fn message(job: LearnJob) -> pb::LearnJob {
    let scope = job.scope();
    pb::LearnJob {
        id: job.id.to_string(),
        session_id: job.session_id.to_string(),
        run_id: job.run_id.to_string(),
        scope: Some(pb::MemoryScope {
            agent_id: job.agent_id,
            session_id: job.session_id.to_string(),
            sender_id: scope.sender_id,
            channel: scope.channel,
            shared_across_agents: job.shared,
            ..Default::default()
        }),
        exchange: job.exchange,
        attempts: u32::try_from(job.attempts).unwrap_or(0),
    }
}

/// `EnqueueLearnJob`
pub(super) async fn enqueue(
    api: &SessionApi,
    req: pb::LearnJob,
) -> Result<pb::EnqueueLearnJobResponse, MemoryError> {
    let scope = req
        .scope
        .ok_or_else(|| MemoryError::InvalidArgument("scope is required".to_owned()))?;
    require("exchange", &req.exchange)?;
    let job = LearnJob {
        id: uuid::Uuid::now_v7(),
        session_id: parse_id("session_id", &req.session_id)?,
        run_id: parse_id("run_id", &req.run_id)?,
        agent_id: scope.agent_id,
        shared: scope.shared_across_agents,
        sender_id: scope.sender_id,
        channel: scope.channel,
        exchange: req.exchange,
        attempts: 0,
    };
    let created = api.store()?.enqueue_learn_job(&job).await?;
    Ok(pb::EnqueueLearnJobResponse { created })
}

/// `ClaimLearnJob`
pub(super) async fn claim(
    api: &SessionApi,
    req: pb::ClaimLearnJobRequest,
) -> Result<pb::LearnJob, MemoryError> {
    require("owner", &req.owner)?;
    let ttl = Duration::from_millis(u64::from(req.ttl_ms.max(1)));
    let job = api.store()?.claim_learn_job(&req.owner, ttl).await?;
    Ok(job.map(message).unwrap_or_default())
}

/// `FinishLearnJob`
pub(super) async fn finish(
    api: &SessionApi,
    req: pb::FinishLearnJobRequest,
) -> Result<pb::FinishLearnJobResponse, MemoryError> {
    require("owner", &req.owner)?;
    let held = api
        .store()?
        .finish_learn_job(
            parse_id("id", &req.id)?,
            &req.owner,
            req.ok,
            &req.error,
            i32::try_from(req.max_attempts).unwrap_or(i32::MAX),
        )
        .await?;
    Ok(pb::FinishLearnJobResponse { held })
}
