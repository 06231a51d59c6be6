//! The WebSocket methods after `connect`: `agent`, `agent.wait`, `chat.send`, `chat.abort`,
//! `chat.history`, `sessions.list`, `sessions.reset`, `sessions.patch`.
//!
//! Each acts for the connection's principal: it needs the method's scope, and memory answers
//! a session (or run) of another principal as not found. No method but `agent`/`chat.send`
//! creates a session.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use agentloop_proto::v1::{
    ControlMessage, GetDispatchRequest, ListSessionsRequest, PatchSessionRequest,
    ResetSessionRequest, SessionInfo, SystemEvent,
};

use crate::RequestError;
use crate::dispatch::{self, Finished, Submission};
use crate::http::AppState;
use crate::params::{client_timeout, no_nul, parse, present};
use crate::principal::{Principal, Scope};
use crate::ws::{Outgoing, err, ok};

/// Every method, as `connect` announces them.
pub(crate) const METHODS: [&str; 9] = [
    "connect",
    "agent",
    "agent.wait",
    "chat.send",
    "chat.abort",
    "chat.history",
    "sessions.list",
    "sessions.reset",
    "sessions.patch",
];

/// `agent.wait` waits this long when the client names no `timeoutMs`.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The channel of messages sent over `/ws`.
const CHANNEL: &str = "webchat";

/// The scope a method needs; `None` for a method that does not exist.
fn scope_of(method: &str) -> Option<Scope> {
    match method {
        "agent.wait" | "chat.history" | "sessions.list" => Some(Scope::Read),
        "agent" | "chat.send" | "chat.abort" | "sessions.reset" | "sessions.patch" => {
            Some(Scope::Write)
        }
        _ => None,
    }
}

/// Runs one method for `who` and sends its response(s) and events on `out_tx`.
pub(crate) async fn call(
    state: &AppState,
    who: &Principal,
    id: Value,
    method: &str,
    params: Value,
    out_tx: mpsc::Sender<Outgoing>,
) {
    let allowed = match scope_of(method) {
        Some(scope) => who.require(scope),
        None => Err(RequestError::UnknownMethod(method.to_owned())),
    };
    let result = match (allowed, method) {
        (Err(error), _) => Err(error),
        (Ok(()), "agent") => return agent(state, who, &id, params, &out_tx).await,
        (Ok(()), "chat.send") => return chat_send(state, who, &id, params, &out_tx).await,
        (Ok(()), "agent.wait") => agent_wait(state, who, params).await,
        (Ok(()), "chat.abort") => chat_abort(state, who, params).await,
        (Ok(()), "chat.history") => crate::history::chat_history(state, who, params).await,
        (Ok(()), "sessions.list") => sessions_list(state, who, params).await,
        (Ok(()), "sessions.reset") => sessions_reset(state, who, params).await,
        (Ok(()), "sessions.patch") => sessions_patch(state, who, params).await,
        (Ok(()), other) => Err(RequestError::UnknownMethod(other.to_owned())),
    };
    let frame = match result {
        Ok(payload) => ok(&id, payload),
        Err(error) => err(&id, &error),
    };
    let _ = out_tx.send(frame).await;
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentParams {
    #[serde(default)]
    message: String,
    #[serde(default, alias = "session_key")]
    session_key: Option<String>,
    #[serde(default, alias = "idempotency_key")]
    idempotency_key: Option<String>,
    #[serde(default, alias = "agent_id")]
    agent_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    /// Seconds.
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default, alias = "timeout_ms")]
    timeout_ms: Option<u64>,
    #[serde(default, alias = "queue_mode")]
    queue_mode: Option<String>,
    #[serde(default, alias = "sender_id")]
    sender_id: Option<String>,
}

fn submission(
    state: &AppState,
    who: &Principal,
    method: &str,
    params: Value,
) -> Result<Submission, RequestError> {
    let p: AgentParams = parse(method, params)?;
    for (field, value) in [
        ("sessionKey", p.session_key.as_deref()),
        ("idempotencyKey", p.idempotency_key.as_deref()),
        ("agentId", p.agent_id.as_deref()),
        ("senderId", p.sender_id.as_deref()),
        ("model", p.model.as_deref()),
        ("queueMode", p.queue_mode.as_deref()),
    ] {
        no_nul(field, value.unwrap_or_default())?;
    }
    if p.message.trim().is_empty() {
        return Err(RequestError::InvalidRequest("message is required".into()));
    }
    let mut metadata = HashMap::new();
    if let Some(model) = p.model.filter(|m| !m.is_empty()) {
        check_model(state, who, &model)?;
        metadata.insert("model".to_owned(), model);
    }
    let timeout = client_timeout(state, p.timeout, p.timeout_ms)?;
    Ok(Submission {
        session_key: p
            .session_key
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| "main".into()),
        text: p.message,
        idempotency_key: p.idempotency_key,
        agent_id: p.agent_id.unwrap_or_default(),
        channel: CHANNEL.to_owned(),
        sender_id: p.sender_id.unwrap_or_default(),
        queue_mode: p.queue_mode.unwrap_or_default(),
        metadata,
        timeout,
        caller: who.caller(),
    })
}

