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

use agentloop_proto::v1::SystemEvent;
use agentloop_proto::{EventPhase, EventStream};

use crate::dispatch::{self, Finished, Submission};
use crate::frames::{Outgoing, err, ok};
use crate::params::{client_timeout, no_nul, parse};
use crate::principal::{Principal, Scope};
use crate::state::AppState;
use crate::{RequestError, memories, sessions, usage};

/// Every method, as `connect` announces them.
pub(crate) const METHODS: [&str; 13] = [
    "connect",
    "agent",
    "agent.wait",
    "chat.send",
    "chat.abort",
    "chat.history",
    "sessions.list",
    "sessions.reset",
    "sessions.patch",
    "sessions.usage",
    "memory.list",
    "memory.forget",
    "inbox.subscribe",
];

/// `agent.wait` waits this long when the client names no `timeoutMs`.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The channel of messages sent over `/ws`.
const CHANNEL: &str = "webchat";

/// The scope a method needs; `None` for a method that does not exist.
fn scope_of(method: &str) -> Option<Scope> {
    match method {
        "agent.wait" | "chat.history" | "sessions.list" | "sessions.usage" | "memory.list" => {
            Some(Scope::Read)
        }
        "agent" | "chat.send" | "chat.abort" | "sessions.reset" | "sessions.patch"
        | "memory.forget" => Some(Scope::Write),
        "inbox.subscribe" => Some(Scope::Admin),
        _ => None,
    }
}

/// Runs one method for `who` and sends its response(s) and events on `out_tx`; `closed` is
/// cancelled when the connection ends (a subscription stops then).
pub(crate) async fn call(
    state: &AppState,
    who: &Principal,
    id: Value,
    method: &str,
    params: Value,
    out_tx: mpsc::Sender<Outgoing>,
    closed: tokio_util::sync::CancellationToken,
) {
    let allowed = match scope_of(method) {
        Some(scope) => who.require(scope),
        None => Err(RequestError::UnknownMethod(method.to_owned())),
    };
    let result = match (allowed, method) {
        (Err(error), _) => Err(error),
        (Ok(()), "agent") => return agent(state, who, &id, params, &out_tx).await,
        (Ok(()), "chat.send") => return chat_send(state, who, &id, params, &out_tx).await,
        (Ok(()), "inbox.subscribe") => {
            return crate::inbox::subscribe(state, &id, &out_tx, closed).await;
        }
        (Ok(()), "agent.wait") => agent_wait(state, who, params).await,
        (Ok(()), "chat.abort") => sessions::chat_abort(state, who, params).await,
        (Ok(()), "chat.history") => crate::history::chat_history(state, who, params).await,
        (Ok(()), "sessions.list") => sessions::sessions_list(state, who, params).await,
        (Ok(()), "sessions.reset") => sessions::sessions_reset(state, who, params).await,
        (Ok(()), "sessions.patch") => sessions::sessions_patch(state, who, params).await,
        (Ok(()), "sessions.usage") => usage::sessions_usage(state, who, params).await,
        (Ok(()), "memory.list") => memories::memory_list(state, who, params).await,
        (Ok(()), "memory.forget") => memories::memory_forget(state, who, params).await,
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
        state.check_model(who, &model)?;
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
        &state.known_sessions,
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
            let payload = event
                .is(EventStream::Assistant, EventPhase::Delta)
                .then(|| {
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
}
