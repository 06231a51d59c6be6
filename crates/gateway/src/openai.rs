//! `POST /v1/chat/completions` and `GET /v1/models`, OpenAI-compatible. `model` names the agent
//! (`agentloop` or `agentloop/<agentId>`); the session comes from `user` or `X-Session-Key`;
//! only the last user message is sent, since the session's transcript holds the context.

use std::convert::Infallible;
use std::net::SocketAddr;

use agentloop_proto::{EventPhase, EventStream};
use axum::{
    Json,
    extract::{ConnectInfo, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response, Sse, sse::Event},
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::Instrument as _;

use crate::RequestError;
use crate::dispatch::{self, EndStatus, Finished, Submission};
use crate::guard::Refusal;
use crate::principal::Scope;
use crate::state::{AppState, bearer};

/// The model name of the default agent.
const DEFAULT_MODEL: &str = "agentloop";
/// The channel of messages sent over this API.
const CHANNEL: &str = "openai";

/// An OpenAI-style error response.
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        (self.status, Json(body)).into_response()
    }
}

impl From<RequestError> for ApiError {
    fn from(error: RequestError) -> Self {
        let (status, kind) = match &error {
            RequestError::Unauthorized(_) | RequestError::NotConnected => {
                (StatusCode::UNAUTHORIZED, "authentication_error")
            }
            RequestError::NotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error"),
            RequestError::Forbidden(_) => (StatusCode::FORBIDDEN, "permission_error"),
            RequestError::RateLimited { .. }
            | RequestError::TooManyInFlight { .. }
            | RequestError::AuthThrottled { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error")
            }
            RequestError::FrameTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error")
            }
            RequestError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            RequestError::InvalidRequest(_)
            | RequestError::UnknownMethod(_)
            | RequestError::ProtocolMismatch { .. }
            | RequestError::Device(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        };
        Self {
            status,
            kind,
            code: error.code(),
            message: error.to_string(),
        }
    }
}

/// The part of a chat completion request the gateway reads; the rest is ignored.
#[derive(Deserialize)]
pub(crate) struct CompletionRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

/// Returns the agent a model name selects, or `None` when it names no agent of this gateway.
fn agent_of(model: &str) -> Option<String> {
    match model {
        "" | DEFAULT_MODEL => Some(String::new()),
        other => other
            .strip_prefix("agentloop/")
            .filter(|id| !id.is_empty())
            .map(str::to_owned),
    }
}

/// Returns the text of the last user message (string content or text parts).
fn last_user_text(messages: &[ChatMessage]) -> Option<String> {
    let message = messages.iter().rev().find(|m| m.role == "user")?;
    let text = match &message.content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    (!text.trim().is_empty()).then_some(text)
}

