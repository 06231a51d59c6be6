//! Chat apps' webhooks (`POST /channels/<name>`): each request proves it comes from the app
//! (Telegram: the secret token header), its update becomes an InboundMessage on
//! `<prefix>.inbound.<channel>`, and the app is answered 200 only once the stream stored it, so
//! an app that gets no 200 sends again and nothing is lost. A redelivered update carries the
//! same platform message id, so it is one message on every replica (the stream's duplicate
//! window, then the session inbox).

use axum::{
    Json,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::json;

use agentloop_bus::error_chain;
use agentloop_channels::telegram;

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
    let given = headers
        .get(telegram::SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !constant_time_eq(given, config.webhook_secret.expose()) {
        tracing::warn!("telegram webhook refused: wrong or missing secret token");
        return answer(
            StatusCode::UNAUTHORIZED,
            "X-Telegram-Bot-Api-Secret-Token is missing or wrong",
        );
    }
    let Ok(bus) = state.bus() else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "not connected to NATS yet");
    };
    let subject = bus.subjects().inbound(telegram::CHANNEL);
    let kept = body.clone();
    let keep = |reason: String| async move {
        if let Err(err) = bus
            .dead_letter(SERVICE, &subject, None, kept, &reason)
            .await
        {
            tracing::error!(error = %error_chain(&err), "failed to dead-letter a telegram update");
        }
        reason
    };
    let inbound = match telegram::parse_update(&body) {
        Ok(Some(inbound)) => inbound,
        Ok(None) => return answer(StatusCode::OK, "nothing to answer"),
        Err(err) => {
            let reason = keep(err.to_string()).await;
            return answer(StatusCode::BAD_REQUEST, &reason);
        }
    };
    let mut message = inbound.into_message(&config.agent_id);
    if let Err(err) = agentloop_proto::validate_inbound(&mut message, telegram::CHANNEL) {
        // Kept, and answered 200: Telegram would send the same refused update again forever.
        let reason = keep(format!("telegram message refused: {err}")).await;
        return answer(StatusCode::OK, &reason);
    }
    let msg_id = agentloop_proto::inbound_msg_id(&message.session_key, &message.idempotency_key);
    match bus
        .publish_durable(
            bus.subjects().inbound(telegram::CHANNEL),
            &message,
            Some(&msg_id),
        )
        .await
    {
        Ok(()) => answer(StatusCode::OK, "accepted"),
        // Not stored: Telegram sends it again later.
        Err(err) => answer(StatusCode::SERVICE_UNAVAILABLE, &error_chain(&err)),
    }
}

fn answer(status: StatusCode, description: &str) -> Response {
    let body = json!({"ok": status.is_success(), "description": description});
    (status, Json(body)).into_response()
}
