//! The wire contract of agentloop: the types generated from `proto/agentloop/v1`, their
//! protobuf/JSON codec (the Content-Type rule of DESIGN.md) and the validation every service
//! applies to what it receives. No I/O.

mod answer;
mod codec;
mod ids;
mod kinds;
mod run_id;
mod status;
mod validate;

pub use answer::{
    NO_REPLY, RECORDED_ANSWER, SENT_BY_TOOL, answer_from_run_text, answer_is_the_runs,
    caller_answer, is_no_reply,
};
pub use codec::{CONTENT_TYPE_JSON, CONTENT_TYPE_PROTO, DecodeError, Encoding, decode, encode};
pub use ids::{
    EntryKey, RunMessage, entry_key, header_safe_msg_id, inbound_msg_id, run_command_msg_id,
    run_msg_id, shared_dead_letter_msg_id, stream_idempotency_key,
};
pub use kinds::{
    ApprovalDecision, ApprovalStatus, AuditSource, ControlAction, DmPolicy, EventPhase,
    EventStream, InboxDirection, InboxKind, QueueMode, RunStatus, SenderAccess, ToolPolicy,
    UnknownWord,
};
pub use run_id::run_id;
pub use status::may_pass;
pub use validate::{Field, ValidationError, refuse_nul, validate_inbound, validate_run_command};

/// Generated protobuf messages and the SessionService gRPC client and server.
#[allow(clippy::all, missing_docs, clippy::unwrap_used)]
pub mod v1 {
    tonic::include_proto!("agentloop.v1");
    include!(concat!(env!("OUT_DIR"), "/agentloop.v1.serde.rs"));
}

/// The InboundMessage metadata key by which a channel asks for the reply while it is being
/// written: the runner then publishes the text so far as a non-final OutboundMessage at most
/// this often (milliseconds), for channels that edit a message in place.
pub const META_STREAM_EVERY_MS: &str = "channel.stream_ms";

/// RunCommand metadata set by the router when the injection scanner flagged the message (and
/// did not block it): its threat level; the runner then shows the model the message wrapped as
/// untrusted content.
pub const META_SECURITY_LEVEL: &str = "security.level";
/// With [`META_SECURITY_LEVEL`]: the attack family of the strongest finding.
pub const META_SECURITY_FAMILY: &str = "security.family";
/// With [`META_SECURITY_LEVEL`]: the rule of the strongest finding.
pub const META_SECURITY_RULE: &str = "security.rule";

/// How long ago `at` was by this host's clock; `None` for a time in the future (two hosts'
/// clocks disagree) or one that is not a time.
pub fn age(at: &pbjson_types::Timestamp) -> Option<std::time::Duration> {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(at.seconds).ok()?,
            u32::try_from(at.nanos).ok()?,
        );
    std::time::SystemTime::now().duration_since(at).ok()
}

/// Returns the current time as a protobuf timestamp.
pub fn now() -> pbjson_types::Timestamp {
    let now = chrono::Utc::now();
    pbjson_types::Timestamp {
        seconds: now.timestamp(),
        nanos: i32::try_from(now.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_past_time_has_an_age_and_a_future_or_broken_one_has_none() {
        let mut past = now();
        past.seconds -= 3;
        let age_of_past = age(&past).unwrap();
        assert!(
            age_of_past >= std::time::Duration::from_secs(3),
            "{age_of_past:?}"
        );
        let mut future = now();
        future.seconds += 60;
        assert_eq!(age(&future), None);
        let broken = pbjson_types::Timestamp {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(age(&broken), None);
    }
}
