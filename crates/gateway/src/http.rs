//! The client-facing HTTP routes (`/`, `/ws`, `/v1/...`, `/channels/...`) and the web chat page's files; the
//! handlers live in their protocol's module.

use axum::{
    Router,
    http::{StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::{get, post},
};

use crate::guard::page_headers;
use crate::state::AppState;

/// Returns the client routes.
pub(crate) fn routes(state: AppState) -> Router {
    let body_limit = state.config.gateway.max_frame_bytes;
    Router::new()
        .route("/", get(index))
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

async fn index() -> Response {
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
