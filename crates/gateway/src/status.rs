//! What the gateway tells about itself and its agents: `health`, `status`, `agents.list` and
//! `commands.list`, shaped as OpenClaw's answers so its CLI and TUI read them, and the session
//! key defaults OpenClaw clients rely on (`agent:<agentId>:main`).

use serde_json::{Value, json};

use crate::RequestError;
use crate::principal::Principal;
use crate::state::AppState;

use crate::main_key::MAIN_KEY;

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
