//! SessionService call for token usage.

use agentloop_proto::v1 as pb;

use super::SessionApi;
use crate::MemoryError;

/// `GetUsage`
pub(super) async fn get(
    api: &SessionApi,
    req: pb::GetUsageRequest,
) -> Result<pb::GetUsageResponse, MemoryError> {
    let limit = if req.limit == 0 {
        100
    } else {
        req.limit.min(1000)
    };
    let rows = api
        .store()?
        .usage(&super::gateway::caller(req.caller), &req.agent_id, limit)
        .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(pb::GetUsageResponse {
        rows: rows
            .into_iter()
            .map(|r| pb::UsageRow {
                session_key: r.session_key,
                agent_id: r.agent_id,
                model: r.model,
                input_tokens: count(r.input_tokens),
                output_tokens: count(r.output_tokens),
                runs: count(r.runs),
            })
            .collect(),
    })
}
