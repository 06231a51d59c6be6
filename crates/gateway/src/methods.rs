//! The WebSocket methods after `connect`: `agent`, `agent.wait`, `chat.send`, `chat.abort`,
//! `chat.history`, the `sessions.*` methods, the gateway's own `health`, `status`,
//! `agents.list` and `commands.list`, the admin's `inbox.subscribe`, and the guard's operator
//! methods (`operator.rs`). Shapes follow
//! OpenClaw's gateway protocol where it has the method, so its clients work unmodified.
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

use crate::dispatch::{self, Finished, Record, Submission};
use crate::frames::{Outgoing, err, ok};
use crate::params::{client_timeout, no_nul, parse};
use crate::principal::{Principal, Scope};
use crate::state::AppState;
use crate::status::{self, millis_now};
use crate::{RequestError, memories, operator, sessions, usage};

/// Every method, as hello-ok announces them: exactly what [`call`] serves.
pub(crate) const METHODS: [&str; 27] = [
    "connect",
    "health",
    "status",
    "agents.list",
    "commands.list",
    "agent",
    "agent.wait",
    "chat.send",
    "chat.abort",
    "chat.history",
    "sessions.list",
    "sessions.describe",
    "sessions.subscribe",
    "sessions.reset",
    "sessions.patch",
    "sessions.usage",
    "memory.list",
    "memory.forget",
    "inbox.subscribe",
    "pairing.list",
    "pairing.approve",
    "pairing.revoke",
    "approvals.list",
    "approvals.resolve",
    "exec.approval.resolve",
    "approvals.subscribe",
    "audit.list",
];

/// Every event a connection may get, as hello-ok announces them.
pub(crate) const EVENTS: [&str; 9] = [
    "connect.challenge",
    "tick",
    "shutdown",
    "agent",
    "chat",
    "sessions.changed",
    "inbox",
    "exec.approval.requested",
    "exec.approval.resolved",
];

/// `agent.wait` waits this long when the client names no `timeoutMs`.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The channel of messages sent over `/ws`.
const CHANNEL: &str = "webchat";

