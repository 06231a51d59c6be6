//! What the load client does with each message it watches: replies on `<prefix>.deliver.>`
//! and `<prefix>.outbound.>`, and run events, matched to the message in flight they answer.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use prost::Message as _;
use tokio::sync::oneshot;

use agentloop_proto::v1::{OutboundMessage, SystemEvent};

use crate::client::{Done, Trace, ts_us, wall_us};

/// A message waiting for its reply.
pub(crate) struct Inflight {
    pub(crate) tag: String,
    pub(crate) expected: String,
    pub(crate) sent: Instant,
    pub(crate) sent_wall: f64,
    pub(crate) first_delta: Option<Instant>,
    pub(crate) done: Option<oneshot::Sender<Done>>,
}

/// The event times of one run, while tracing.
#[derive(Default)]
pub(crate) struct EventTimes {
    pub(crate) start: Option<f64>,
    pub(crate) first_delta: Option<f64>,
    pub(crate) last_delta: Option<f64>,
    pub(crate) end: Option<f64>,
}

/// What the watchers share with the client.
#[derive(Default)]
pub(crate) struct State {
    /// session key -> its one message in flight (sessions send in turn).
    pub(crate) inflight: Mutex<HashMap<String, Inflight>>,
    /// tag -> a burst's message in flight (many per session, so matched by tag).
    pub(crate) burst: Mutex<HashMap<String, Inflight>>,
    /// tag -> when its final reply appeared on `<prefix>.outbound.>`, until delivered.
    pub(crate) outbound_seen: Mutex<HashMap<String, Instant>>,
    /// Whether a bus message's sender is answered by its reply on `<prefix>.outbound.>`
    /// rather than by delivery's copy.
    pub(crate) answer_on_outbound: AtomicBool,
    /// Tags answered on `<prefix>.outbound.>` whose delivered copy is still to come.
    pub(crate) answered: Mutex<HashSet<String>>,
    /// tag -> replies seen.
    pub(crate) replies: Mutex<HashMap<String, u32>>,
    /// Replies seen more than once.
    pub(crate) duplicates: AtomicU64,
    /// Replies that matched no message in flight.
    pub(crate) unexpected: AtomicU64,
    /// run id -> event times, while tracing.
    pub(crate) events: Mutex<HashMap<String, EventTimes>>,
    /// tag -> RunCommand seen, while tracing.
    pub(crate) run_commands: Mutex<HashMap<String, f64>>,
    /// tag -> (run id, trace), while tracing.
    pub(crate) traces: Mutex<HashMap<String, (String, Trace)>>,
    /// Whether hop times are being recorded.
    pub(crate) tracing: AtomicBool,
}

/// The tag of a bench reply's text (`echo: bench <tag>`).
fn reply_tag(text: &str) -> String {
    text.strip_prefix("echo: bench ").unwrap_or(text).to_owned()
}

/// The OutboundMessage a reply carries, in whichever encoding it came.
fn decode_reply(msg: &async_nats::Message) -> Option<OutboundMessage> {
    let content_type = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Content-Type"))
        .map(|v| v.as_str());
    agentloop_proto::decode::<OutboundMessage>(content_type, msg.payload.as_ref())
        .ok()
        .map(|(outbound, _)| outbound)
}

/// Takes the message in flight that `tag`'s reply answers: its session's one message, or a
/// burst's by tag.
fn take_inflight(state: &State, session_key: &str, tag: &str) -> Option<Inflight> {
    let mut inflight = state.inflight.lock().ok()?;
    if inflight.get(session_key).is_some_and(|i| i.tag == tag) {
        return inflight.remove(session_key);
    }
    drop(inflight);
    state.burst.lock().ok().and_then(|mut b| b.remove(tag))
}

/// Hands the waiting sender its outcome: the reply came at `now`, first seen on `outbound.>`
/// at `outbound_seen`.
fn complete(
    mut entry: Inflight,
    reply: &OutboundMessage,
    now: Instant,
    outbound_seen: Option<Instant>,
) {
    let done = Done {
        total: now.duration_since(entry.sent),
        first_delta: entry.first_delta.map(|t| t.duration_since(entry.sent)),
        // Not seen before delivery's copy only if the client fell behind: count it at delivery.
        outbound: Some(outbound_seen.unwrap_or(now).duration_since(entry.sent)),
        text_ok: reply.text == entry.expected && reply.error.is_empty(),
    };
    if let Some(tx) = entry.done.take() {
        let _ = tx.send(done);
    }
}