/// Checks that `who` may have a run use `model`: an admin any model the allowlist allows
/// (any, when it is empty), others only listed ones or the default.
///
/// # Errors
/// [`RequestError::Forbidden`] for a model only an admin may choose,
/// [`RequestError::InvalidRequest`] for one nobody may.
fn check_model(state: &AppState, who: &Principal, model: &str) -> Result<(), RequestError> {
    let policy = &state.config.models;
    if !policy.allows(model) {
        return Err(RequestError::InvalidRequest(format!(
            "model {model:?} is not in the allowlist"
        )));
    }
    if !who.is_admin() && !policy.listed(model) {
        return Err(RequestError::Forbidden(format!(
            "only an admin may choose model {model:?} (not in models.allowlist)"
        )));
    }
    Ok(())
}

fn millis_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `agent`: answers `accepted` at once, streams `agent` events, answers again at the end.
async fn agent(
    state: &AppState,
    who: &Principal,
    id: &Value,
    params: Value,
    out_tx: &mpsc::Sender<Outgoing>,
) {
    let accepted = match start(state, who, "agent", params).await {
        Ok(accepted) => accepted,
        Err(error) => {
            let _ = out_tx.send(err(id, &error)).await;
            return;
        }
    };
    let handle = accepted.run_handle.clone();
    let session_key = accepted.session_key.clone();
    let _ = out_tx
        .send(ok(
            id,
            json!({
                "runId": handle,
                "status": "accepted",
                "acceptedAt": millis_now(),
                "sessionKey": accepted.session_key,
                "sessionId": accepted.session_id,
                "idempotencyKey": accepted.idempotency_key,
                "duplicate": accepted.duplicate,
            }),
        ))
        .await;
    let finished = accepted
        .finish(|event| {
            let out_tx = out_tx.clone();
            let payload = event_payload(&handle, &event);
            async move {
                let _ = out_tx
                    .send(Outgoing::Event {
                        event: "agent",
                        payload,
                    })
                    .await;
            }
        })
        .await;
    let _ = out_tx
        .send(ok(id, final_payload(&handle, &session_key, &finished)))
        .await;
}

async fn start(
    state: &AppState,
    who: &Principal,
    method: &str,
    params: Value,
) -> Result<dispatch::Accepted, RequestError> {
    let submission = submission(state, who, method, params)?;
    dispatch::submit(
        state.bus()?,
        &state.sessions,
        submission,
        state.dispatch_ttl(),
        true,
    )
    .await
}

fn final_payload(handle: &str, session_key: &str, finished: &Finished) -> Value {
    let mut payload = json!({
        "runId": handle,
        "status": finished.status.as_str(),
        "text": finished.text,
        "sessionKey": session_key,
        "agentRunId": finished.agent_run_id,
        "endedAt": millis_now(),
    });
    if !finished.error.is_empty() {
        payload["error"] = json!(finished.error);
    }
    payload
}

/// Returns the client's view of a run event: the gateway's run id, the rest as on the bus.
pub(crate) fn event_payload(run_handle: &str, event: &SystemEvent) -> Value {
    let mut payload = Map::new();
    payload.insert("runId".into(), json!(run_handle));
    payload.insert("agentRunId".into(), json!(event.run_id));
    payload.insert("sessionKey".into(), json!(event.session_key));
    payload.insert("seq".into(), json!(event.seq));
    payload.insert("stream".into(), json!(event.stream));
    payload.insert("phase".into(), json!(event.phase));
    for (name, value) in [
        ("delta", &event.delta),
        ("toolName", &event.tool_name),
        ("toolCallId", &event.tool_call_id),
    ] {
        if !value.is_empty() {
            payload.insert(name.into(), json!(value));
        }
    }
    if !event.data.is_empty() {
        let data = serde_json::from_str(&event.data).unwrap_or_else(|_| json!(event.data));
        payload.insert("data".into(), data);
    }
    if let Some(ts) = &event.ts {
        let ms = ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000);
        payload.insert("ts".into(), json!(ms));
    }
    Value::Object(payload)
}

