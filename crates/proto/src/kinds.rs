//! The closed vocabularies of the wire contract: queue modes, inbox kinds, run statuses, control
//! actions and event streams and phases. They travel as lowercase words (DESIGN.md; a person
//! types them with the NATS CLI) and each is defined here once, word and variant together, so
//! a word no service knows is a decode error, never a silent fallback.

use std::fmt;
use std::str::FromStr;

/// A word that is not one of a vocabulary's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {word:?} (expected {expected})")]
pub struct UnknownWord {
    /// Which vocabulary.
    pub what: &'static str,
    /// The word received.
    pub word: String,
    /// The valid words, for the message.
    pub expected: &'static str,
}

/// Defines an enum whose variants are written on the wire as the given words.
macro_rules! words {
    ($(#[$doc:meta])* $name:ident, $what:literal { $($(#[$vdoc:meta])* $variant:ident = $word:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word written on the wire and in Postgres.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word),+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownWord;

            fn from_str(word: &str) -> Result<Self, UnknownWord> {
                match word {
                    $($word => Ok($name::$variant),)+
                    other => Err(UnknownWord {
                        what: $what,
                        word: other.to_owned(),
                        expected: concat!($($word, " "),+),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let word = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                word.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

words! {
    /// What to do with a message that arrives while its session is running.
    QueueMode, "queue mode" {
        /// Inject at the next safe point of the live run.
        Steer = "steer",
        /// Run after the live run ends.
        Followup = "followup",
        /// Merge queued messages into one follow-up.
        Collect = "collect",
        /// Abort the live run, then run this message.
        Interrupt = "interrupt",
    }
}

// By hand: the vocabulary macro derives the same traits for every enum, and only this one has
// a default.
#[allow(clippy::derivable_impls)]
impl Default for QueueMode {
    fn default() -> Self {
        QueueMode::Followup
    }
}

words! {
    /// How an input waits in a session's inbox: its queue mode, or `user` for a plain input.
    InboxKind, "inbox kind" {
        /// An input with no queue mode of its own.
        User = "user",
        /// Runs after the live run ends.
        Followup = "followup",
        /// Injected at the next safe point of the live run.
        Steer = "steer",
        /// Merged with other queued messages into one follow-up.
        Collect = "collect",
        /// Aborts the live run, then runs.
        Interrupt = "interrupt",
    }
}

impl From<QueueMode> for InboxKind {
    fn from(mode: QueueMode) -> Self {
        match mode {
            QueueMode::Steer => InboxKind::Steer,
            QueueMode::Followup => InboxKind::Followup,
            QueueMode::Collect => InboxKind::Collect,
            QueueMode::Interrupt => InboxKind::Interrupt,
        }
    }
}

words! {
    /// How a run ended (`runs.status`, `FinishRunRequest.status`, the `end` event's reason).
    RunStatus, "run status" {
        /// A final answer was produced.
        Completed = "completed",
        /// The turn budget was used up; the last text is the answer.
        MaxTurns = "max_turns",
        /// The run was aborted.
        Aborted = "aborted",
        /// The run failed.
        Error = "error",
        /// The run hit its timeout.
        Timeout = "timeout",
    }
}

impl RunStatus {
    /// Whether the run produced an answer for the user (its text is the reply).
    pub fn answered(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::MaxTurns)
    }

    /// Whether the run ends with a lifecycle `end` event (otherwise `error`).
    pub fn ends_normally(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::MaxTurns | RunStatus::Aborted
        )
    }
}

words! {
    /// What a `ControlMessage` asks of a session's owner.
    ControlAction, "control action" {
        /// Stop the live run.
        Abort = "abort",
        /// Stop the live run (the `/stop` command's word).
        Stop = "stop",
        /// New input waits: check for steering at the next safe point.
        Wake = "wake",
        /// New input waits and the live run must stop for it.
        Interrupt = "interrupt",
        /// An operator answered one of the run's approval requests: read it now.
        Approval = "approval",
    }
}

words! {
    /// The stream of a `SystemEvent`.
    EventStream, "event stream" {
        /// Run start, end and error.
        Lifecycle = "lifecycle",
        /// The model's text as it streams.
        Assistant = "assistant",
        /// Tool calls.
        Tool = "tool",
        /// History compactions.
        Compaction = "compaction",
        /// Errors outside a run (e.g. a reply that could not be stored).
        Error = "error",
        /// What the injection scanner found (`data`: level, family, rule, origin).
        Security = "security",
        /// A tool call waiting for an operator (`data`: id, tool, arguments, expiresAtMs).
        Approval = "approval",
    }
}

words! {
    /// The phase of a `SystemEvent` within its stream.
    EventPhase, "event phase" {
        /// A run or compaction started; a tool call started.
        Start = "start",
        /// A run ended normally; a compaction ended.
        End = "end",
        /// A run ended with an error.
        Error = "error",
        /// A piece of streamed text.
        Delta = "delta",
        /// A long tool call is still running.
        Update = "update",
        /// A tool call's result.
        Result = "result",
        /// An inbound message was blocked: its run never starts.
        Blocked = "blocked",
        /// A text was passed on wrapped as untrusted.
        Flagged = "flagged",
        /// A tool result was withheld from the model.
        Withheld = "withheld",
        /// A tool call was denied before it ran.
        Denied = "denied",
        /// A tool call waits for an operator's approval.
        Requested = "requested",
        /// An operator (or the timeout) answered an approval request.
        Resolved = "resolved",
    }
}

impl crate::v1::SystemEvent {
    /// Whether this is the event `phase` of `stream`.
    pub fn is(&self, stream: EventStream, phase: EventPhase) -> bool {
        self.stream == stream.as_str() && self.phase == phase.as_str()
    }

    /// Whether this event ends its run: lifecycle `end` or `error`, or the block of the
    /// message the run was for (it never starts).
    pub fn ends_run(&self) -> bool {
        self.is(EventStream::Lifecycle, EventPhase::End)
            || self.is(EventStream::Lifecycle, EventPhase::Error)
            || self.is(EventStream::Security, EventPhase::Blocked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T>(all: &[T])
    where
        T: Copy + PartialEq + fmt::Debug + FromStr<Err = UnknownWord>,
        T: fmt::Display,
    {
        for value in all {
            assert_eq!(value.to_string().parse::<T>(), Ok(*value));
        }
    }

    #[test]
    fn every_word_parses_back_to_its_variant() {
        round_trips(QueueMode::ALL);
        round_trips(InboxKind::ALL);
        round_trips(RunStatus::ALL);
        round_trips(ControlAction::ALL);
        round_trips(EventStream::ALL);
        round_trips(EventPhase::ALL);
        round_trips(DmPolicy::ALL);
        round_trips(SenderAccess::ALL);
        round_trips(ToolPolicy::ALL);
        round_trips(ApprovalStatus::ALL);
        round_trips(ApprovalDecision::ALL);
        round_trips(AuditSource::ALL);
    }

    #[test]
    fn an_unknown_word_is_an_error_naming_the_valid_ones() {
        let err = "later".parse::<QueueMode>().unwrap_err();
        assert_eq!(err.word, "later");
        assert!(err.to_string().contains("steer followup collect interrupt"));
        assert!("Steer".parse::<QueueMode>().is_err(), "words are lowercase");
        assert!("".parse::<RunStatus>().is_err());
    }

    #[test]
    fn configuration_reads_the_same_words_and_refuses_others() {
        let mode: QueueMode = serde_json::from_str("\"collect\"").unwrap();
        assert_eq!(mode, QueueMode::Collect);
        assert_eq!(serde_json::to_string(&mode).unwrap(), "\"collect\"");
        let err = serde_json::from_str::<QueueMode>("\"later\"").unwrap_err();
        assert!(err.to_string().contains("unknown queue mode"), "{err}");
    }

    #[test]
    fn a_run_ends_with_its_lifecycle_end_or_error_only() {
        let event = |stream: &str, phase: &str| crate::v1::SystemEvent {
            stream: stream.to_owned(),
            phase: phase.to_owned(),
            ..Default::default()
        };
        assert!(event("lifecycle", "end").ends_run());
        assert!(event("lifecycle", "error").ends_run());
        assert!(!event("lifecycle", "start").ends_run());
        assert!(!event("tool", "end").ends_run());
        assert!(event("assistant", "delta").is(EventStream::Assistant, EventPhase::Delta));
    }

    #[test]
    fn only_answered_runs_reply_with_their_text() {
        let answered: Vec<_> = RunStatus::ALL.iter().filter(|s| s.answered()).collect();
        assert_eq!(answered, [&RunStatus::Completed, &RunStatus::MaxTurns]);
        assert!(RunStatus::Aborted.ends_normally());
        assert!(!RunStatus::Timeout.ends_normally());
    }
}

words! {
    /// Whether an inbox event is a message into the system or a reply out of it.
    InboxDirection, "inbox direction" {
        /// A message from a channel.
        In = "in",
        /// A reply to a channel.
        Out = "out",
    }
}

words! {
    /// Who may write to an assistant on a chat app's direct messages (`dm_policy`).
    DmPolicy, "dm policy" {
        /// Unknown senders get a pairing code for an operator to approve.
        Pairing = "pairing",
        /// Only senders listed in `allow_from` or paired earlier.
        Allowlist = "allowlist",
        /// Anyone.
        Open = "open",
        /// No direct messages at all.
        Disabled = "disabled",
    }
}

words! {
    /// Whether a sender may write on a direct-message channel (memory's `CheckSender`).
    SenderAccess, "sender access" {
        /// Paired: the message goes on.
        Allowed = "allowed",
        /// Waiting for an operator to approve its pairing code.
        Pending = "pending",
        /// Unknown, and the channel has as many pending codes as it allows.
        Full = "full",
        /// Unknown, and the channel does not pair.
        Refused = "refused",
    }
}

words! {
    /// What an agent's tool policy says about a tool.
    ToolPolicy, "tool policy" {
        /// The call runs.
        Allow = "allow",
        /// The call waits for an operator's approval.
        Ask = "ask",
        /// The call is refused; the model is told.
        Deny = "deny",
    }
}

words! {
    /// Where an approval request stands.
    ApprovalStatus, "approval status" {
        /// Waiting for an operator.
        Pending = "pending",
        /// Approved: the call runs.
        Approved = "approved",
        /// Denied by an operator.
        Denied = "denied",
        /// Nobody answered in time: denied.
        Expired = "expired",
    }
}

words! {
    /// An operator's answer to an approval request (OpenClaw's words).
    ApprovalDecision, "approval decision" {
        /// Run this call.
        AllowOnce = "allow-once",
        /// Run this call and every later call of the tool in the session.
        AllowAlways = "allow-always",
        /// Refuse the call.
        Deny = "deny",
    }
}

words! {
    /// Which part of the guard made a security decision (the audit's `source`).
    AuditSource, "audit source" {
        /// The injection scanner.
        Scanner = "scanner",
        /// The Guardian's review.
        Guardian = "guardian",
        /// Pairing of direct-message senders.
        Pairing = "pairing",
        /// Tool approvals.
        Approval = "approval",
        /// An agent's tool policy.
        Policy = "policy",
    }
}
