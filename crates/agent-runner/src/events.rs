//! Run events with a per-run sequence number.

use agentloop_bus::Bus;
use agentloop_proto::v1::SystemEvent;

/// Emits the SystemEvents of one run, numbering them 1, 2, 3, ...
pub(crate) struct RunEvents {
    bus: Bus,
    run_id: String,
    session_id: String,
    session_key: String,
    seq: u32,
}

impl RunEvents {
    pub(crate) fn new(bus: Bus, run_id: &str, session_id: &str, session_key: &str) -> Self {
        Self {
            bus,
            run_id: run_id.to_owned(),
            session_id: session_id.to_owned(),
            session_key: session_key.to_owned(),
            seq: 0,
        }
    }

    fn event(&mut self, stream: &str, phase: &str) -> SystemEvent {
        self.seq += 1;
        SystemEvent {
            run_id: self.run_id.clone(),
            session_key: self.session_key.clone(),
            session_id: self.session_id.clone(),
            seq: self.seq,
            stream: stream.to_owned(),
            phase: phase.to_owned(),
            ts: Some(agentloop_proto::now()),
            ..Default::default()
        }
    }

    /// Emits a lifecycle event (`start`, `end` or `error`) with JSON details.
    pub(crate) async fn lifecycle(&mut self, phase: &str, data: serde_json::Value) {
        let mut event = self.event("lifecycle", phase);
        event.data = data.to_string();
        self.bus.emit_event(&event).await;
    }

    /// Emits a piece of the assistant's answer.
    pub(crate) async fn delta(&mut self, text: &str) {
        let mut event = self.event("assistant", "delta");
        event.delta = text.to_owned();
        self.bus.emit_event(&event).await;
    }
}
