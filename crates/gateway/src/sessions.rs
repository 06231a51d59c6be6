//! The session methods: `sessions.list`, `sessions.describe`, `sessions.reset`,
//! `sessions.patch`, `chat.abort`, and
//! the lookup of a session key that `chat.history` shares. Each names the caller to memory, which
//! answers a session of another principal as not found; none of them creates a session.

use serde::Deserialize;
use serde_json::{Value, json};

use agentloop_proto::v1::{
    ControlMessage, GetDispatchRequest, ListSessionsRequest, PatchSessionRequest,
    ResetSessionRequest, SessionInfo,
};

use crate::RequestError;
use crate::params::{no_nul, parse, present};
use crate::principal::Principal;
use crate::state::AppState;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionParams {
    #[serde(default, alias = "session_key", alias = "key")]
    session_key: String,
    #[serde(default, alias = "run_id")]
    run_id: Option<String>,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default, alias = "agent_id")]
    agent_id: Option<String>,
}

impl SessionParams {
    fn check(self) -> Result<Self, RequestError> {
        no_nul("runId", self.run_id.as_deref().unwrap_or_default())?;
        no_nul("agentId", self.agent_id.as_deref().unwrap_or_default())?;
        Ok(self)
    }
}

/// Checks a session key a client names.
fn check_key(key: &str) -> Result<(), RequestError> {
    if key.is_empty() {
        return Err(RequestError::InvalidRequest(
            "sessionKey is required".into(),
        ));
    }
    no_nul("sessionKey", key)
}

/// The answer for a session key that is missing or another principal's; the two are worded
/// alike, so a guess tells nothing about other principals' keys.
fn no_session(key: &str) -> RequestError {
    RequestError::NotFound(format!("no session {key:?}"))
}

/// Turns memory's not-found for `key` into [`no_session`].
fn keyed(key: &str) -> impl FnOnce(tonic::Status) -> RequestError + '_ {
    move |status| match RequestError::from(status) {
        RequestError::NotFound(_) => no_session(key),
        other => other,
    }
}

/// Returns the id of the session keyed `key` that `who` sees, creating nothing.
///
/// # Errors
/// [`RequestError::InvalidRequest`] for an empty key or one with a NUL,
/// [`RequestError::NotFound`] when `who` sees no such session, else memory's error.
pub(crate) async fn session_id(
    state: &AppState,
    who: &Principal,
    key: &str,
) -> Result<String, RequestError> {
    find(state, who, key)
        .await?
        .map(|s| s.id)
        .ok_or_else(|| no_session(key))
}