/// `chat.send`: answers `started` at once, then `chat` events (`delta`, then `final` or `error`).
async fn chat_send(
    state: &AppState,
    who: &Principal,
    id: &Value,
    params: Value,
    out_tx: &mpsc::Sender<Outgoing>,
) {
    let accepted = match start(state, who, "chat.send", params).await {
        Ok(accepted) => accepted,
        Err(error) => {
            let _ = out_tx.send(err(id, &error)).await;
            return;
        }
    };
    let handle = accepted.run_handle.clone();
    let session_key = accepted.session_key.clone();
    let _ = out_tx
        .send(ok(
            id,
            json!({"runId": handle, "status": "started", "duplicate": accepted.duplicate}),
        ))
        .await;
    let mut text = String::new();
    let finished = accepted
        .finish(|event| {
            let out_tx = out_tx.clone();
            let payload = (event.stream == "assistant" && event.phase == "delta").then(|| {
                text.push_str(&event.delta);
                json!({"runId": handle, "sessionKey": session_key, "state": "delta",
                       "delta": event.delta, "text": text})
            });
            async move {
                if let Some(payload) = payload {
                    let _ = out_tx
                        .send(Outgoing::Event {
                            event: "chat",
                            payload,
                        })
                        .await;
                }
            }
        })
        .await;
    let payload = match finished.status {
        dispatch::EndStatus::Ok => {
            json!({"runId": handle, "sessionKey": session_key, "state": "final", "text": finished.text})
        }
        _ => json!({"runId": handle, "sessionKey": session_key, "state": "error",
                    "status": finished.status.as_str(), "errorMessage": finished.error}),
    };
    let _ = out_tx
        .send(Outgoing::Event {
            event: "chat",
            payload,
        })
        .await;
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WaitParams {
    #[serde(alias = "run_id")]
    run_id: String,
    #[serde(default, alias = "timeout_ms")]
    timeout_ms: Option<u64>,
}

async fn agent_wait(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: WaitParams = parse("agent.wait", params)?;
    no_nul("runId", &p.run_id)?;
    let timeout = p
        .timeout_ms
        .map_or(DEFAULT_WAIT, Duration::from_millis)
        .min(state.max_timeout());
    let deadline = Instant::now() + timeout;
    let finished = dispatch::wait(&state.sessions, who.caller(), &p.run_id, deadline).await?;
    let mut payload = json!({
        "runId": p.run_id,
        "status": finished.status.as_str(),
        "text": finished.text,
        "agentRunId": finished.agent_run_id,
    });
    if !finished.error.is_empty() {
        payload["error"] = json!(finished.error);
    }
    Ok(payload)
}

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
    found
        .sessions
        .into_iter()
        .next()
        .map(|s| s.id)
        .ok_or_else(|| no_session(key))
}

/// `chat.abort`: asks the session's owner to stop its live run.
async fn chat_abort(
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
        action: "abort".into(),
        reason: "chat.abort".into(),
    };
    bus.publish_fast(
        bus.subjects().control(&session_id),
        &control,
        agentloop_proto::Encoding::Proto,
    )
    .await
    .map_err(|e| RequestError::Unavailable(agentloop_bus::error_chain(&e)))?;
    Ok(json!({"status": "abort-requested", "sessionId": session_id, "runId": p.run_id}))
}

fn session_json(s: SessionInfo) -> Value {
    let ms = |t: Option<pbjson_types::Timestamp>| {
        t.map(|t| t.seconds * 1000 + i64::from(t.nanos / 1_000_000))
    };
    json!({
        "key": s.key, "sessionId": s.id, "agentId": s.agent_id, "channel": s.channel,
        "model": s.model_override, "queueMode": s.queue_mode, "thinkingLevel": s.thinking_level,
        "inputTokens": s.input_tokens, "outputTokens": s.output_tokens,
        "createdAt": ms(s.created_at), "updatedAt": ms(s.updated_at),
    })
}

async fn sessions_list(
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

async fn sessions_reset(
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

async fn sessions_patch(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: PatchParams = parse("sessions.patch", params)?;
    let model = p.model.map(Option::unwrap_or_default);
    if let Some(model) = model.as_deref().filter(|m| !m.is_empty()) {
        check_model(state, who, model)?;
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
    fn event_payloads_use_the_gateway_run_id_and_parse_data() {
        let event = SystemEvent {
            run_id: "internal".into(),
            seq: 3,
            stream: "tool".into(),
            phase: "start".into(),
            tool_name: "current_time".into(),
            data: r#"{"args":{}}"#.into(),
            ..Default::default()
        };
        let payload = event_payload("handle", &event);
        assert_eq!(payload["runId"], "handle");
        assert_eq!(payload["agentRunId"], "internal");
        assert_eq!(payload["seq"], 3);
        assert_eq!(payload["toolName"], "current_time");
        assert_eq!(payload["data"]["args"], json!({}));
        assert!(payload.get("delta").is_none());
    }

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
