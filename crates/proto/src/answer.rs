//! What a request/reply caller receives on its reply subject: the final reply, with a
//! `NO_REPLY` answer turned into an empty text marked as suppressed, so the caller never hangs
//! and never reads the marker. Written once for both senders of that answer (the runner's
//! early answer and delivery's).

use crate::v1::OutboundMessage;

/// The answer by which the model asks for no message to be sent.
pub const NO_REPLY: &str = "NO_REPLY";

/// Returns whether a reply is the model's request to stay silent.
pub fn is_no_reply(text: &str) -> bool {
    text.trim() == NO_REPLY
}

/// Metadata key on a message the `send_message` tool sent (its value is the call id): a message
/// of its own in the conversation, not a glimpse of the reply being written.
pub const SENT_BY_TOOL: &str = "sentByTool";

/// Metadata key the runner sets (to `"true"`) on a reply whose text is its completed run's last
/// assistant entry, unchanged by a hook.
pub const RECORDED_ANSWER: &str = "recordedAnswer";

/// Returns whether the caller's answer to `reply` is the one run `run_id` records: its own
/// completed run's answer, not changed after the run wrote it. Such an answer need not be stored
/// a second time for a repeat of the request: the run's last assistant entry gives it (read
/// through [`answer_from_run_text`]).
pub fn answer_is_the_runs(reply: &OutboundMessage, run_id: &str) -> bool {
    reply.run_id == run_id
        && reply.error.is_empty()
        && reply.metadata.get(RECORDED_ANSWER).map(String::as_str) == Some("true")
}

/// Returns the caller's text for a completed run whose last assistant entry is `entry`: as
/// [`caller_answer`] turns the reply, a `NO_REPLY` becomes empty.
pub fn answer_from_run_text(entry: &str) -> String {
    if is_no_reply(entry) {
        String::new()
    } else {
        entry.to_owned()
    }
}

/// Returns the answer for the caller of a request/reply from the final `reply`.
pub fn caller_answer(reply: &OutboundMessage) -> OutboundMessage {
    let mut answer = reply.clone();
    if reply.error.is_empty() && is_no_reply(&reply.text) {
        answer.text.clear();
        answer
            .metadata
            .insert("suppressed".to_owned(), NO_REPLY.to_owned());
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_reply_is_the_marker_alone() {
        assert!(is_no_reply("NO_REPLY"));
        assert!(is_no_reply("  NO_REPLY\n"));
        assert!(!is_no_reply("NO_REPLY please"));
        assert!(!is_no_reply("no_reply"));
    }

    #[test]
    fn a_silent_answer_reaches_the_caller_empty_and_marked() {
        let reply = OutboundMessage {
            text: " NO_REPLY ".into(),
            r#final: true,
            ..Default::default()
        };
        let answer = caller_answer(&reply);
        assert_eq!(answer.text, "");
        assert_eq!(
            answer.metadata.get("suppressed").map(String::as_str),
            Some(NO_REPLY)
        );
        let spoken = OutboundMessage {
            text: "hello".into(),
            ..Default::default()
        };
        assert_eq!(caller_answer(&spoken), spoken);
        // An error reply keeps its text, whatever it says.
        let failed = OutboundMessage {
            text: "NO_REPLY".into(),
            error: "timeout: slow".into(),
            ..Default::default()
        };
        assert_eq!(caller_answer(&failed).text, "NO_REPLY");
    }

    #[test]
    fn only_a_runs_own_recorded_answer_is_the_runs() {
        let mut reply = OutboundMessage {
            run_id: "r1".into(),
            text: "hello".into(),
            ..Default::default()
        };
        // Unmarked (a hook changed the text, a run stopped by its turn budget, an older
        // runner): stored apart.
        assert!(!answer_is_the_runs(&reply, "r1"));
        reply
            .metadata
            .insert(RECORDED_ANSWER.to_owned(), "true".to_owned());
        assert!(answer_is_the_runs(&reply, "r1"));
        // The message joined another run: that run's answer is not this request's run's.
        assert!(!answer_is_the_runs(&reply, "r2"));
        let failed = OutboundMessage {
            error: "timeout: slow".into(),
            ..reply.clone()
        };
        assert!(!answer_is_the_runs(&failed, "r1"));
        // A silent answer reads the same from the run as the caller got it.
        let silent = caller_answer(&OutboundMessage {
            text: "NO_REPLY".into(),
            ..reply
        });
        assert!(answer_is_the_runs(&silent, "r1"));
        assert_eq!(answer_from_run_text("NO_REPLY"), silent.text);
        assert_eq!(answer_from_run_text("hello"), "hello");
    }
}
