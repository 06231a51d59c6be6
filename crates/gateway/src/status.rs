//! What the gateway tells about itself and its agents: `health`, `status`, `agents.list` and
//! `commands.list`, shaped as OpenClaw's answers so its CLI and TUI read them, and the session
//! key defaults OpenClaw clients rely on (`agent:<agentId>:main`).

use serde_json::{Value, json};

use crate::RequestError;
use crate::principal::Principal;
use crate::state::AppState;

/// The last part of an agent's main session key.
pub(crate) const MAIN_KEY: &str = "main";

/// Milliseconds since the Unix epoch.
/// A wire timestamp in milliseconds since the epoch, as clients read times.
pub(crate) fn timestamp_ms(t: &pbjson_types::Timestamp) -> i64 {
    t.seconds * 1000 + i64::from(t.nanos / 1_000_000)
}

pub(crate) fn millis_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The agent a client gets when it names none: `main` when configured, else the first.
pub(crate) fn default_agent(state: &AppState) -> &str {
    let agents = &state.config.gateway.agents;
    if agents.iter().any(|a| a == "main") {
        "main"
    } else {
        agents.first().map_or("main", String::as_str)
    }
}

/// The main session of `agent` for a caller acting for `principal`, the default when a client
/// names no session: OpenClaw's `agent:<agent>:main` for a caller acting for nobody, and
/// `agent:<agent>:main:<principal>` for one that does. Keys are shared by every caller, and a
/// session belongs to whoever used its key first: one main key for all would be taken by the
/// first principal, and an admin's messages would then land in that principal's session.
pub(crate) fn main_session_key(agent: &str, principal: Option<&str>) -> String {
    match principal {
        None => format!("agent:{agent}:{MAIN_KEY}"),
        Some(principal) => format!("agent:{agent}:{MAIN_KEY}:{principal}"),
    }
}

/// Whether a caller may send to `key`: a main session key ([`main_session_key`]) is only for
/// the principal it belongs to, so no principal can take another's before its first use.
/// Admins may send to every session.
pub(crate) fn may_send_to(key: &str, principal: Option<&str>, admin: bool) -> bool {
    if admin {
        return true;
    }
    let Some((_agent, rest)) = key
        .strip_prefix("agent:")
        .and_then(|rest| rest.split_once(':'))
    else {
        return true;
    };
    match rest.strip_prefix(MAIN_KEY) {
        Some("") => principal.is_none(),
        Some(tail) => match tail.strip_prefix(':') {
            Some(owner) => principal == Some(owner),
            None => true,
        },
        None => true,
    }
}

/// `agents.list`: the configured agents and the defaults a client builds session keys from.
pub(crate) fn agents_list(state: &AppState) -> Value {
    let default = default_agent(state);
    let agents: Vec<Value> = state
        .config
        .gateway
        .agents
        .iter()
        .map(|id| json!({"id": id, "name": id, "kind": "agent"}))
        .collect();
    json!({
        "defaultId": default,
        "mainKey": MAIN_KEY,
        "scope": "per-sender",
        "ownership": "sole",
        "selectionRequired": false,
        "agents": agents,
    })
}

/// `health`: whether every part of this process is ready (`ok`), and what is not.
pub(crate) fn health(state: &AppState) -> Value {
    let started = std::time::Instant::now();
    let (ready, waiting) = state.health.readiness();
    let bus = state.bus().is_ok();
    let default = default_agent(state);
    let agents: Vec<Value> = state
        .config
        .gateway
        .agents
        .iter()
        .map(|id| json!({"agentId": id, "isDefault": id == default}))
        .collect();
    json!({
        "ok": ready && bus,
        "ts": millis_now(),
        "durationMs": started.elapsed().as_millis(),
        "notReady": waiting,
        "bus": {"connected": bus},
        "defaultAgentId": default,
        "agents": agents,
        "channels": {},
        "channelOrder": [],
        "heartbeatSeconds": 0,
    })
}

/// `status`: the gateway's version, uptime and the caller's most recent sessions.
///
/// # Errors
/// Memory's error when the sessions cannot be listed.
/// The params OpenClaw sends (`includeChannelSummary`, ...) only trim its own answer and are
/// not read.
pub(crate) async fn status(state: &AppState, who: &Principal) -> Result<Value, RequestError> {
    let recent = crate::sessions::sessions_list(state, who, json!({"limit": 10})).await?;
    let sessions = recent["sessions"].as_array().cloned().unwrap_or_default();
    Ok(json!({
        "runtimeVersion": env!("CARGO_PKG_VERSION"),
        "server": "agentloop-gateway",
        "pid": std::process::id(),
        "uptimeMs": state.started.elapsed().as_millis(),
        "health": health(state),
        "heartbeat": {"defaultAgentId": default_agent(state), "agents": []},
        "channelSummary": [],
        "queuedSystemEvents": [],
        "sessions": {"count": sessions.len(), "recent": sessions, "defaults": {"agentId": default_agent(state)}},
    }))
}

/// `commands.list`: the text commands a message may be (the router acts on them).
pub(crate) fn commands_list() -> Value {
    json!({"commands": [{
        "name": "stop",
        "nativeName": "stop",
        "textAliases": ["/stop"],
        "description": "Stop the session's live run",
        "category": "session",
        "source": "core",
        "scope": "text",
        "acceptsArgs": false,
    }]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_main_session_key_is_openclaws() {
        assert_eq!(main_session_key("main", None), "agent:main:main");
        assert_eq!(main_session_key("ops", None), "agent:ops:main");
        assert_eq!(
            main_session_key("main", Some("alice")),
            "agent:main:main:alice"
        );
    }

    #[test]
    fn a_main_session_key_is_only_for_its_principal_unless_admin() {
        let alice = Some("alice");
        assert!(may_send_to("agent:main:main:alice", alice, false));
        assert!(!may_send_to("agent:main:main:bob", alice, false));
        assert!(!may_send_to("agent:ops:main", alice, false));
        assert!(may_send_to("agent:main:main", None, false));
        assert!(may_send_to("agent:main:main:bob", alice, true));
        // Other keys are anyone's to use first.
        for key in [
            "agent:main:mainly",
            "agent:main:telegram:default:dm:1",
            "cli:alice",
            "agent:main",
        ] {
            assert!(may_send_to(key, alice, false), "{key}");
        }
    }
}
