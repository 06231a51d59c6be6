//! Chat apps' webhooks (`POST /channels/<name>`): each request proves it comes from the app
//! (Telegram: the secret token header; Slack: the signature of the signing secret), its update becomes an InboundMessage on
//! `<prefix>.inbound.<channel>`, and the app is answered 200 only once the stream stored it, so
//! an app that gets no 200 sends again and nothing is lost. A redelivered update carries the
//! same platform message id, so it is one message on every replica (the stream's duplicate
//! window, then the session inbox).

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::json;

use agentloop_bus::{Bus, error_chain};
use agentloop_channels::{Inbound, slack, telegram, webhook};

use crate::SERVICE;
use crate::state::{AppState, constant_time_eq};

/// `POST /channels/telegram`: a Telegram Bot API update.
pub(crate) async fn telegram(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let config = &state.config.channels.telegram;
    if !config.receives() {
        return answer(
            StatusCode::NOT_FOUND,
            "the Telegram webhook is off: set channels.telegram.webhook_secret",
        );
    }
    let given = header_text(&headers, telegram::SECRET_HEADER);
    if !constant_time_eq(&given, config.webhook_secret.expose()) {
        tracing::warn!("telegram webhook refused: wrong or missing secret token");
        return answer(
            StatusCode::UNAUTHORIZED,
            "X-Telegram-Bot-Api-Secret-Token is missing or wrong",
        );
    }
    let Ok(bus) = state.bus() else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "not connected to NATS yet");
    };
    let inbound = match telegram::parse_update(&body) {
        Ok(Some(inbound)) => inbound,
        Ok(None) => return answer(StatusCode::OK, "nothing to answer"),
        Err(err) => {
            let reason = keep(bus, telegram::CHANNEL, body, err.to_string()).await;
            return answer(StatusCode::BAD_REQUEST, &reason);
        }
    };
    publish(bus, inbound, &config.agent_id, config.stream_edit_ms, body).await
}

/// `POST /channels/slack`: a Slack Events API request.
pub(crate) async fn slack(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let config = &state.config.channels.slack;
    if !config.receives() {
        return answer(
            StatusCode::NOT_FOUND,
            "the Slack endpoint is off: set channels.slack.signing_secret",
        );
    }
    let header = |name: &str| header_text(&headers, name);
    let now = unix_now();
    if let Err(err) = slack::verify(
        config.signing_secret.expose(),
        &header(slack::TIMESTAMP_HEADER),
        &header(slack::SIGNATURE_HEADER),
        &body,
        now,
    ) {
        tracing::warn!(error = %err, "slack request refused");
        return answer(StatusCode::UNAUTHORIZED, &err.to_string());
    }
    let Ok(bus) = state.bus() else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "not connected to NATS yet");
    };
    match slack::parse(&body) {
        Ok(slack::Request::Challenge(challenge)) => {
            (StatusCode::OK, Json(json!({"challenge": challenge}))).into_response()
        }
        Ok(slack::Request::Ignored) => answer(StatusCode::OK, "nothing to answer"),
        Ok(slack::Request::Message(inbound)) => {
            publish(bus, inbound, &config.agent_id, config.stream_edit_ms, body).await
        }
        Err(err) => {
            let reason = keep(bus, slack::CHANNEL, body, err.to_string()).await;
            answer(StatusCode::BAD_REQUEST, &reason)
        }
    }
}

/// `POST /channels/webhook/<name>`: a message from a program of your own, signed with the
/// webhook's secret.
pub(crate) async fn webhook(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(hook) = state.config.channels.webhook.get(&name) else {
        return answer(
            StatusCode::NOT_FOUND,
            "no such webhook (channels.webhook.<name>)",
        );
    };
    let header = |name: &str| header_text(&headers, name);
    if let Err(err) = webhook::verify(
        hook.secret.expose(),
        &header(webhook::TIMESTAMP_HEADER),
        &header(webhook::SIGNATURE_HEADER),
        &body,
        unix_now(),
    ) {
        tracing::warn!(webhook = %name, error = %err, "webhook request refused");
        return answer(StatusCode::UNAUTHORIZED, &err.to_string());
    }
    let Ok(bus) = state.bus() else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "not connected to NATS yet");
    };
    match webhook::parse(&name, &body) {
        Ok(inbound) => publish(bus, inbound, &hook.agent_id, 0, body).await,
        Err(err) => {
            let reason = keep(bus, &webhook::channel(&name), body, err.to_string()).await;
            answer(StatusCode::BAD_REQUEST, &reason)
        }
    }
}

/// A header's text, empty when it is missing or not text.
fn header_text(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Publishes a chat app's message on `<prefix>.inbound.<channel>` under its platform id and
/// answers 200 once the stream stored it. `stream_ms`: how often the app's message is edited
/// while the reply is written (`0`: never).
async fn publish(
    bus: &Bus,
    inbound: Inbound,
    agent: &str,
    stream_ms: u64,
    body: Bytes,
) -> Response {
    match publish_inbound(bus, inbound, agent, stream_ms, body).await {
        Published::Accepted => answer(StatusCode::OK, "accepted"),
        // Answered 200: the app would send the same refused message again forever.
        Published::Refused(reason) => answer(StatusCode::OK, &reason),
        // Not stored: the app sends it again later.
        Published::NotStored(reason) => answer(StatusCode::SERVICE_UNAVAILABLE, &reason),
    }
}

/// What became of a chat app's message.
pub(crate) enum Published {
    /// Stored in INBOUND.
    Accepted,
    /// Refused by the contract and kept on the dead-letter subject.
    Refused(String),
    /// Not stored (the stream did not answer): to be sent again.
    NotStored(String),
}

/// Publishes `inbound` for `agent` under its platform id; `body` is what the app sent, kept
/// when the message is refused.
pub(crate) async fn publish_inbound(
    bus: &Bus,
    inbound: Inbound,
    agent: &str,
    stream_ms: u64,
    body: Bytes,
) -> Published {
    let channel = inbound.channel.clone();
    let mut message = inbound.into_message(agent);
    if stream_ms > 0 {
        message.metadata.insert(
            agentloop_proto::META_STREAM_EVERY_MS.to_owned(),
            stream_ms.to_string(),
        );
    }
    if let Err(err) = agentloop_proto::validate_inbound(&mut message, &channel) {
        let reason = format!("{channel} message refused: {err}");
        return Published::Refused(keep(bus, &channel, body, reason).await);
    }
    let msg_id = agentloop_proto::inbound_msg_id(&message.session_key, &message.idempotency_key);
    match bus
        .publish_durable(bus.subjects().inbound(&channel), &message, Some(&msg_id))
        .await
    {
        Ok(()) => Published::Accepted,
        Err(err) => Published::NotStored(error_chain(&err)),
    }
}

/// Keeps a refused request on the dead-letter subject and returns the reason.
pub(crate) async fn keep(bus: &Bus, channel: &str, body: Bytes, reason: String) -> String {
    let subject = bus.subjects().inbound(channel);
    if let Err(err) = bus
        .dead_letter(SERVICE, &subject, None, body, &reason)
        .await
    {
        tracing::error!(error = %error_chain(&err), channel, "failed to dead-letter a refused webhook");
    }
    reason
}

fn answer(status: StatusCode, description: &str) -> Response {
    let body = json!({"ok": status.is_success(), "description": description});
    (status, Json(body)).into_response()
}
