//! SessionService calls for long-term memories and skills snapshots.

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{parse_id, timestamp};
use crate::MemoryError;
use crate::store::{Embedding, Memory, MemoryScope, SkillSnapshot};

/// The most memories one search or list returns.
const MAX_RESULTS: u32 = 100;

fn scope(scope: Option<pb::MemoryScope>) -> Result<MemoryScope, MemoryError> {
    let scope =
        scope.ok_or_else(|| MemoryError::InvalidArgument("scope is required".to_owned()))?;
    let session_id = match scope.session_id.as_str() {
        "" => None,
        id => Some(parse_id("scope session_id", id)?),
    };
    if session_id.is_none() && scope.principal.is_empty() && scope.user_key.is_empty() {
        return Err(MemoryError::InvalidArgument(
            "scope needs a session_id, a principal or a user_key".to_owned(),
        ));
    }
    Ok(MemoryScope {
        agent_id: if scope.shared_across_agents {
            String::new()
        } else {
            scope.agent_id
        },
        session_id,
        sender_id: scope.sender_id,
        channel: scope.channel,
        principal: scope.principal,
        user_key: scope.user_key,
    })
}

fn embedding(embedding: Option<pb::Embedding>) -> Result<Option<Embedding>, MemoryError> {
    embedding
        .map(|e| Embedding::new(&e.model, e.values))
        .transpose()
}

fn record(memory: Memory) -> pb::MemoryRecord {
    pb::MemoryRecord {
        id: memory.id.to_string(),
        agent_id: memory.agent_id,
        user_key: memory.user_key,
        text: memory.text,
        source: memory.source,
        created_at: Some(timestamp(memory.created_at)),
        updated_at: Some(timestamp(memory.updated_at)),
        score: memory.score,
    }
}

fn snapshot(session_id: String, snapshot: Option<SkillSnapshot>) -> pb::SkillSnapshot {
    match snapshot {
        Some(s) => pb::SkillSnapshot {
            session_id,
            version: u32::try_from(s.version).unwrap_or(0),
            digest: s.digest,
            skills_json: s.skills,
            created_at: Some(timestamp(s.created_at)),
        },
        None => pb::SkillSnapshot {
            session_id,
            ..Default::default()
        },
    }
}

/// `SaveMemory`
pub(super) async fn save(
    api: &SessionApi,
    req: pb::SaveMemoryRequest,
) -> Result<pb::MemoryRecord, MemoryError> {
    let source = match req.source.as_str() {
        "" => "tool",
        s @ ("tool" | "learned" | "operator") => s,
        other => {
            return Err(MemoryError::InvalidArgument(format!(
                "source {other:?} is not one of tool, learned, operator"
            )));
        }
    };
    let replace = match req.replace_id.as_str() {
        "" => None,
        id => Some(parse_id("replace_id", id)?),
    };
    let saved = api
        .store()?
        .save_or_replace_memory(
            &scope(req.scope)?,
            replace,
            &req.text,
            source,
            embedding(req.embedding)?.as_ref(),
        )
        .await?;
    Ok(record(saved))
}

/// `SearchMemories`
pub(super) async fn search(
    api: &SessionApi,
    req: pb::SearchMemoriesRequest,
) -> Result<pb::SearchMemoriesResponse, MemoryError> {
    let limit = if req.limit == 0 {
        5
    } else {
        req.limit.min(MAX_RESULTS)
    };
    let query_embedding = embedding(req.query_embedding)?;
    let (found, none_stored) = api
        .store()?
        .search_memories(
            &scope(req.scope)?,
            &req.query,
            query_embedding.as_ref(),
            limit,
            req.min_score,
        )
        .await?;
    Ok(pb::SearchMemoriesResponse {
        memories: found.into_iter().map(record).collect(),
        none_stored,
        hybrid: query_embedding.is_some(),
    })
}

/// `ListMemoriesToEmbed`
pub(super) async fn to_embed(
    api: &SessionApi,
    req: pb::ListMemoriesToEmbedRequest,
) -> Result<pb::ListMemoriesResponse, MemoryError> {
    if req.model.trim().is_empty() {
        return Err(MemoryError::InvalidArgument("model is required".to_owned()));
    }
    let after = match req.after_id.as_str() {
        "" => None,
        id => Some(parse_id("after_id", id)?),
    };
    let limit = if req.limit == 0 {
        100
    } else {
        req.limit.min(1000)
    };
    let found = api
        .store()?
        .memories_to_embed(&req.model, after, limit)
        .await?;
    Ok(pb::ListMemoriesResponse {
        memories: found.into_iter().map(record).collect(),
        user_key: String::new(),
    })
}

/// `SetMemoryEmbedding`
pub(super) async fn set_embedding(
    api: &SessionApi,
    req: pb::SetMemoryEmbeddingRequest,
) -> Result<pb::SetMemoryEmbeddingResponse, MemoryError> {
    let id = parse_id("id", &req.id)?;
    let embedding = embedding(req.embedding)?
        .ok_or_else(|| MemoryError::InvalidArgument("embedding is required".to_owned()))?;
    let stored = api
        .store()?
        .set_memory_embedding(id, &req.text, &embedding)
        .await?;
    Ok(pb::SetMemoryEmbeddingResponse { stored })
}

/// `ForgetMemories`
pub(super) async fn forget(
    api: &SessionApi,
    req: pb::ForgetMemoriesRequest,
) -> Result<pb::ForgetMemoriesResponse, MemoryError> {
    let id = match req.id.as_str() {
        "" => None,
        id => Some(parse_id("id", id)?),
    };
    let ids = api
        .store()?
        .forget_memories(&scope(req.scope)?, id, &req.query, req.min_score)
        .await?;
    Ok(pb::ForgetMemoriesResponse {
        ids: ids.into_iter().map(|id| id.to_string()).collect(),
    })
}

/// `ListMemories`
pub(super) async fn list(
    api: &SessionApi,
    req: pb::ListMemoriesRequest,
) -> Result<pb::ListMemoriesResponse, MemoryError> {
    let limit = if req.limit == 0 {
        100
    } else {
        req.limit.min(1000)
    };
    let (user_key, memories) = api
        .store()?
        .list_memories(&scope(req.scope)?, limit)
        .await?;
    Ok(pb::ListMemoriesResponse {
        memories: memories.into_iter().map(record).collect(),
        user_key,
    })
}

/// `GetSkillSnapshot`
pub(super) async fn get_skills(
    api: &SessionApi,
    req: pb::GetSkillSnapshotRequest,
) -> Result<pb::SkillSnapshot, MemoryError> {
    let session_id = parse_id("session_id", &req.session_id)?;
    let current = api.store()?.skill_snapshot(session_id).await?;
    Ok(snapshot(req.session_id, current))
}

/// `SaveSkillSnapshot`
pub(super) async fn save_skills(
    api: &SessionApi,
    req: pb::SaveSkillSnapshotRequest,
) -> Result<pb::SkillSnapshot, MemoryError> {
    let session_id = parse_id("session_id", &req.session_id)?;
    let current = api
        .store()?
        .save_skill_snapshot(session_id, &req.digest, &req.skills_json)
        .await?;
    Ok(snapshot(req.session_id, Some(current)))
}
