//! Ends a run whose input can never be processed: memory refused its data for good (a value
//! Postgres cannot store, a violated constraint), or it failed on every one of too many
//! attempts. The input is dead-lettered with the reason, the user gets a clear error, and the
//! run is finished without the refused entries so the session answers its next message.

use agentloop_proto::v1::InboxItem;
use agentloop_proto::{RunMessage, RunStatus};

use super::{Owner, RunCtx, RunState, finish};
use crate::error::MemoryCallError;
use crate::replica::SERVICE;
use agentloop_lifecycle::retry;

use crate::backoff;

/// Attempts after which a run that keeps failing is set aside instead of tried again; a crash
/// or a lost lease costs one attempt, so this leaves room for several of them.
pub(super) const MAX_RUN_ATTEMPTS: i32 = 5;

/// Why a run is set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Why {
    /// Memory refused a write of the run for good; the text is memory's answer.
    Refused(String),
    /// The run was attempted this many times without finishing.
    Exhausted(i32),
}

impl Why {
    /// Returns why the input cannot be run, if it has been attempted too often.
    pub(super) fn exhausted(attempts: i32) -> Option<Why> {
        (attempts > MAX_RUN_ATTEMPTS).then_some(Why::Exhausted(attempts - 1))
    }

    /// What the user, the run's events and `runs.error` are told: no database text.
    fn public(&self) -> String {
        match self {
            Why::Refused(_) => "the conversation could not be stored (the database refused its \
                                data), so this message was set aside"
                .to_owned(),
            Why::Exhausted(tries) => {
                format!("the message failed {tries} times and was set aside")
            }
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Refused(detail) => write!(f, "the conversation could not be stored: {detail}"),
            Why::Exhausted(tries) => write!(f, "the run failed on {tries} attempts"),
        }
    }
}

impl RunCtx<'_> {
    /// Dead-letters the input, answers the user with the error and finishes the run as `error`
    /// without any of its unwritten entries; returns whether the lease went back.
    pub(super) async fn set_aside(
        &self,
        owner: Owner<'_>,
        state: &mut RunState,
        item: &InboxItem,
        why: Why,
    ) -> Result<bool, MemoryCallError> {
        tracing::error!(reason = %why, seq = item.seq, "setting the input aside");
        let subject = self.replica.bus.subjects().run(self.session_id);
        let reason = format!("run {}: {why}", self.run.id);
        let kept = retry(
            "dead_letter",
            backoff::PUBLISH,
            |_| true,
            || {
                self.replica.bus.dead_letter(
                    SERVICE,
                    &subject,
                    None,
                    item.payload.clone().into(),
                    &reason,
                )
            },
        )
        .await;
        if let Err(err) = kept {
            // The run's row still records the error, and the inbox row the input.
            tracing::error!(error = %agentloop_bus::error_chain(&err), "could not dead-letter the input");
        }
        // Calls already stored get their synthetic results, so the next run's prompt pairs
        // every call with a result; the refused entries themselves are dropped.
        if let Err(err) = self.close_open_calls(state, RunStatus::Error).await {
            tracing::warn!(error = %err, "could not close the run's open tool calls");
        }
        let outcome = self.outcome(state, RunStatus::Error, String::new(), why.public());
        // A reply may have gone out before the write was refused: this one must not be
        // dropped as its duplicate.
        self.reply_as(&outcome, RunMessage::SetAside).await;
        let released = finish(self.replica, owner, self.run, item, &outcome, Vec::new()).await?;
        self.ended(&outcome, true).await;
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_exhausted_only_past_the_cap() {
        assert_eq!(Why::exhausted(1), None);
        assert_eq!(Why::exhausted(MAX_RUN_ATTEMPTS), None);
        assert_eq!(
            Why::exhausted(MAX_RUN_ATTEMPTS + 1),
            Some(Why::Exhausted(MAX_RUN_ATTEMPTS))
        );
    }

    #[test]
    fn the_public_text_never_carries_the_database_detail() {
        let why = Why::Refused("invalid byte sequence for encoding \"UTF8\": 0x00".to_owned());
        assert!(!why.public().contains("0x00"));
        assert!(why.public().contains("could not be stored"));
        assert!(why.to_string().contains("0x00"));
    }
}
