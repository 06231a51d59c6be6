//! The WebSocket methods after `connect`: `agent`, `agent.wait`, `chat.send`, `chat.abort`,
//! `chat.history`, `sessions.list`, `sessions.reset`, `sessions.patch`.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use agentloop_proto::v1::{
    ControlMessage, GetDispatchRequest, ListSessionsRequest, PatchSessionRequest,
    ResetSessionRequest, ResolveSessionRequest, SessionInfo, SystemEvent,
};

use crate::RequestError;
use crate::dispatch::{self, Finished, Submission};
use crate::http::AppState;
use crate::params::{client_timeout, no_nul, parse, present};
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

/// Runs one method and sends its response(s) and events on `out_tx`.
pub(crate) async fn call(
    state: &AppState,
    id: Value,
    method: &str,
    params: Value,
    out_tx: mpsc::Sender<Outgoing>,
) {
    let result = match method {
        "agent" => return agent(state, &id, params, &out_tx).await,
        "chat.send" => return chat_send(state, &id, params, &out_tx).await,
        "agent.wait" => agent_wait(state, params).await,
        "chat.abort" => chat_abort(state, params).await,
        "chat.history" => crate::history::chat_history(state, params).await,
        "sessions.list" => sessions_list(state, params).await,
        "sessions.reset" => sessions_reset(state, params).await,
        "sessions.patch" => sessions_patch(state, params).await,
        other => Err(RequestError::UnknownMethod(other.to_owned())),
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

fn submission(state: &AppState, method: &str, params: Value) -> Result<Submission, RequestError> {
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
        if !state.config.models.allows(&model) {
            return Err(RequestError::InvalidRequest(format!(
                "model {model:?} is not in the allowlist"
            )));
        }
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
    })
}

fn millis_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `agent`: answers `accepted` at once, streams `agent` events, answers again at the end.
async fn agent(state: &AppState, id: &Value, params: Value, out_tx: &mpsc::Sender<Outgoing>) {
    let accepted = match start(state, "agent", params).await {
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
    method: &str,
    params: Value,
) -> Result<dispatch::Accepted, RequestError> {
    let submission = submission(state, method, params)?;
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
async fn chat_send(state: &AppState, id: &Value, params: Value, out_tx: &mpsc::Sender<Outgoing>) {
    let accepted = match start(state, "chat.send", params).await {
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

async fn agent_wait(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: WaitParams = parse("agent.wait", params)?;
    no_nul("runId", &p.run_id)?;
    let timeout = p
        .timeout_ms
        .map_or(DEFAULT_WAIT, Duration::from_millis)
        .min(state.max_timeout());
    let finished = dispatch::wait(&state.sessions, &p.run_id, Instant::now() + timeout).await?;
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

/// Resolves a session key to its id.
///
/// # Errors
/// [`RequestError::InvalidRequest`] for an empty key or one with a NUL, else memory's error.
pub(crate) async fn session_id(
    state: &AppState,
    key: &str,
    agent_id: &str,
) -> Result<String, RequestError> {
    if key.is_empty() {
        return Err(RequestError::InvalidRequest(
            "sessionKey is required".into(),
        ));
    }
    no_nul("sessionKey", key)?;
    let session = state
        .sessions
        .clone()
        .resolve_session(ResolveSessionRequest {
            session_key: key.to_owned(),
            agent_id: agent_id.to_owned(),
            channel: CHANNEL.to_owned(),
        })
        .await?
        .into_inner();
    Ok(session.id)
}

/// `chat.abort`: asks the session's owner to stop its live run.
async fn chat_abort(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("chat.abort", params)?.check()?;
    let session_id = match p.run_id.as_deref().filter(|r| !r.is_empty()) {
        Some(run_id) => {
            let record = state
                .sessions
                .clone()
                .get_dispatch(GetDispatchRequest {
                    run_id: run_id.to_owned(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            if record.run_handle.is_empty() {
                return Err(RequestError::NotFound(format!("no run {run_id}")));
            }
            record.session_id
        }
        None => session_id(state, &p.session_key, "").await?,
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

async fn sessions_list(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("sessions.list", params)?.check()?;
    let list = state
        .sessions
        .clone()
        .list_sessions(ListSessionsRequest {
            limit: p.limit.unwrap_or(0),
            agent_id: p.agent_id.unwrap_or_default(),
        })
        .await?
        .into_inner();
    let sessions: Vec<Value> = list.sessions.into_iter().map(session_json).collect();
    Ok(json!({"sessions": sessions}))
}

async fn sessions_reset(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: SessionParams = parse::<SessionParams>("sessions.reset", params)?.check()?;
    session_id(state, &p.session_key, "").await?;
    let session = state
        .sessions
        .clone()
        .reset_session(ResetSessionRequest {
            session_key: p.session_key,
        })
        .await?
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

async fn sessions_patch(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: PatchParams = parse("sessions.patch", params)?;
    let model = p.model.map(Option::unwrap_or_default);
    if let Some(model) = model.as_deref().filter(|m| !m.is_empty())
        && !state.config.models.allows(model)
    {
        return Err(RequestError::InvalidRequest(format!(
            "model {model:?} is not in the allowlist"
        )));
    }
    let queue_mode = p.queue_mode.map(Option::unwrap_or_default);
    if let Some(mode) = queue_mode.as_deref() {
        agentloop_proto::QueueMode::parse(mode)
            .map_err(|e| RequestError::InvalidRequest(e.to_string()))?;
    }
    session_id(state, &p.key, "").await?;
    let session = state
        .sessions
        .clone()
        .patch_session(PatchSessionRequest {
            session_key: p.key,
            model_override: model,
            queue_mode,
            thinking_level: p.thinking_level.map(Option::unwrap_or_default),
        })
        .await?
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
