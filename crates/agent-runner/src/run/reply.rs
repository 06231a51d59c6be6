//! The run's reply: what the user reads for each way a run ends, shaped by the
//! `message_sending` hook, marked when the messaging tool already said it, and published before
//! the run is marked finished so a crash in between re-runs into the same message id and the
//! stream drops the duplicate. A caller that asked for an early answer (`reply_early`) gets it
//! on its reply subject first.

use serde_json::json;

use agentloop_proto::v1::OutboundMessage;
use agentloop_proto::{RunMessage, RunStatus, run_msg_id};

use super::{Outcome, RunCtx};
use crate::hooks::HookPoint;
use agentloop_lifecycle::retry;

use crate::backoff;
use crate::tools::SentMessage;

/// What the user reads for a run that ended with `status`.
fn reply_text(outcome: &Outcome) -> String {
    match outcome.status {
        status if status.answered() => outcome.text.clone(),
        RunStatus::Aborted => "Stopped.".to_owned(),
        _ => format!("Sorry, I could not answer: {}", outcome.error),
    }
}

/// The reply's `error` field: empty for an answered run, else `<status>: <error>`.
fn reply_error(outcome: &Outcome) -> String {
    if outcome.status.answered() {
        String::new()
    } else {
        format!("{}: {}", outcome.status, outcome.error)
    }
}

/// Whether the `send_message` tool already sent `text` to `channel` in this run.
fn already_sent(sends: &[SentMessage], channel: &str, text: &str) -> bool {
    sends
        .iter()
        .any(|s| s.channel == channel && s.text.trim() == text.trim())
}