/// `GET /v1/models`: one model per configured agent.
pub(crate) async fn models(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let client = state.guard.client_ip(peer, &headers);
    if let Err(error) = state.authorize(client, bearer(&headers)) {
        return ApiError::from(error).into_response();
    }
    let data: Vec<Value> = state
        .config
        .gateway
        .agents
        .iter()
        .map(|agent| {
            let id = if agent == "main" {
                DEFAULT_MODEL.to_owned()
            } else {
                format!("{DEFAULT_MODEL}/{agent}")
            };
            json!({"id": id, "object": "model", "created": 0, "owned_by": "agentloop"})
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `POST /v1/chat/completions`, streaming (SSE) or not.
pub(crate) async fn completions(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // Its own trace, or the caller's when it sends `traceparent`: the run it starts joins it.
    let span = agentloop_telemetry::http_server_span("POST", "/v1/chat/completions", &headers);
    let response = match complete(state, peer, headers, body)
        .instrument(span.clone())
        .await
    {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    span.record("status", response.status().as_u16());
    response
}

async fn complete(
    state: AppState,
    peer: SocketAddr,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    // A browser sends a cross-site `text/plain` (or form) POST without asking first; a JSON one
    // needs a CORS preflight this gateway never grants.
    if !crate::guard::is_json(&headers) {
        return Ok(Refusal::NotJson.into_response());
    }
    let client = state.guard.client_ip(peer, &headers);
    let principal = state.authorize(client, bearer(&headers))?;
    principal.require(Scope::Write)?;
    // Held until the answer is out (a stream's last event): each open request waits on a run.
    let slot = state.limits.http_request(client)?;
    let body = body.map_err(|e| ApiError {
        status: e.status(),
        ..RequestError::InvalidRequest(format!("invalid request body: {}", e.body_text())).into()
    })?;
    let request: CompletionRequest = serde_json::from_slice(&body).map_err(|e| {
        RequestError::InvalidRequest(format!(
            "invalid request body: expected a JSON chat completion request: {e}"
        ))
    })?;
    let agent_id = agent_of(&request.model).ok_or_else(|| ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        code: "model_not_found",
        message: format!(
            "model {:?} is not an agent of this gateway (use {DEFAULT_MODEL} or {DEFAULT_MODEL}/<agentId>)",
            request.model
        ),
    })?;
    let text = last_user_text(&request.messages).ok_or_else(|| {
        RequestError::InvalidRequest("messages need a user message with text".into())
    })?;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let session_key = header("x-session-key")
        .or(request.user.filter(|u| !u.is_empty()))
        .unwrap_or_else(|| format!("openai:{}", agentloop_bus::nuid()));
    crate::params::no_nul("user", &session_key)?;
    let submission = Submission {
        session_key,
        text,
        idempotency_key: header("idempotency-key"),
        agent_id,
        channel: CHANNEL.to_owned(),
        caller: principal.caller(),
        timeout: state.run_timeout(),
        record: dispatch::Record::WithKey,
        ..Default::default()
    };
    let accepted = dispatch::submit(
        state.bus()?,
        &state.sessions,
        &state.known_sessions,
        submission,
        state.dispatch_ttl(),
        // A non-streaming answer needs only the reply.
        request.stream,
    )
    .await?;
    let id = format!("chatcmpl-{}", accepted.run_handle);
    let model = if request.model.is_empty() {
        DEFAULT_MODEL.to_owned()
    } else {
        request.model
    };
    let created = created_now();
    if !request.stream {
        let finished = accepted.finish(|_| async {}).await;
        drop(slot);
        let finished = settle(finished)?;
        let body = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": finished.text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        });
        return Ok(Json(body).into_response());
    }
    let (tx, rx) = mpsc::channel::<Event>(64);
    let chunk = move |delta: Value, finish: Option<&str>| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    // The run is followed in its own task: the response body is a stream the client pulls.
    tokio::spawn(async move {
        let _ = tx
            .send(
                Event::default()
                    .data(chunk(json!({"role": "assistant", "content": ""}), None).to_string()),
            )
            .await;
        let mut streamed = String::new();
        let finished = accepted
            .finish(|event| {
                let tx = tx.clone();
                // Only the assistant's text is content: tool activity never leaks into it.
                let data = event
                    .is(EventStream::Assistant, EventPhase::Delta)
                    .then(|| {
                        streamed.push_str(&event.delta);
                        chunk(json!({"content": event.delta}), None).to_string()
                    });
                async move {
                    if let Some(data) = data {
                        let _ = tx.send(Event::default().data(data)).await;
                    }
                }
            })
            .await;
        match settle(finished) {
            Ok(finished) => {
                // Whatever the deltas missed (a reply without streamed events) is sent now.
                let rest = finished
                    .text
                    .strip_prefix(streamed.as_str())
                    .unwrap_or(finished.text.as_str());
                if !rest.is_empty() {
                    let _ = tx
                        .send(
                            Event::default()
                                .data(chunk(json!({"content": rest}), None).to_string()),
                        )
                        .await;
                }
                let _ = tx
                    .send(Event::default().data(chunk(json!({}), Some("stop")).to_string()))
                    .await;
            }
            Err(error) => {
                let body = json!({"error": {"message": error.message, "type": error.kind, "code": error.code}});
                let _ = tx.send(Event::default().data(body.to_string())).await;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
        drop(slot);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Ok(Sse::new(stream).into_response())
}

/// Turns a failed or timed-out run into an API error.
fn settle(finished: Finished) -> Result<Finished, ApiError> {
    match finished.status {
        EndStatus::Ok => Ok(finished),
        EndStatus::Error => Err(ApiError {
            status: StatusCode::BAD_GATEWAY,
            kind: "server_error",
            code: "run_failed",
            message: format!("the run failed: {}", finished.error),
        }),
        EndStatus::Timeout => Err(ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: "server_error",
            code: "timeout",
            message: finished.error,
        }),
    }
}

fn created_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_select_agents() {
        assert_eq!(agent_of("agentloop"), Some(String::new()));
        assert_eq!(agent_of("agentloop/helper"), Some("helper".into()));
        assert_eq!(agent_of("gpt-4o"), None);
        assert_eq!(agent_of("agentloop/"), None);
    }

    #[test]
    fn the_last_user_message_is_sent_whatever_its_content_shape() {
        let messages: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]},
        ]))
        .unwrap();
        assert_eq!(last_user_text(&messages), Some("second".into()));
        assert_eq!(last_user_text(&messages[..1]), None);
    }
}
