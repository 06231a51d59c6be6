//! The `/ws` handshake, shaped as OpenClaw's gateway protocol so its CLI and TUI connect
//! unmodified: the gateway opens with a `connect.challenge` event (a nonce), the client answers
//! with `connect` (protocol range, token, optionally a device that signed the nonce), and the
//! gateway answers `hello-ok` with what it serves and how often it ticks.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::RequestError;
use crate::device::{self, DeviceProof, SignedFields};
use crate::principal::{Principal, Scope};
use crate::state::AppState;

/// The newest protocol version spoken (OpenClaw 2026.9's).
pub(crate) const PROTOCOL: u32 = 4;
/// The oldest protocol version still answered (OpenClaw's status probe asks for 3..=4).
pub(crate) const OLDEST_PROTOCOL: u32 = 3;
/// The shortest tick interval, whatever is configured: a client's watchdog checks no faster.
const MIN_TICK: Duration = Duration::from_secs(1);

/// The params of `connect`; unknown fields are ignored, since clients send many we do not use.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ConnectParams {
    min_protocol: Option<u32>,
    max_protocol: Option<u32>,
    client: ClientInfo,
    role: String,
    scopes: Vec<String>,
    auth: Auth,
    /// The token at the top level, as agentloop's first clients sent it.
    token: Option<String>,
    device: Option<DeviceProof>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ClientInfo {
    id: String,
    mode: String,
    platform: String,
    device_family: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Auth {
    token: Option<String>,
}

impl ConnectParams {
    /// Reads `connect`'s params.
    ///
    /// # Errors
    /// [`RequestError::InvalidRequest`] for params of the wrong shape.
    pub(crate) fn parse(params: Value) -> Result<Self, RequestError> {
        crate::params::parse("connect", params)
    }

    /// The token the client presents, if any.
    pub(crate) fn token(&self) -> Option<&str> {
        self.auth.token.as_deref().or(self.token.as_deref())
    }

    /// The device's id once its proof over `challenge` holds; `None` when it sent no device.
    ///
    /// # Errors
    /// [`RequestError::Device`] for a proof that does not hold.
    pub(crate) fn device_id(
        &self,
        challenge: &str,
        now_ms: i64,
    ) -> Result<Option<String>, RequestError> {
        let Some(proof) = &self.device else {
            return Ok(None);
        };
        let fields = SignedFields {
            client_id: &self.client.id,
            client_mode: &self.client.mode,
            role: &self.role,
            scopes: &self.scopes,
            token: self.token().unwrap_or_default(),
            platform: &self.client.platform,
            device_family: &self.client.device_family,
        };
        Ok(Some(device::verify(proof, &fields, challenge, now_ms)?))
    }

    /// The protocol version both sides speak: the newest in both ranges. A client that names
    /// no range (agentloop's own) gets the newest.
    ///
    /// # Errors
    /// [`RequestError::ProtocolMismatch`] when the ranges do not meet.
    pub(crate) fn protocol(&self) -> Result<u32, RequestError> {
        negotiate(self.min_protocol, self.max_protocol)
    }
}

/// The newest version in both `[min, max]` and [`OLDEST_PROTOCOL`]`..=`[`PROTOCOL`].
fn negotiate(min: Option<u32>, max: Option<u32>) -> Result<u32, RequestError> {
    let (low, high) = (min.unwrap_or(OLDEST_PROTOCOL), max.unwrap_or(PROTOCOL));
    let chosen = high.min(PROTOCOL);
    if low > high || chosen < low.max(OLDEST_PROTOCOL) {
        return Err(RequestError::ProtocolMismatch {
            min: low,
            max: high,
            oldest: OLDEST_PROTOCOL,
            newest: PROTOCOL,
        });
    }
    Ok(chosen)
}

/// The interval between `tick` events.
pub(crate) fn tick_interval(state: &AppState) -> Duration {
    Duration::from_millis(state.config.gateway.tick_interval_ms).max(MIN_TICK)
}

/// OpenClaw's names of a principal's scopes.
fn operator_scopes(who: &Principal) -> Vec<&'static str> {
    [
        (Scope::Admin, "operator.admin"),
        (Scope::Read, "operator.read"),
        (Scope::Write, "operator.write"),
    ]
    .into_iter()
    .filter(|(scope, _)| who.require(*scope).is_ok())
    .map(|(_, name)| name)
    .collect()
}