/// The scope a method needs; `None` for a method that does not exist.
fn scope_of(method: &str) -> Option<Scope> {
    match method {
        "health" | "status" | "agents.list" | "commands.list" | "agent.wait" | "chat.history"
        | "sessions.list" | "sessions.describe" | "sessions.subscribe" | "sessions.usage"
        | "memory.list" => Some(Scope::Read),
        "agent" | "chat.send" | "chat.abort" | "sessions.reset" | "sessions.patch"
        | "memory.forget" => Some(Scope::Write),
        "inbox.subscribe"
        | "pairing.list"
        | "pairing.approve"
        | "pairing.revoke"
        | "approvals.list"
        | "approvals.resolve"
        | "exec.approval.resolve"
        | "approvals.subscribe"
        | "audit.list" => Some(Scope::Admin),
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
        (Ok(()), "sessions.subscribe") => {
            return crate::watch::subscribe(state, who, &id, &out_tx, closed).await;
        }
        (Ok(()), "approvals.subscribe") => {
            return operator::approvals_subscribe(state, &id, &out_tx, closed).await;
        }
        (Ok(()), "pairing.list") => operator::pairing_list(state, params).await,
        (Ok(()), "pairing.approve") => operator::pairing_approve(state, who, params).await,
        (Ok(()), "pairing.revoke") => operator::pairing_revoke(state, who, params).await,
        (Ok(()), "approvals.list") => operator::approvals_list(state).await,
        (Ok(()), "approvals.resolve" | "exec.approval.resolve") => {
            operator::approvals_resolve(state, who, method, params).await
        }
        (Ok(()), "audit.list") => operator::audit_list(state, params).await,
        (Ok(()), "health") => Ok(status::health(state)),
        (Ok(()), "status") => status::status(state, who).await,
        (Ok(()), "agents.list") => Ok(status::agents_list(state)),
        (Ok(()), "commands.list") => Ok(status::commands_list()),
        (Ok(()), "sessions.describe") => sessions::sessions_describe(state, who, params).await,
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
    let agent_id = p.agent_id.unwrap_or_default();
    // OpenClaw's default: the agent's main session.
    let session_key = p.session_key.filter(|k| !k.is_empty()).unwrap_or_else(|| {
        let agent = if agent_id.is_empty() {
            status::default_agent(state)
        } else {
            &agent_id
        };
        crate::main_key::main_session_key(agent, who.name())
    });
    Ok(Submission {
        session_key,
        text: p.message,
        idempotency_key: p.idempotency_key,
        agent_id,
        channel: CHANNEL.to_owned(),
        sender_id: p.sender_id.unwrap_or_default(),
        queue_mode: p.queue_mode.unwrap_or_default(),
        metadata,
        timeout,
        caller: who.caller(),
        record: Record::Always,
    })
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
    let session_id = accepted.session_id.clone();
    let began = Instant::now();
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
    let ended = Ended {
        handle: &handle,
        session_key: &session_key,
        session_id: &session_id,
        took: began.elapsed(),
    };
    let _ = out_tx.send(ok(id, ended.payload(&finished))).await;
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

/// An `agent` request's run, as its final answer reports it.
struct Ended<'a> {
    handle: &'a str,
    session_key: &'a str,
    session_id: &'a str,
    took: Duration,
}

impl Ended<'_> {
    /// The final answer: agentloop's fields, and OpenClaw's `summary` and `result.payloads`
    /// (what `openclaw agent` prints).
    fn payload(&self, finished: &Finished) -> Value {
        let ok = finished.status == dispatch::EndStatus::Ok;
        let payloads = if ok && !finished.text.is_empty() {
            json!([{"text": finished.text, "mediaUrl": null}])
        } else {
            json!([])
        };
        let summary = if ok {
            "completed"
        } else {
            finished.error.as_str()
        };
        let mut payload = json!({
            "runId": self.handle,
            "status": finished.status.as_str(),
            "summary": summary,
            "text": finished.text,
            "sessionKey": self.session_key,
            "agentRunId": finished.agent_run_id,
            "endedAt": millis_now(),
            "result": {
                "payloads": payloads,
                "meta": {
                    "durationMs": self.took.as_millis(),
                    "agentMeta": {"sessionId": self.session_id, "runId": finished.agent_run_id},
                },
            },
        });
        if !finished.error.is_empty() {
            payload["error"] = json!(finished.error);
        }
        payload
    }
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
    // OpenClaw's clients read the phase (and a delta) inside `data`.
    let mut data = if event.data.is_empty() {
        json!({})
    } else {
        serde_json::from_str(&event.data).unwrap_or_else(|_| json!(event.data))
    };
    if let Value::Object(fields) = &mut data {
        fields.entry("phase").or_insert_with(|| json!(event.phase));
        if !event.delta.is_empty() {
            fields.entry("delta").or_insert_with(|| json!(event.delta));
        }
    }
    payload.insert("data".into(), data);
    if let Some(ts) = &event.ts {
        payload.insert("ts".into(), json!(status::timestamp_ms(ts)));
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
    let mut chat = ChatEvents {
        handle: &handle,
        session_key: &session_key,
        text: String::new(),
        seq: 0,
    };
    let finished = accepted
        .finish(|event| {
            let out_tx = out_tx.clone();
            let payload = event
                .is(EventStream::Assistant, EventPhase::Delta)
                .then(|| chat.delta(&event.delta));
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
    let payload = chat.end(&finished);
    let _ = out_tx
        .send(Outgoing::Event {
            event: "chat",
            payload,
        })
        .await;
}

/// The `chat` events of one `chat.send`, numbered per run as OpenClaw numbers them.
struct ChatEvents<'a> {
    handle: &'a str,
    session_key: &'a str,
    /// The answer so far.
    text: String,
    seq: u64,
}

impl ChatEvents<'_> {
    /// An assistant message as OpenClaw's clients render it.
    fn message(text: &str) -> Value {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}], "timestamp": millis_now()})
    }

    /// A `delta`: `message` holds the whole answer so far, `deltaText` (and `delta`) the piece.
    fn delta(&mut self, piece: &str) -> Value {
        self.text.push_str(piece);
        self.seq += 1;
        json!({"runId": self.handle, "sessionKey": self.session_key, "seq": self.seq,
               "state": "delta", "deltaText": piece, "delta": piece, "text": self.text,
               "message": Self::message(&self.text)})
    }

    /// The `final` (with the answer) or `error` event.
    fn end(&mut self, finished: &Finished) -> Value {
        self.seq += 1;
        match finished.status {
            dispatch::EndStatus::Ok => {
                json!({"runId": self.handle, "sessionKey": self.session_key, "seq": self.seq,
                       "state": "final", "stopReason": "stop", "text": finished.text,
                       "message": Self::message(&finished.text)})
            }
            status => {
                let kind = if status == dispatch::EndStatus::Timeout {
                    "timeout"
                } else {
                    "unknown"
                };
                json!({"runId": self.handle, "sessionKey": self.session_key, "seq": self.seq,
                       "state": "error", "status": status.as_str(), "errorKind": kind,
                       "errorMessage": finished.error})
            }
        }
    }
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
    fn every_announced_method_has_a_scope() {
        for method in METHODS.iter().filter(|m| **m != "connect") {
            assert!(
                scope_of(method).is_some(),
                "{method} is announced but not served"
            );
        }
        assert!(scope_of("no.such.method").is_none());
    }

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
