//! Refuses a RunCommand whose session already has `memory.inbox_max_pending` inputs waiting:
//! memory stored nothing for it, so it is dead-lettered and the user is told, rather than left
//! without an answer. The session itself keeps working; once its inbox drains it takes new
//! input again.

use async_nats::jetstream;

use agentloop_bus::DeadReason;
use serde_json::json;

use agentloop_proto::v1::{OutboundMessage, RunCommand};
use agentloop_proto::{EventPhase, RunMessage, run_msg_id};

use crate::events::RunEvents;
use crate::replica::Replica;
use agentloop_lifecycle::retry;

use crate::backoff;

/// The prefix of the dead-letter reason, for operators filtering the dead-letter stream.
pub(crate) const REASON_PREFIX: &str = "QUEUE_FULL:";

/// The error the user gets, with the cap memory reported (0 when an older memory did not).
pub(crate) fn user_error(cap: u64) -> String {
    if cap > 0 {
        format!(
            "queue_full: this session already has {cap} messages waiting; send this one again once they are answered"
        )
    } else {
        "queue_full: this session already has too many messages waiting; send this one again \
         once they are answered"
            .to_owned()
    }
}

/// The dead-letter reason: starts with [`REASON_PREFIX`] and names the cap.
pub(crate) fn dead_letter_reason(session_id: &str, cap: u64) -> String {
    format!(
        "{REASON_PREFIX} session {session_id} has {cap} inputs pending \
         (memory.inbox_max_pending); the command was not stored"
    )
}

/// Answers the user with the error (and ends the would-be run's event stream, so a gateway
/// caller following events is answered at once), then dead-letters and acks the command.
pub(crate) async fn refuse(
    replica: &Replica,
    msg: jetstream::Message,
    command: &RunCommand,
    cap: u64,
) {
    tracing::warn!(cap, "session inbox full, refusing the run command");
    // The id the run would have had: the gateway follows the run of its message by it.
    let run_id = agentloop_proto::run_id(&command.session_id, &command.idempotency_key);
    let error = user_error(cap);
    let events = RunEvents::new(
        &replica.bus,
        &run_id,
        &command.session_id,
        &command.session_key,
        replica.settings.tool_event_max_bytes,
    );
    events
        .lifecycle(
            EventPhase::Error,
            json!({ "reason": "queue_full", "error": error }),
        )
        .await;
    let message = OutboundMessage {
        run_id: run_id.clone(),
        session_key: command.session_key.clone(),
        channel: command.channel.clone(),
        recipient: command.sender_id.clone(),
        text: error.clone(),
        r#final: true,
        reply_to_id: command.message_id.clone(),
        session_id: command.session_id.clone(),
        error,
        reply_subject: command.reply_subject.clone(),
        reply_encoding: command.reply_encoding.clone(),
        metadata: Default::default(),
        ts: Some(agentloop_proto::now()),
    };
    let subject = replica.bus.subjects().outbound(&command.channel);
    // Its own id: a redelivery refused again is deduplicated by the stream, and it never
    // collides with a reply of a run of the same key accepted later.
    let msg_id = run_msg_id(&run_id, RunMessage::QueueFull);
    let published = retry(
        "publish_queue_full",
        backoff::PUBLISH,
        |_| true,
        || {
            replica
                .bus
                .publish_durable(subject.clone(), &message, Some(&msg_id))
        },
    )
    .await;
    if let Err(err) = published {
        tracing::error!(error = %agentloop_bus::error_chain(&err), "could not tell the user the session's inbox is full");
    }
    replica
        .dead_letters
        .reject(
            &msg,
            DeadReason::QueueFull,
            &dead_letter_reason(&command.session_id, cap),
        )
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_and_the_error_name_the_cap() {
        let reason = dead_letter_reason("s1", 3);
        assert!(reason.starts_with(REASON_PREFIX), "{reason}");
        assert!(reason.contains(" 3 "), "{reason}");
        assert!(user_error(3).starts_with("queue_full: "));
        assert!(user_error(3).contains("3 messages waiting"));
        assert!(user_error(0).starts_with("queue_full: "));
    }
}
