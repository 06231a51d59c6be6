//! The client-facing HTTP routes (`/`, `/ws`, `/v1/...`), their shared state and authentication.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::{
    Router,
    http::{HeaderMap, StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::{get, post},
};

use agentloop_bus::Bus;

use crate::guard::{Guard, page_headers};
use crate::limits::Limits;
use crate::principal::Principal;
use crate::{GatewayConfig, RequestError, dispatch::Sessions};

/// The bound on any configured timeout.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// What every client handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    /// Set once the bus is connected; requests before that are refused as unavailable.
    pub(crate) bus: Arc<OnceLock<Bus>>,
    pub(crate) sessions: Sessions,
    pub(crate) config: Arc<GatewayConfig>,
    /// Header checks and the client address behind trusted proxies.
    pub(crate) guard: Arc<Guard>,
    /// Connection caps and the failed-authentication throttle.
    pub(crate) limits: Limits,
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

    /// Returns the longest run timeout or wait a client may ask for.
    pub(crate) fn max_timeout(&self) -> Duration {
        // A year bounds even a configured maximum, so a deadline computed from it cannot overflow.
        Duration::from_millis(self.config.gateway.max_timeout_ms).min(LONGEST_TIMEOUT)
    }

    /// Checks a client's token and returns the principal it stands for; with no token
    /// configured only loopback clients pass, as admins (the single local user). `client` is
    /// the client's address (behind a trusted proxy, the one it forwarded). Failures count
    /// towards the address's throttle.
    ///
    /// # Errors
    /// [`RequestError::Unauthorized`] with the reason, [`RequestError::AuthThrottled`] while the
    /// address waits out its failures.
    pub(crate) fn authorize(
        &self,
        client: IpAddr,
        token: Option<&str>,
    ) -> Result<Principal, RequestError> {
        self.limits.check_auth(client)?;
        let checked = self.check_token(client, token);
        match &checked {
            Ok(_) => self.limits.auth_succeeded(client),
            Err(_) => self.limits.auth_failed(client),
        }
        checked
    }

    fn check_token(&self, client: IpAddr, token: Option<&str>) -> Result<Principal, RequestError> {
        let tokens = &self.config.gateway.tokens;
        if tokens.is_empty() {
            if client.is_loopback() {
                return Ok(Principal::local_admin());
            }
            return Err(RequestError::Unauthorized(
                "no tokens are configured, so only loopback clients are served".into(),
            ));
        }
        match token {
            None | Some("") => Err(RequestError::Unauthorized("a token is required".into())),
            Some(token) => tokens
                .iter()
                .find(|t| constant_time_eq(t.token.expose(), token))
                .map(Principal::of)
                .ok_or_else(|| RequestError::Unauthorized("invalid token".into())),
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
        .route("/chat.js", get(script))
        .route("/chat.css", get(style))
        .route("/ws", get(crate::ws::upgrade))
        .route("/v1/models", get(crate::openai::models))
        .route("/v1/chat/completions", post(crate::openai::completions))
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
