//! The client-facing HTTP routes (`/`, `/ws`, `/v1/...`), their shared state and authentication.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::{
    Router,
    http::{HeaderMap, StatusCode, header},
    response::{Html, IntoResponse},
    routing::{get, post},
};

use agentloop_bus::Bus;

use crate::{GatewayConfig, RequestError, dispatch::Sessions};

/// What every client handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    /// Set once the bus is connected; requests before that are refused as unavailable.
    pub(crate) bus: Arc<OnceLock<Bus>>,
    pub(crate) sessions: Sessions,
    pub(crate) config: Arc<GatewayConfig>,
    /// Cancelled on shutdown: open WebSocket connections close.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
}

impl AppState {
    /// Returns the bus.
    ///
    /// # Errors
    /// [`RequestError::Unavailable`] while it is not connected yet.
    pub(crate) fn bus(&self) -> Result<&Bus, RequestError> {
        self.bus
            .get()
            .ok_or_else(|| RequestError::Unavailable("gateway is not connected to NATS yet".into()))
    }

    /// Returns the time a run may take when the client names none.
    pub(crate) fn run_timeout(&self) -> Duration {
        Duration::from_millis(self.config.gateway.run_timeout_ms)
    }

    /// Returns how long a repeated idempotency key gets the first answer.
    pub(crate) fn dispatch_ttl(&self) -> Duration {
        Duration::from_millis(self.config.gateway.dispatch_ttl_ms)
    }

    /// Checks a client's token; with no token configured only loopback clients pass.
    ///
    /// # Errors
    /// [`RequestError::Unauthorized`] with the reason.
    pub(crate) fn authorize(
        &self,
        peer: SocketAddr,
        token: Option<&str>,
    ) -> Result<(), RequestError> {
        let tokens = &self.config.gateway.tokens;
        if tokens.is_empty() {
            if peer.ip().is_loopback() {
                return Ok(());
            }
            return Err(RequestError::Unauthorized(
                "no tokens are configured, so only loopback clients are served".into(),
            ));
        }
        match token {
            None | Some("") => Err(RequestError::Unauthorized("a token is required".into())),
            Some(token) if tokens.iter().any(|t| constant_time_eq(t, token)) => Ok(()),
            Some(_) => Err(RequestError::Unauthorized("invalid token".into())),
        }
    }
}

/// Compares without an early exit, so the time taken does not tell how much of a token matched.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Returns the bearer token of an `Authorization` header.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Returns the client routes.
pub(crate) fn routes(state: AppState) -> Router {
    let body_limit = state.config.gateway.max_frame_bytes;
    Router::new()
        .route("/", get(index))
        .route("/ws", get(crate::ws::upgrade))
        .route("/v1/models", get(crate::openai::models))
        .route("/v1/chat/completions", post(crate::openai::completions))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

async fn index() -> impl IntoResponse {
    (
        StatusCode::OK,
        [(header::CACHE_CONTROL, "no-cache")],
        Html(include_str!("web/index.html")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_equal_only_when_identical() {
        assert!(constant_time_eq("secret", "secret"));
        assert!(!constant_time_eq("secret", "secreT"));
        assert!(!constant_time_eq("secret", "secret2"));
    }

    #[test]
    fn a_bearer_header_yields_its_token() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
