//! What every client handler shares: the bus, memory's session client, the configuration, the
//! guards and limits, and the checks made against them (who a token stands for, which model a
//! principal may choose).

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::{HeaderMap, header};

use agentloop_bus::Bus;

use crate::guard::Guard;
use crate::known::KnownSessions;
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
    /// Sessions each caller has been seen to see.
    pub(crate) known_sessions: Arc<KnownSessions>,
    pub(crate) config: Arc<GatewayConfig>,
    /// Header checks and the client address behind trusted proxies.
    pub(crate) guard: Arc<Guard>,
    /// Connection caps and the failed-authentication throttle.
    pub(crate) limits: Limits,
    /// Cancelled on shutdown: open WebSocket connections close.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
    /// What `/readyz` reports (the whole process in `agentloop all`), for the `health` method.
    pub(crate) health: agentloop_lifecycle::Health,
    /// When the gateway started serving.
    pub(crate) started: std::time::Instant,
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

    /// Checks that `who` may have a run use `model`: an admin any model the allowlist allows
    /// (any, when it is empty), others only listed ones or the default.
    ///
    /// # Errors
    /// [`RequestError::Forbidden`] for a model only an admin may choose,
    /// [`RequestError::InvalidRequest`] for one nobody may.
    pub(crate) fn check_model(&self, who: &Principal, model: &str) -> Result<(), RequestError> {
        let policy = &self.config.models;
        if !policy.allows(model) {
            return Err(RequestError::InvalidRequest(format!(
                "model {model:?} is not in the allowlist"
            )));
        }
        if !who.is_admin() && !policy.listed(model) {
            return Err(RequestError::Forbidden(format!(
                "only an admin may choose model {model:?} (not in models.allowlist)"
            )));
        }
        Ok(())
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
            None | Some("") => Err(RequestError::Unauthorized(crate::error::NO_TOKEN.into())),
            Some(token) => tokens
                .iter()
                .find(|t| constant_time_eq(t.token.expose(), token))
                .map(Principal::of)
                .ok_or_else(|| RequestError::Unauthorized("invalid token".into())),
        }
    }
}

/// Compares without an early exit, so the time taken does not tell how much of a token matched.
pub(crate) fn constant_time_eq(a: &str, b: &str) -> bool {
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
