//! Every id the services derive from another: stream message ids (`Nats-Msg-Id`, which makes a
//! retried publish a duplicate the stream drops) and transcript entry keys (which make a
//! repeated write a no-op). Written here once, so two services never spell one id two ways.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use sha2::Digest;

/// The message id of an InboundMessage: one per (session key, idempotency key).
///
/// Session keys hold `:` themselves, so the key's length comes first: without it
/// (`agent`, `main:x:k`) and (`agent:main:x`, `k`) would share an id, and the stream would
/// drop the second as a duplicate of the first.
pub fn inbound_msg_id(session_key: &str, idempotency_key: &str) -> String {
    format!("{}:{session_key}:{idempotency_key}", session_key.len())
}

/// The idempotency key of an inbound message that came without one: its position in the inbound
/// stream, which a redelivery keeps.
pub fn stream_idempotency_key(stream_sequence: u64) -> String {
    format!("inbound-{stream_sequence}")
}

/// The message id of a RunCommand: one per (session, idempotency key).
pub fn run_command_msg_id(session_id: &str, idempotency_key: &str) -> String {
    // A session id is a UUID: fixed length, no `:`, so the pair cannot be read two ways.
    format!("{session_id}:{idempotency_key}")
}

/// Longest message id sent as it is; a longer one is sent as its digest.
const MAX_PLAIN_MSG_ID: usize = 256;

/// Returns message id `id` as a NATS header value can carry it. Ids hold client and model text
/// (idempotency keys, tool call ids), and a header value with a line break makes the NATS
/// client panic rather than refuse it. Such an id, or one past 256 bytes, is sent as the
/// SHA-256 of its text instead: still one id per text, so duplicates are still dropped.
pub fn header_safe_msg_id(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_PLAIN_MSG_ID && !id.chars().any(char::is_control) {
        return Cow::Borrowed(id);
    }
    Cow::Owned(sha256_id(&[id.as_bytes()]))
}

