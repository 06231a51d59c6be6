//! SessionService calls on a session and its transcript: resolve, read history, append.

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{
    MAX_HISTORY_READ, bounded_limit, entry_message, new_entries, parse_id, require, timestamp,
};
use crate::MemoryError;
use crate::store::Session;

impl SessionApi {
    /// `ResolveSession`: the session of a key, created on first sight.
    pub(super) async fn resolve_session(
        &self,
        req: pb::ResolveSessionRequest,
    ) -> Result<pb::Session, MemoryError> {
        require("session_key", &req.session_key)?;
        let session = self
            .resolve(&req.session_key, &req.agent_id, &req.channel)
            .await?;
        Ok(pb::Session {
            id: session.id.to_string(),
            key: session.key,
            agent_id: session.agent_id,
            channel: session.channel.unwrap_or_default(),
            model_override: session.model_override.unwrap_or_default(),
            queue_mode: session.queue_mode.unwrap_or_default(),
            created_at: Some(timestamp(session.created_at)),
            created: session.created,
        })
    }

    /// The session of `key`, created on first sight; an empty agent is `main`, an empty
    /// channel none.
    async fn resolve(
        &self,
        key: &str,
        agent_id: &str,
        channel: &str,
    ) -> Result<Session, MemoryError> {
        let agent_id = if agent_id.is_empty() {
            "main"
        } else {
            agent_id
        };
        let channel = (!channel.is_empty()).then_some(channel);
        self.store()?.resolve_session(key, agent_id, channel).await
    }

    /// `GetHistory`: the newest transcript entries, as many as asked (0: the configured limit),
    /// at most [`MAX_HISTORY_READ`] (or the configured limit, when higher).
    pub(super) async fn get_history(
        &self,
        req: pb::GetHistoryRequest,
    ) -> Result<pb::GetHistoryResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let limit = bounded_limit(
            req.limit,
            self.history_limit,
            MAX_HISTORY_READ.max(self.history_cap()),
        );
        let entries = self.store()?.get_history(session_id, limit).await?;
        let entries = entries.into_iter().map(entry_message).collect();
        Ok(pb::GetHistoryResponse { entries })
    }

    /// `AppendEntries`: fenced transcript appends.
    pub(super) async fn append_entries(
        &self,
        req: pb::AppendEntriesRequest,
    ) -> Result<pb::AppendEntriesResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let entries = new_entries(req.entries)?;
        let appended = self
            .store()?
            .append_entries(session_id, req.epoch, &entries)
            .await?;
        Ok(pb::AppendEntriesResponse { appended })
    }
}
