//! `memory.list` and `memory.forget`: a user sees and deletes what the assistant remembers about
//! them. Only the caller's own principal is ever named to memory, so no parameter can reach
//! another user's memories (admins use `agentloop memory` for those).

use serde::Deserialize;
use serde_json::{Value, json};

use agentloop_proto::v1::{ForgetMemoriesRequest, ListMemoriesRequest, MemoryScope};

use crate::RequestError;
use crate::params::{no_nul, parse};
use crate::principal::Principal;
use crate::state::AppState;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemoryParams {
    #[serde(default, alias = "agent_id")]
    agent_id: Option<String>,
    /// Memories shared by all agents rather than one agent's.
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    query: Option<String>,
}

/// The caller's own memories under the agent the params name.
fn scope(who: &Principal, params: &MemoryParams) -> Result<MemoryScope, RequestError> {
    let principal = who.caller().principal;
    if principal.is_empty() {
        return Err(RequestError::InvalidRequest(
            "memories belong to a principal: use a token that names one".into(),
        ));
    }
    let agent_id = params.agent_id.clone().unwrap_or_else(|| "main".to_owned());
    no_nul("agentId", &agent_id)?;
    Ok(MemoryScope {
        agent_id,
        principal,
        shared_across_agents: params.shared,
        ..Default::default()
    })
}

fn record(m: agentloop_proto::v1::MemoryRecord) -> Value {
    json!({"id": m.id, "text": m.text, "source": m.source, "agentId": m.agent_id,
           "updatedAt": m.updated_at.as_ref().map(crate::status::timestamp_ms)})
}

/// `memory.list {agentId?, shared?, limit?}`
pub(crate) async fn memory_list(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let params: MemoryParams = parse("memory.list", params)?;
    let scope = scope(who, &params)?;
    let listed = state
        .sessions
        .clone()
        .list_memories(ListMemoriesRequest {
            scope: Some(scope),
            limit: params.limit.unwrap_or(100).clamp(1, 1000),
        })
        .await?
        .into_inner();
    let memories: Vec<Value> = listed.memories.into_iter().map(record).collect();
    Ok(json!({"memories": memories}))
}

/// `memory.forget {id | query, agentId?, shared?}`
pub(crate) async fn memory_forget(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let params: MemoryParams = parse("memory.forget", params)?;
    let scope = scope(who, &params)?;
    let id = params.id.clone().unwrap_or_default();
    let query = params.query.clone().unwrap_or_default();
    if id.trim().is_empty() == query.trim().is_empty() {
        return Err(RequestError::InvalidRequest(
            "memory.forget needs either id or query".into(),
        ));
    }
    no_nul("query", &query)?;
    if !id.is_empty() && uuid::Uuid::parse_str(&id).is_err() {
        return Err(RequestError::InvalidRequest(format!(
            "id {id:?} is not a memory id"
        )));
    }
    let forgotten = state
        .sessions
        .clone()
        .forget_memories(ForgetMemoriesRequest {
            scope: Some(scope),
            id,
            query,
            min_score: 0.0,
        })
        .await?
        .into_inner();
    Ok(json!({"forgotten": forgotten.ids}))
}