/// `sha256:<hex>` of `parts` one after the other, each preceded by its length (so two ways of
/// cutting the same bytes are two ids).
fn sha256_id(parts: &[&[u8]]) -> String {
    let mut hasher = sha2::Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(7 + 2 * digest.len());
    hex.push_str("sha256:");
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// The message id of the dead letter of a message every replica receives (a core NATS subject
/// without a queue group): one per (subject, payload), so the stream keeps one letter however
/// many replicas refuse the message.
pub fn shared_dead_letter_msg_id(subject: &str, payload: &[u8]) -> String {
    sha256_id(&[subject.as_bytes(), payload])
}

/// A message a run publishes on the outbound stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMessage<'a> {
    /// The run's final reply.
    Final,
    /// The error reply of a run whose input was set aside (a final reply may already be out).
    SetAside,
    /// The refusal of an input its session's full inbox could not take.
    QueueFull,
    /// A message the `send_message` tool sent, by tool call id.
    Sent(&'a str),
    /// Delivery's copy of the final reply on the deliver subject (`true` if it carries no error).
    Delivered(bool),
}

/// The message id of what run `run_id` publishes.
pub fn run_msg_id(run_id: &str, message: RunMessage<'_>) -> String {
    match message {
        RunMessage::Final => format!("{run_id}:final"),
        RunMessage::SetAside => format!("{run_id}:set-aside"),
        RunMessage::QueueFull => format!("{run_id}:queue-full"),
        RunMessage::Sent(call_id) => format!("{run_id}:send:{call_id}"),
        RunMessage::Delivered(ok) => format!("{run_id}:deliver:{ok}"),
    }
}

/// A transcript entry a run writes; its key is unique per run, so a resumed attempt that writes
/// it again changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKey<'a> {
    /// The run's own input.
    Input,
    /// A collected input merged into the run, by inbox seq.
    Collected(i64),
    /// A steering input injected mid-run, by inbox seq.
    Steering(i64),
    /// The model's answer of a turn.
    Answer(u32),
    /// A tool call's result, by turn and call id.
    ToolResult(u32, &'a str),
    /// The summary of a compaction, by attempt.
    Compaction(u32),
}

/// The key of an entry of run `run_id`.
pub fn entry_key(run_id: &str, entry: EntryKey<'_>) -> String {
    format!("{run_id}:{entry}")
}

impl fmt::Display for EntryKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryKey::Input => f.write_str("user"),
            EntryKey::Collected(seq) => write!(f, "user:{seq}"),
            EntryKey::Steering(seq) => write!(f, "s:{seq}"),
            EntryKey::Answer(turn) => write!(f, "t{turn}:a"),
            EntryKey::ToolResult(turn, call_id) => write!(f, "t{turn}:r:{call_id}"),
            EntryKey::Compaction(attempt) => write!(f, "compact:{attempt}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_keep_the_spelling_stored_transcripts_have() {
        // Resumed runs find their own entries by these keys: changing one re-runs work.
        let cases = [
            (EntryKey::Input, "r:user"),
            (EntryKey::Collected(7), "r:user:7"),
            (EntryKey::Steering(8), "r:s:8"),
            (EntryKey::Answer(2), "r:t2:a"),
            (EntryKey::ToolResult(2, "c1"), "r:t2:r:c1"),
            (EntryKey::Compaction(1), "r:compact:1"),
        ];
        for (key, expected) in cases {
            assert_eq!(entry_key("r", key), expected);
        }
    }

    #[test]
    fn message_ids_differ_per_kind_of_message() {
        let ids = [
            run_msg_id("r", RunMessage::Final),
            run_msg_id("r", RunMessage::SetAside),
            run_msg_id("r", RunMessage::QueueFull),
            run_msg_id("r", RunMessage::Sent("c1")),
            run_msg_id("r", RunMessage::Delivered(true)),
            run_msg_id("r", RunMessage::Delivered(false)),
        ];
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        assert_eq!(ids[0], "r:final");
        assert_eq!(inbound_msg_id("cli:a", "k"), "5:cli:a:k");
        assert_eq!(run_command_msg_id("s", "k"), "s:k");
    }

    #[test]
    fn session_keys_with_colons_never_share_a_message_id() {
        // A client that picks both strings cannot make another session's message a duplicate.
        assert_ne!(
            inbound_msg_id("agent", "main:telegram:direct:42:telegram:42:8"),
            inbound_msg_id("agent:main:telegram:direct:42", "telegram:42:8")
        );
    }

    #[test]
    fn ids_holding_line_breaks_or_past_the_cap_become_digests() {
        assert_eq!(header_safe_msg_id("5:cli:a:k"), "5:cli:a:k");
        for id in [
            inbound_msg_id("k", "a\r\nNats-Expected-Stream: x"),
            run_command_msg_id("s", "a\nb"),
            run_msg_id("r", RunMessage::Sent("c\u{7f}1")),
            inbound_msg_id("k", &"x".repeat(300)),
        ] {
            let safe = header_safe_msg_id(&id);
            assert!(safe.starts_with("sha256:") && safe.len() == 71, "{safe}");
            assert!(!safe.chars().any(char::is_control));
        }
        assert_ne!(header_safe_msg_id("a\nb"), header_safe_msg_id("a\nc"));
        assert_eq!(header_safe_msg_id("a\nb"), header_safe_msg_id("a\nb"));
    }

    #[test]
    fn a_shared_dead_letter_is_one_id_per_subject_and_payload() {
        let id = shared_dead_letter_msg_id("p.control.s", b"{bad");
        assert_eq!(id, shared_dead_letter_msg_id("p.control.s", b"{bad"));
        assert!(id.starts_with("sha256:") && header_safe_msg_id(&id) == id);
        assert_ne!(id, shared_dead_letter_msg_id("p.control.t", b"{bad"));
        // The same bytes cut another way are another message.
        assert_ne!(
            shared_dead_letter_msg_id("p.control.sx", b"y"),
            shared_dead_letter_msg_id("p.control.s", b"xy")
        );
    }
}