impl RunCtx<'_> {
    /// How often the run's channel wants the reply so far (`None`: only the final one).
    pub(super) fn progress_every(&self) -> Option<std::time::Duration> {
        self.command
            .metadata
            .get(agentloop_proto::META_STREAM_EVERY_MS)
            .and_then(|ms| ms.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis)
    }

    /// Publishes the reply so far as a non-final OutboundMessage (for a channel that edits a
    /// message in place). Not retried: the next one or the final reply supersedes it.
    pub(super) async fn progress(&self, text: &str) {
        if agentloop_proto::NO_REPLY.starts_with(text.trim()) {
            // Perhaps the start of a NO_REPLY: nothing to show yet.
            return;
        }
        let command = self.command;
        let progress = OutboundMessage {
            run_id: self.run.id.clone(),
            session_key: command.session_key.clone(),
            channel: command.channel.clone(),
            recipient: command.sender_id.clone(),
            text: agentloop_scanner::redact::redact(text).into_owned(),
            r#final: false,
            reply_to_id: command.message_id.clone(),
            session_id: self.session_id.to_owned(),
            metadata: command.metadata.clone(),
            ts: Some(agentloop_proto::now()),
            ..Default::default()
        };
        let bus = &self.replica.bus;
        let subject = bus.subjects().outbound(&command.channel);
        if let Err(err) = bus.publish_durable(subject, &progress, None).await {
            tracing::warn!(run_id = %self.run.id, error = %agentloop_bus::error_chain(&err), "the reply so far was not published; the final one follows");
        }
    }

    /// Publishes the run's final reply.
    pub(super) async fn reply(&self, outcome: &Outcome) {
        self.reply_as(outcome, RunMessage::Final).await;
    }

    /// Publishes a final reply under the message id of `message`.
    pub(super) async fn reply_as(&self, outcome: &Outcome, message: RunMessage<'_>) {
        let command = self.command;
        let hooks = &self.replica.hooks;
        let mut text = reply_text(outcome);
        let mut metadata = command.metadata.clone();
        let sending = hooks
            .run(
                HookPoint::MessageSending,
                json!({ "sessionKey": command.session_key, "runId": self.run.id, "text": text }),
            )
            .await;
        let mut recorded = outcome.status == RunStatus::Completed;
        if let Some(rewritten) = sending.text
            && rewritten != text
        {
            text = rewritten;
            recorded = false;
        }
        if recorded {
            // The text is the run's last assistant entry: a gateway answers a repeat of the
            // request from the run instead of storing this text a second time.
            metadata.insert(
                agentloop_proto::RECORDED_ANSWER.to_owned(),
                "true".to_owned(),
            );
        }
        if sending.block {
            metadata.insert(
                "suppressed".to_owned(),
                sending
                    .reason
                    .unwrap_or_else(|| "blocked by a hook".to_owned()),
            );
        }
        if already_sent(&self.sent(), &command.channel, &text) {
            metadata.insert("deliveredByTool".to_owned(), "send_message".to_owned());
        }
        let reply = OutboundMessage {
            run_id: self.run.id.clone(),
            session_key: command.session_key.clone(),
            channel: command.channel.clone(),
            recipient: command.sender_id.clone(),
            text: text.clone(),
            r#final: true,
            reply_to_id: command.message_id.clone(),
            session_id: self.session_id.to_owned(),
            error: reply_error(outcome),
            reply_subject: command.reply_subject.clone(),
            reply_encoding: command.reply_encoding.clone(),
            metadata,
            ts: Some(agentloop_proto::now()),
        };
        let bus = &self.replica.bus;
        if command.reply_early && bus.config().allows_reply_subject(&reply.reply_subject) {
            // The caller takes the first answer: this one saves it the outbound stream and
            // delivery's hop, and delivery's answer after the store covers its loss.
            let answer = agentloop_proto::caller_answer(&reply);
            let encoding = agentloop_proto::Encoding::from_name(&reply.reply_encoding);
            if let Err(err) = bus
                .publish_fast(reply.reply_subject.clone(), &answer, encoding)
                .await
            {
                tracing::warn!(run_id = %self.run.id, error = %agentloop_bus::error_chain(&err), "the early answer was not sent; delivery answers after the store");
            }
        }
        let subject = bus.subjects().outbound(&command.channel);
        let msg_id = run_msg_id(&self.run.id, message);
        let published = retry(
            "publish_reply",
            backoff::PUBLISH,
            |_| true,
            || bus.publish_durable(subject.clone(), &reply, Some(&msg_id)),
        )
        .await;
        match published {
            Ok(()) => {
                hooks
                    .run(HookPoint::MessageSent, json!({ "sessionKey": command.session_key, "runId": self.run.id, "text": text }))
                    .await;
            }
            // Each attempt already waited `bus.publish_retry_ms` for a stream leader.
            Err(err) => {
                tracing::error!(run_id = %self.run.id, session_key = %command.session_key, error = %agentloop_bus::error_chain(&err), "gave up publishing the reply: the outbound stream stored nothing for minutes");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentloop_model::Usage;

    fn ended(status: RunStatus) -> Outcome {
        Outcome {
            status,
            text: "the answer".to_owned(),
            error: "what went wrong".to_owned(),
            model: String::new(),
            provider: String::new(),
            profile: String::new(),
            usage: Usage::default(),
            turns: 1,
            prompt_report: String::new(),
        }
    }

    #[test]
    fn each_end_of_a_run_has_its_reply() {
        // (status, text the user reads, error field)
        let cases = [
            (RunStatus::Completed, "the answer", ""),
            (RunStatus::MaxTurns, "the answer", ""),
            (RunStatus::Aborted, "Stopped.", "aborted: what went wrong"),
            (
                RunStatus::Error,
                "Sorry, I could not answer: what went wrong",
                "error: what went wrong",
            ),
            (
                RunStatus::Timeout,
                "Sorry, I could not answer: what went wrong",
                "timeout: what went wrong",
            ),
        ];
        for (status, text, error) in cases {
            let outcome = ended(status);
            assert_eq!(reply_text(&outcome), text, "{status}");
            assert_eq!(reply_error(&outcome), error, "{status}");
        }
    }

    #[test]
    fn a_text_the_tool_sent_to_the_same_channel_counts_as_sent() {
        let sends = [SentMessage {
            channel: "cli".to_owned(),
            recipient: "alice".to_owned(),
            text: "It is noon. ".to_owned(),
        }];
        assert!(already_sent(&sends, "cli", "It is noon."));
        assert!(!already_sent(&sends, "web", "It is noon."));
        assert!(!already_sent(&sends, "cli", "It is one."));
        assert!(!already_sent(&[], "cli", "It is noon."));
    }
}
