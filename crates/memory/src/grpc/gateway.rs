//! SessionService calls the gateway makes: session management and dispatch records.

use std::time::Duration;

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{parse_id, require, timestamp};
use crate::MemoryError;
use crate::store::{Caller, Dispatch, DispatchLookup, SessionInfo, SessionPatch};

/// `ListSessions` returns at most this many sessions when the request says 0.
const DEFAULT_LIST_LIMIT: u32 = 100;
/// A dispatch record lives a day when the request names no TTL.
const DEFAULT_DISPATCH_TTL: Duration = Duration::from_secs(24 * 3600);

/// Thinking levels a session may be set to.
const THINKING_LEVELS: [&str; 6] = ["off", "minimal", "low", "medium", "high", "xhigh"];

impl SessionApi {
    /// `ListSessions`: the sessions the caller sees, filtered by agent and key when set.
    pub(super) async fn list_sessions_rpc(
        &self,
        req: pb::ListSessionsRequest,
    ) -> Result<pb::ListSessionsResponse, MemoryError> {
        let limit = match req.limit {
            0 => DEFAULT_LIST_LIMIT,
            n => n.min(1000),
        };
        let agent = (!req.agent_id.is_empty()).then_some(req.agent_id.as_str());
        let key = (!req.session_key.is_empty()).then_some(req.session_key.as_str());
        let sessions = self
            .store()?
            .list_sessions(limit, agent, key, &caller(req.caller))
            .await?;
        Ok(pb::ListSessionsResponse {
            sessions: sessions.into_iter().map(session_info).collect(),
        })
    }

    /// `ResetSession`: clears a session's transcript.
    pub(super) async fn reset_session_rpc(
        &self,
        req: pb::ResetSessionRequest,
    ) -> Result<pb::SessionInfo, MemoryError> {
        require("session_key", &req.session_key)?;
        let session = self
            .store()?
            .reset_session(&req.session_key, &caller(req.caller))
            .await?;
        Ok(session_info(session))
    }

    /// `PatchSession`: changes a session's settings, checked against their vocabularies.
    pub(super) async fn patch_session_rpc(
        &self,
        req: pb::PatchSessionRequest,
    ) -> Result<pb::SessionInfo, MemoryError> {
        require("session_key", &req.session_key)?;
        if let Some(mode) = req.queue_mode.as_deref().filter(|m| !m.is_empty()) {
            agentloop_proto::QueueMode::parse(mode)
                .map_err(|err| MemoryError::InvalidArgument(err.to_string()))?;
        }
        if let Some(level) = req.thinking_level.as_deref().filter(|l| !l.is_empty())
            && !THINKING_LEVELS.contains(&level)
        {
            return Err(MemoryError::InvalidArgument(format!(
                "thinking_level {level:?} is not one of {}",
                THINKING_LEVELS.join(", ")
            )));
        }
        let patch = SessionPatch {
            model_override: req.model_override,
            queue_mode: req.queue_mode,
            thinking_level: req.thinking_level,
        };
        let session = self
            .store()?
            .patch_session(&req.session_key, &patch, &caller(req.caller))
            .await?;
        Ok(session_info(session))
    }