/// What the gateway is and serves, for one connection.
pub(crate) struct Hello<'a> {
    pub(crate) state: &'a AppState,
    pub(crate) who: &'a Principal,
    pub(crate) conn_id: &'a str,
    pub(crate) protocol: u32,
    pub(crate) device_id: Option<&'a str>,
}

impl Hello<'_> {
    /// The `hello-ok` payload: OpenClaw's fields, and agentloop's limits in `policy`.
    pub(crate) fn payload(&self) -> Value {
        let settings = &self.state.config.gateway;
        let now = crate::status::millis_now();
        let mut auth = json!({"role": "operator", "scopes": operator_scopes(self.who), "method": if settings.tokens.is_empty() { "none" } else { "token" }});
        if let Some(id) = self.device_id {
            auth["deviceId"] = json!(id);
        }
        let default_agent = crate::status::default_agent(self.state);
        json!({
            "type": "hello-ok",
            "protocol": self.protocol,
            "server": {"name": "agentloop-gateway", "version": env!("CARGO_PKG_VERSION"), "connId": self.conn_id},
            "features": {"methods": crate::methods::METHODS, "events": crate::methods::EVENTS},
            "snapshot": {
                "presence": [],
                "health": {"ok": true, "ts": now},
                "stateVersion": {"presence": 0, "health": 0},
                "uptimeMs": self.state.started.elapsed().as_millis(),
                "sessionDefaults": {
                    "defaultAgentId": default_agent,
                    "mainKey": crate::main_key::MAIN_KEY,
                    "mainSessionKey": crate::main_key::main_session_key(default_agent, self.who.name()),
                    "scope": "per-sender",
                },
            },
            "auth": auth,
            "policy": {
                "maxPayload": settings.max_frame_bytes,
                "maxBufferedBytes": settings.max_frame_bytes.saturating_mul(2),
                "tickIntervalMs": tick_interval(self.state).as_millis(),
                "maxFrameBytes": settings.max_frame_bytes,
                "rateLimitPerSec": settings.rate_limit_per_sec,
                "rateLimitBurst": settings.rate_limit_burst,
                "maxTimeoutMs": settings.max_timeout_ms,
                "maxHistoryLimit": crate::history::MAX_LIMIT,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_common_version_is_chosen() {
        assert_eq!(negotiate(None, None).unwrap(), PROTOCOL);
        assert_eq!(negotiate(Some(4), Some(4)).unwrap(), 4);
        assert_eq!(negotiate(Some(3), Some(9)).unwrap(), PROTOCOL);
        assert_eq!(negotiate(Some(1), Some(3)).unwrap(), 3);
    }

    #[test]
    fn ranges_that_do_not_meet_are_a_protocol_mismatch() {
        for (min, max) in [(5, 5), (1, 2), (4, 3)] {
            let refused = negotiate(Some(min), Some(max)).unwrap_err();
            assert!(
                matches!(refused, RequestError::ProtocolMismatch { min: m, max: x, .. } if m == min && x == max),
                "{refused:?}"
            );
            assert_eq!(refused.details().unwrap()["code"], "PROTOCOL_MISMATCH");
        }
    }

    #[test]
    fn a_device_must_sign_the_connections_challenge() {
        let params = ConnectParams::parse(json!({
            "auth": {"token": "t"},
            "device": {"id": "x", "publicKey": "AAAA", "signature": "AAAA", "signedAt": 1, "nonce": "n"},
        }))
        .unwrap();
        let refused = params.device_id("n", 1).unwrap_err();
        assert!(matches!(refused, RequestError::Device(_)), "{refused:?}");
        assert_eq!(refused.code(), "INVALID_REQUEST");
        assert!(
            ConnectParams::default()
                .device_id("n", 1)
                .unwrap()
                .is_none()
        );
    }
}
