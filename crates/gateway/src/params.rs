//! Reading and checking the params of WebSocket methods.

use std::time::Duration;

use serde::{Deserialize, Deserializer, de::DeserializeOwned};
use serde_json::{Value, json};

use crate::RequestError;
use crate::state::AppState;

/// Refuses a NUL in an identifier: Postgres text cannot hold one, and the storage error it
/// would cause looks retryable when the request never can succeed.
///
/// # Errors
/// [`RequestError::InvalidRequest`] naming the field.
pub(crate) fn no_nul(field: &str, value: &str) -> Result<(), RequestError> {
    if value.contains('\0') {
        return Err(RequestError::InvalidRequest(format!(
            "{field} must not contain a NUL character"
        )));
    }
    Ok(())
}

/// Reads a client's run timeout: `timeoutMs` wins over `timeout` (seconds); none (or a zero
/// `timeout`) is the configured default; longer than `gateway.max_timeout_ms` is cut to it.
///
/// # Errors
/// [`RequestError::InvalidRequest`] for a negative or non-finite `timeout`.
pub(crate) fn client_timeout(
    state: &AppState,
    secs: Option<f64>,
    ms: Option<u64>,
) -> Result<Duration, RequestError> {
    let max = state.max_timeout();
    let asked = match (ms, secs) {
        (Some(ms), _) => Duration::from_millis(ms),
        (None, Some(secs)) if !secs.is_finite() || secs < 0.0 => {
            return Err(RequestError::InvalidRequest(format!(
                "timeout must be a non-negative number of seconds, got {secs}"
            )));
        }
        (None, Some(secs)) if secs > 0.0 => {
            // Past `max` (which also keeps the conversion from overflowing) it is `max`.
            Duration::try_from_secs_f64(secs).unwrap_or(max)
        }
        _ => state.run_timeout(),
    };
    Ok(asked.min(max))
}

pub(crate) fn parse<T: DeserializeOwned>(method: &str, params: Value) -> Result<T, RequestError> {
    let params = if params.is_null() { json!({}) } else { params };
    serde_json::from_value(params)
        .map_err(|e| RequestError::InvalidRequest(format!("invalid params for {method}: {e}")))
}

/// Tells "absent" (`None`) from `null` (`Some(None)`).
pub(crate) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}
