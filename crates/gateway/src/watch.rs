//! `sessions.subscribe`: a `sessions.changed` event whenever a run of a session the caller
//! sees starts or ends, so a client (OpenClaw's TUI) refreshes its session list and status
//! without polling. Built on the runs' lifecycle events; an admin sees every session, anyone
//! else only their own (checked with memory once per session and connection).

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentloop_proto::v1::SystemEvent;
use agentloop_proto::{EventPhase, EventStream};

use crate::RequestError;
use crate::feed::Feed;
use crate::frames::Outgoing;
use crate::principal::Principal;
use crate::state::AppState;

/// Sessions one connection remembers the visibility of before it starts over.
const MAX_REMEMBERED: usize = 4096;

/// Answers at once, then sends `sessions.changed` events until the connection closes.
pub(crate) async fn subscribe(
    state: &AppState,
    who: &Principal,
    id: &Value,
    out_tx: &mpsc::Sender<Outgoing>,
    closed: CancellationToken,
) {
    let Some(mut feed) =
        Feed::open(state, id, out_tx, |bus| bus.subjects().all_events(), closed).await
    else {
        return;
    };
    let mut visible: HashMap<String, bool> = HashMap::new();
    while let Some(msg) = feed.next().await {
        let Ok((event, _)) = agentloop_bus::decode::<SystemEvent>(&msg) else {
            continue;
        };
        let Some(change) = Change::of(&event) else {
            continue;
        };
        if !sees(state, who, &mut visible, &event).await {
            continue;
        }
        let changed = Outgoing::Event {
            event: "sessions.changed",
            payload: change.payload(&event),
        };
        if out_tx.send(changed).await.is_err() {
            break;
        }
    }
    feed.close().await;
}

/// Whether `who` sees the session of `event`, asking memory the first time.
async fn sees(
    state: &AppState,
    who: &Principal,
    visible: &mut HashMap<String, bool>,
    event: &SystemEvent,
) -> bool {
    if who.is_admin() {
        return true;
    }
    if let Some(seen) = visible.get(&event.session_id) {
        return *seen;
    }
    let seen = match crate::sessions::session_id(state, who, &event.session_key).await {
        Ok(id) => id == event.session_id,
        Err(RequestError::NotFound(_)) => false,
        // Not remembered: memory may answer next time.
        Err(error) => {
            tracing::debug!(%error, "cannot tell whether a session is the caller's");
            return false;
        }
    };
    if visible.len() >= MAX_REMEMBERED {
        visible.clear();
    }
    visible.insert(event.session_id.clone(), seen);
    seen
}

/// What happened to a session, as `sessions.changed` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    RunStarted,
    RunEnded,
}

impl Change {
    /// The change a run event makes; `None` for events inside a run.
    fn of(event: &SystemEvent) -> Option<Self> {
        if event.is(EventStream::Lifecycle, EventPhase::Start) {
            Some(Self::RunStarted)
        } else if event.ends_run() {
            Some(Self::RunEnded)
        } else {
            None
        }
    }

    fn payload(self, event: &SystemEvent) -> Value {
        let reason = match self {
            Self::RunStarted => "agent.run.started",
            Self::RunEnded => "agent.run.ended",
        };
        let ts = event
            .ts
            .as_ref()
            .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos / 1_000_000));
        json!({
            "sessionKey": event.session_key,
            "sessionId": event.session_id,
            "reason": reason,
            "phase": event.phase,
            "runId": event.run_id,
            "ts": ts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(stream: &str, phase: &str) -> SystemEvent {
        SystemEvent {
            stream: stream.into(),
            phase: phase.into(),
            session_key: "agent:main:main".into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_runs_start_and_end_change_its_session() {
        assert_eq!(
            Change::of(&event("lifecycle", "start")),
            Some(Change::RunStarted)
        );
        assert_eq!(
            Change::of(&event("lifecycle", "end")),
            Some(Change::RunEnded)
        );
        assert_eq!(
            Change::of(&event("lifecycle", "error")),
            Some(Change::RunEnded)
        );
        assert_eq!(Change::of(&event("assistant", "delta")), None);
        let payload = Change::RunEnded.payload(&event("lifecycle", "error"));
        assert_eq!(payload["reason"], "agent.run.ended");
        assert_eq!(payload["sessionKey"], "agent:main:main");
    }
}
