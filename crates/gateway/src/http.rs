//! The client-facing HTTP routes (`/`, `/ws`, `/v1/...`, `/channels/...`) and the web chat page's files; the
//! handlers live in their protocol's module.

use std::net::SocketAddr;

use axum::{
    Router,
    extract::{ConnectInfo, FromRequestParts as _, Request, State, ws::WebSocketUpgrade},
    http::{HeaderMap, StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::{get, post},
};

use crate::guard::page_headers;
use crate::state::AppState;

/// Returns the client routes.
pub(crate) fn routes(state: AppState) -> Router {
    let body_limit = state.config.gateway.max_frame_bytes;
    Router::new()
        .route("/", get(root))
        .route("/chat.js", get(script))
        .route("/chat.css", get(style))
        .route("/ws", get(crate::ws::upgrade))
        .route("/v1/models", get(crate::openai::models))
        .route("/v1/chat/completions", post(crate::openai::completions))
        .route("/channels/telegram", post(crate::webhooks::telegram))
        .route("/channels/slack", post(crate::webhooks::slack))
        .route("/channels/webhook/{name}", post(crate::webhooks::webhook))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `/`: the web chat page, or the WebSocket RPC for a client that asks to upgrade (OpenClaw's
/// clients take a gateway URL without a path).
async fn root(State(state): State<AppState>, request: Request) -> Response {
    if !wants_websocket(request.headers()) {
        return index();
    }
    let (mut parts, _body) = request.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &state).await {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let Some(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>().cloned() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    crate::ws::upgrade(ws, peer, State(state), parts.headers).await
}

/// Whether a request asks for a WebSocket (`Upgrade: websocket`, any case).
fn wants_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

fn index() -> Response {
    (
        StatusCode::OK,
        page_headers(),
        Html(include_str!("web/index.html")),
    )
        .into_response()
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("web/chat.js"),
    )
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", include_str!("web/chat.css"))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        page_headers(),
        [(header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response()
}