/// Notes a final reply seen on `<prefix>.outbound.>` (or answers its sender there).
pub(crate) fn on_outbound(state: &State, msg: &async_nats::Message) {
    let now = Instant::now();
    let Some(outbound) = decode_reply(msg) else {
        return;
    };
    if !outbound.r#final {
        return;
    }
    let tag = reply_tag(&outbound.text);
    if state.answer_on_outbound.load(Ordering::Relaxed) {
        let Ok(mut answered) = state.answered.lock() else {
            return;
        };
        // A redelivered copy was answered by the first.
        if answered.contains(&tag) {
            return;
        }
        if let Some(mut entry) = take_inflight(state, &outbound.session_key, &tag) {
            answered.insert(tag);
            drop(answered);
            // The events come on another subscription and may be read after this reply: only
            // the messages whose delta came first would count, so none does in this mode.
            entry.first_delta = None;
            complete(entry, &outbound, now, Some(now));
        }
        return;
    }
    if let Ok(mut seen) = state.outbound_seen.lock() {
        // A redelivered copy keeps the first sighting.
        seen.entry(tag).or_insert(now);
    }
}

/// Matches a delivered reply to its message, counting duplicates and strays.
pub(crate) fn on_reply(state: &State, msg: &async_nats::Message) {
    let delivered_wall = wall_us();
    let now = Instant::now();
    let Some(outbound) = decode_reply(msg) else {
        state.unexpected.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let tag = reply_tag(&outbound.text);
    let outbound_seen = state
        .outbound_seen
        .lock()
        .ok()
        .and_then(|mut s| s.remove(&tag));
    let seen = state
        .replies
        .lock()
        .map(|mut r| {
            let n = r.entry(tag.clone()).or_insert(0);
            *n += 1;
            *n
        })
        .unwrap_or(1);
    if seen > 1 {
        state.duplicates.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if state.answered.lock().is_ok_and(|mut a| a.remove(&tag)) {
        // Its sender was answered on `outbound.>`; this is the delivered copy.
        return;
    }
    let Some(entry) = take_inflight(state, &outbound.session_key, &tag) else {
        state.unexpected.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if state.tracing.load(Ordering::Relaxed) {
        let trace = Trace {
            sent: entry.sent_wall,
            outbound_ts: outbound.ts.as_ref().map(|t| ts_us(t.seconds, t.nanos)),
            delivered: delivered_wall,
            ..Default::default()
        };
        if let Ok(mut traces) = state.traces.lock() {
            traces.insert(tag, (outbound.run_id.clone(), trace));
        }
    }
    complete(entry, &outbound, now, outbound_seen);
}

/// Notes a run event's time (the first delta, and every hop while tracing).
pub(crate) fn on_event(state: &State, msg: &async_nats::Message) {
    let now = Instant::now();
    let Ok(event) = SystemEvent::decode(msg.payload.as_ref()) else {
        return;
    };
    let is_delta = event.stream == "assistant" && event.phase == "delta";
    let ts = event.ts.as_ref().map(|t| ts_us(t.seconds, t.nanos));
    if is_delta
        && let Ok(mut inflight) = state.inflight.lock()
        && let Some(entry) = inflight.get_mut(&event.session_key)
        && entry.first_delta.is_none()
        // A client answered on `outbound.>` has sent its next message before the previous
        // run's last events arrive: a delta made before this message was sent is not its own.
        && ts.is_none_or(|ts| ts >= entry.sent_wall)
    {
        entry.first_delta = Some(now);
    }
    if !state.tracing.load(Ordering::Relaxed) {
        return;
    }
    if let Ok(mut events) = state.events.lock() {
        let times = events.entry(event.run_id.clone()).or_default();
        match (event.stream.as_str(), event.phase.as_str()) {
            ("lifecycle", "start") => times.start = ts,
            ("lifecycle", "end" | "error") => times.end = ts,
            ("assistant", "delta") => {
                if times.first_delta.is_none() {
                    times.first_delta = ts;
                }
                times.last_delta = ts;
            }
            _ => {}
        }
    }
}