    /// `BeginDispatch`: records a client request, or answers the live record of its keys.
    pub(super) async fn begin_dispatch_rpc(
        &self,
        req: pb::BeginDispatchRequest,
    ) -> Result<pb::Dispatch, MemoryError> {
        require("session_key", &req.session_key)?;
        require("idempotency_key", &req.idempotency_key)?;
        let run_handle = parse_id("run_handle", &req.run_handle)?;
        let session_id = if req.session_id.is_empty() {
            let agent_id = if req.agent_id.is_empty() {
                "main"
            } else {
                req.agent_id.as_str()
            };
            let channel = (!req.channel.is_empty()).then_some(req.channel.as_str());
            self.store()?
                .resolve_owned_session(&req.session_key, agent_id, channel, &caller(req.caller))
                .await?
                .id
        } else {
            parse_id("session_id", &req.session_id)?
        };
        let ttl = match req.ttl_ms {
            0 => DEFAULT_DISPATCH_TTL,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let (created, record) = self
            .store()?
            .begin_dispatch(
                &req.session_key,
                &req.idempotency_key,
                run_handle,
                session_id,
                ttl,
            )
            .await?;
        let mut message = dispatch_message(record);
        message.created = created;
        Ok(message)
    }

    /// `GetDispatch`: a live dispatch record with its run, by run or by keys.
    pub(super) async fn get_dispatch_rpc(
        &self,
        req: pb::GetDispatchRequest,
    ) -> Result<pb::Dispatch, MemoryError> {
        let lookup = if req.run_id.is_empty() {
            require("session_key", &req.session_key)?;
            require("idempotency_key", &req.idempotency_key)?;
            DispatchLookup::Keys {
                session_key: req.session_key,
                idempotency_key: req.idempotency_key,
            }
        } else {
            DispatchLookup::Run(parse_id("run_id", &req.run_id)?)
        };
        // "No record" is an answer, not a failure: the message has an empty run handle.
        let record = self
            .store()?
            .get_dispatch(&lookup, &caller(req.caller))
            .await?;
        Ok(record.map(dispatch_message).unwrap_or_default())
    }

    /// `CompleteDispatch`: stores a dispatch's first answer.
    pub(super) async fn complete_dispatch_rpc(
        &self,
        req: pb::CompleteDispatchRequest,
    ) -> Result<pb::Dispatch, MemoryError> {
        let run_handle = parse_id("run_handle", &req.run_handle)?;
        if req.status != "ok" && req.status != "error" {
            return Err(MemoryError::InvalidArgument(format!(
                "status {:?} is not ok or error",
                req.status
            )));
        }
        let error = (!req.error.is_empty()).then_some(req.error.as_str());
        let record = self
            .store()?
            .complete_dispatch(run_handle, &req.status, &req.text, error)
            .await?;
        Ok(dispatch_message(record))
    }
}

/// The caller a request names; none is a caller without principal that is no admin.
pub(super) fn caller(caller: Option<pb::Caller>) -> Caller {
    let caller = caller.unwrap_or_default();
    Caller {
        principal: (!caller.principal.is_empty()).then_some(caller.principal),
        admin: caller.admin,
    }
}

fn session_info(session: SessionInfo) -> pb::SessionInfo {
    pb::SessionInfo {
        id: session.id.to_string(),
        key: session.key,
        agent_id: session.agent_id,
        channel: session.channel.unwrap_or_default(),
        model_override: session.model_override.unwrap_or_default(),
        queue_mode: session.queue_mode.unwrap_or_default(),
        thinking_level: session.thinking_level.unwrap_or_default(),
        input_tokens: u64::try_from(session.input_tokens).unwrap_or(0),
        output_tokens: u64::try_from(session.output_tokens).unwrap_or(0),
        created_at: Some(timestamp(session.created_at)),
        updated_at: Some(timestamp(session.updated_at)),
        cleared_entries: u64::try_from(session.cleared_entries).unwrap_or(0),
        owner: session.owner.unwrap_or_default(),
    }
}

fn dispatch_message(record: Dispatch) -> pb::Dispatch {
    pb::Dispatch {
        session_key: record.session_key,
        idempotency_key: record.idempotency_key,
        run_handle: record.run_handle.to_string(),
        session_id: record.session_id.to_string(),
        status: record.status,
        text: record.text.unwrap_or_default(),
        error: record.error.unwrap_or_default(),
        run_id: record.run_id.map(|id| id.to_string()).unwrap_or_default(),
        run_status: record.run_status.unwrap_or_default(),
        run_error: record.run_error.unwrap_or_default(),
        run_answer: record.run_answer.unwrap_or_default(),
        created_at: Some(timestamp(record.created_at)),
        expires_at: Some(timestamp(record.expires_at)),
        created: false,
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn a_dispatch_without_run_maps_to_empty_run_fields() {
        let now = chrono::Utc::now();
        let message = dispatch_message(Dispatch {
            session_key: "k".into(),
            idempotency_key: "i".into(),
            run_handle: Uuid::nil(),
            session_id: Uuid::nil(),
            status: "accepted".into(),
            text: None,
            error: None,
            created_at: now,
            expires_at: now,
            run_id: None,
            run_status: None,
            run_error: None,
            run_answer: None,
        });
        assert_eq!(message.run_id, "");
        assert_eq!(message.status, "accepted");
        assert!(!message.created);
    }
}
