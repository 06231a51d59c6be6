//! Run events with a per-run sequence number.

use std::sync::atomic::{AtomicU32, Ordering};

use agentloop_bus::Bus;
use agentloop_proto::v1::SystemEvent;
use agentloop_proto::{EventPhase, EventStream};

/// Emits the SystemEvents of one run, numbering them 1, 2, 3, ... (tools running in parallel
/// share it, so numbering is atomic).
pub(crate) struct RunEvents<'a> {
    // Borrowed: a run in flight holds its events for its whole life, and an owned copy of
    // the bus handle alone was 816 bytes of every run's future.
    bus: &'a Bus,
    run_id: &'a str,
    session_id: &'a str,
    session_key: &'a str,
    seq: AtomicU32,
    max_bytes: usize,
}

impl<'a> RunEvents<'a> {
    pub(crate) fn new(
        bus: &'a Bus,
        run_id: &'a str,
        session_id: &'a str,
        session_key: &'a str,
        max_bytes: usize,
    ) -> Self {
        Self {
            bus,
            run_id,
            session_id,
            session_key,
            seq: AtomicU32::new(0),
            max_bytes,
        }
    }

    fn event(&self, stream: EventStream, phase: EventPhase) -> SystemEvent {
        SystemEvent {
            run_id: self.run_id.to_owned(),
            session_key: self.session_key.to_owned(),
            session_id: self.session_id.to_owned(),
            seq: self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            stream: stream.as_str().to_owned(),
            phase: phase.as_str().to_owned(),
            ts: Some(agentloop_proto::now()),
            ..Default::default()
        }
    }

    /// Emits a lifecycle event (`start`, `end` or `error`) with JSON details.
    pub(crate) async fn lifecycle(&self, phase: EventPhase, data: serde_json::Value) {
        let mut event = self.event(EventStream::Lifecycle, phase);
        event.data = data.to_string();
        self.bus.emit_event(&event).await;
    }

    /// Emits a piece of the assistant's answer.
    pub(crate) async fn delta(&self, text: &str) {
        let mut event = self.event(EventStream::Assistant, EventPhase::Delta);
        event.delta = text.to_owned();
        self.bus.emit_event(&event).await;
    }

    /// Emits a tool event (`start`, `update` or `result`).
    pub(crate) async fn tool(
        &self,
        phase: EventPhase,
        name: &str,
        call_id: &str,
        data: serde_json::Value,
    ) {
        let mut event = self.event(EventStream::Tool, phase);
        event.tool_name = name.to_owned();
        event.tool_call_id = call_id.to_owned();
        event.data = data.to_string();
        self.bus.emit_event(&event).await;
    }

    /// Emits a `security` event (`flagged`, `withheld`) with what the scanner found.
    pub(crate) async fn security(&self, phase: EventPhase, data: String) {
        let mut event = self.event(EventStream::Security, phase);
        event.data = data;
        self.bus.emit_event(&event).await;
    }

    /// Emits an approval event on the run's subject and on the operators' approvals subject.
    pub(crate) async fn approval(
        &self,
        phase: EventPhase,
        tool: &str,
        call_id: &str,
        data: String,
    ) {
        let mut event = self.event(EventStream::Approval, phase);
        event.tool_name = tool.to_owned();
        event.tool_call_id = call_id.to_owned();
        event.data = data;
        self.bus.emit_event(&event).await;
        let subject = self.bus.subjects().approvals();
        if let Err(err) = self
            .bus
            .publish_fast(
                subject,
                &event,
                self.bus.config().events_encoding.encoding(),
            )
            .await
        {
            tracing::warn!(error = %agentloop_bus::error_chain(&err), run_id = %event.run_id, "failed to tell operators of an approval event");
        }
    }

    /// Emits a compaction event (`start` or `end`).
    pub(crate) async fn compaction(&self, phase: EventPhase, data: serde_json::Value) {
        let mut event = self.event(EventStream::Compaction, phase);
        event.data = data.to_string();
        self.bus.emit_event(&event).await;
    }

    /// Cuts `text` to the configured event size, on a character boundary.
    pub(crate) fn cap(&self, text: &str) -> String {
        cap(text, self.max_bytes)
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
pub(crate) fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[{} bytes cut]", &text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capping_respects_character_boundaries() {
        assert_eq!(cap("short", 10), "short");
        let capped = cap("ééééé", 3);
        assert!(capped.starts_with('é'));
        assert!(capped.contains("bytes cut"));
    }
}