/// The session keyed `key` that `who` sees, if any.
async fn find(
    state: &AppState,
    who: &Principal,
    key: &str,
) -> Result<Option<SessionInfo>, RequestError> {
    check_key(key)?;
    let found = state
        .sessions
        .clone()
        .list_sessions(ListSessionsRequest {
            limit: 1,
            session_key: key.to_owned(),
            caller: Some(who.caller()),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(found.sessions.into_iter().next())
}

/// `chat.abort`: asks the session's owner to stop its live run.
pub(crate) async fn chat_abort(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("chat.abort", params)?.check()?;
    let session_id = match p.run_id.as_deref().filter(|r| !r.is_empty()) {
        Some(run_id) => {
            let record = state
                .sessions
                .clone()
                .get_dispatch(GetDispatchRequest {
                    run_id: run_id.to_owned(),
                    caller: Some(who.caller()),
                    ..Default::default()
                })
                .await?
                .into_inner();
            if record.run_handle.is_empty() {
                return Err(RequestError::NotFound(format!("no run {run_id}")));
            }
            record.session_id
        }
        None => session_id(state, who, &p.session_key).await?,
    };
    let bus = state.bus()?;
    let control = ControlMessage {
        session_id: session_id.clone(),
        action: agentloop_proto::ControlAction::Abort.as_str().into(),
        reason: "chat.abort".into(),
    };
    bus.publish_fast(
        bus.subjects().control(&session_id),
        &control,
        agentloop_proto::Encoding::Proto,
    )
    .await
    .map_err(|e| RequestError::Unavailable(agentloop_bus::error_chain(&e)))?;
    // OpenClaw's shape: `aborted` says the stop was handed to the session's owner, which ends
    // the live run if there is one (a session at rest has nothing to stop).
    let run_ids: Vec<&str> = p.run_id.as_deref().into_iter().collect();
    Ok(
        json!({"ok": true, "aborted": true, "runIds": run_ids, "status": "abort-requested",
              "sessionId": session_id, "runId": p.run_id}),
    )
}

fn session_json(s: SessionInfo) -> Value {
    let ms = |t: Option<pbjson_types::Timestamp>| {
        t.map(|t| t.seconds * 1000 + i64::from(t.nanos / 1_000_000))
    };
    json!({
        "key": s.key, "sessionId": s.id, "agentId": s.agent_id, "channel": s.channel, "kind": "direct",
        "model": s.model_override, "queueMode": s.queue_mode, "thinkingLevel": s.thinking_level,
        "inputTokens": s.input_tokens, "outputTokens": s.output_tokens,
        "createdAt": ms(s.created_at), "updatedAt": ms(s.updated_at),
    })
}

pub(crate) async fn sessions_list(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("sessions.list", params)?.check()?;
    let list = state
        .sessions
        .clone()
        .list_sessions(ListSessionsRequest {
            limit: p.limit.unwrap_or(0),
            agent_id: p.agent_id.unwrap_or_default(),
            caller: Some(who.caller()),
            ..Default::default()
        })
        .await?
        .into_inner();
    let sessions: Vec<Value> = list.sessions.into_iter().map(session_json).collect();
    Ok(json!({"sessions": sessions}))
}

/// `sessions.describe`: the session keyed `key` that `who` sees, or `null`.
pub(crate) async fn sessions_describe(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("sessions.describe", params)?.check()?;
    let session = find(state, who, &p.session_key).await?.map(session_json);
    Ok(json!({"session": session}))
}

pub(crate) async fn sessions_reset(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("sessions.reset", params)?.check()?;
    check_key(&p.session_key)?;
    let session = state
        .sessions
        .clone()
        .reset_session(ResetSessionRequest {
            session_key: p.session_key.clone(),
            caller: Some(who.caller()),
        })
        .await
        .map_err(keyed(&p.session_key))?
        .into_inner();
    let cleared = session.cleared_entries;
    let mut payload = session_json(session);
    payload["cleared"] = json!(cleared);
    Ok(payload)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PatchParams {
    #[serde(default, alias = "session_key", alias = "sessionKey")]
    key: String,
    #[serde(default, deserialize_with = "present")]
    model: Option<Option<String>>,
    #[serde(default, alias = "queue_mode", deserialize_with = "present")]
    queue_mode: Option<Option<String>>,
    #[serde(
        default,
        alias = "thinking_level",
        alias = "thinking",
        deserialize_with = "present"
    )]
    thinking_level: Option<Option<String>>,
}

pub(crate) async fn sessions_patch(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: PatchParams = parse("sessions.patch", params)?;
    let model = p.model.map(Option::unwrap_or_default);
    if let Some(model) = model.as_deref().filter(|m| !m.is_empty()) {
        state.check_model(who, model)?;
    }
    let thinking_level = p.thinking_level.map(Option::unwrap_or_default);
    // Thinking costs like a pricier model; going back to the default costs nothing.
    if thinking_level.as_deref().is_some_and(|l| !l.is_empty()) && !who.is_admin() {
        return Err(RequestError::Forbidden(
            "only an admin may set thinkingLevel".into(),
        ));
    }
    let queue_mode = p.queue_mode.map(Option::unwrap_or_default);
    if let Some(mode) = queue_mode.as_deref() {
        agentloop_proto::QueueMode::parse(mode)
            .map_err(|e| RequestError::InvalidRequest(e.to_string()))?;
    }
    check_key(&p.key)?;
    let session = state
        .sessions
        .clone()
        .patch_session(PatchSessionRequest {
            session_key: p.key.clone(),
            model_override: model,
            queue_mode,
            thinking_level,
            caller: Some(who.caller()),
        })
        .await
        .map_err(keyed(&p.key))?
        .into_inner();
    Ok(session_json(session))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_params_tell_absent_from_null() {
        let p: PatchParams = parse(
            "sessions.patch",
            json!({"key": "k", "model": null, "queueMode": "steer"}),
        )
        .unwrap();
        assert_eq!(p.model, Some(None));
        assert_eq!(p.queue_mode, Some(Some("steer".into())));
        assert_eq!(p.thinking_level, None);
    }
}
