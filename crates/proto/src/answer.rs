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
}
