//! Where a run starts. Its session's history may already hold some of its own steps: an
//! earlier attempt persisted them and then crashed, lost its lease or was drained. The run
//! continues after its last persisted step instead of doing any of it again. Pure: from the
//! history window and the run's inputs to what the loop starts with.

use agentloop_model::{ChatMessage, ToolCall};

use crate::history::{HistoryEntry, Role};
use crate::prompt;

/// One input of the run: its transcript key, text, and the idempotency key it was sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Input {
    pub(crate) key: String,
    pub(crate) text: String,
    pub(crate) idempotency_key: String,
    /// What the router's scanner found in it, when it let it through.
    pub(crate) flag: Option<crate::untrusted::Flag>,
}

impl Input {
    /// A queued command as an input (its key is the caller's to choose).
    pub(crate) fn of(command: &agentloop_proto::v1::RunCommand) -> Self {
        Self {
            key: String::new(),
            text: command.text.clone(),
            idempotency_key: command.idempotency_key.clone(),
            flag: crate::untrusted::Flag::of(&command.metadata),
        }
    }
}

/// What the loop starts with.
#[derive(Debug)]
pub(crate) struct Start {
    /// The conversation: the history, then the inputs it does not hold yet.
    pub(crate) messages: Vec<ChatMessage>,
    /// How many of `messages` came before this run: what a compaction may summarize.
    pub(crate) prior: usize,
    /// The transcript seq those prior messages reach up to.
    pub(crate) prior_through_seq: i64,
    /// Inputs not in the transcript yet, written with the run's first persisted step.
    pub(crate) unwritten: Vec<Input>,
    /// Model turns an earlier attempt already took.
    pub(crate) turns_done: u32,
    /// Calls of the last persisted answer that have no result: run before the next turn.
    pub(crate) unanswered: Vec<ToolCall>,
}

/// Where run `run_id` with `inputs` starts, given its session's `history` (oldest first).
pub(crate) fn start(history: &[HistoryEntry], run_id: &str, inputs: Vec<Input>) -> Start {
    // This run's entries, if any, are the window's tail: the lease lets one run at a time
    // write, and a resumed run continues its own. Scanning only the tail keeps the work per
    // run independent of the history's length.
    let first_of_run = history.len()
        - history
            .iter()
            .rev()
            .take_while(|e| e.run_id == run_id)
            .count();
    let (before, own) = history.split_at(first_of_run);
    let mut messages = prompt::conversation(history, run_id);
    // A new run has nothing of its own in the history yet, so all of it came before.
    let prior = if own.is_empty() {
        messages.len()
    } else {
        prompt::conversation(before, run_id).len()
    };
    let prior_through_seq = before.iter().map(|e| e.seq).max().unwrap_or(0);
    let unwritten: Vec<Input> = inputs
        .into_iter()
        .filter(|input| !own.iter().any(|e| e.key == input.key))
        .collect();
    messages.extend(
        unwritten
            .iter()
            .map(|i| ChatMessage::user(crate::untrusted::for_model(&i.text, i.flag.as_ref()))),
    );
    let turns_done = own.iter().filter(|e| e.role == Role::Assistant).count() as u32;
    let unanswered = match own.iter().rev().find(|e| e.role == Role::Assistant) {
        Some(last) => {
            let answered: Vec<&str> = history
                .iter()
                .filter(|e| e.role == Role::Tool)
                .map(|e| e.tool_call_id.as_str())
                .collect();
            prompt::tool_calls_of(last)
                .into_iter()
                .filter(|c| !answered.contains(&c.id.as_str()))
                .collect()
        }
        None => Vec::new(),
    };
    Start {
        messages,
        prior,
        prior_through_seq,
        unwritten,
        turns_done,
        unanswered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RUN: &str = "run-2";

    fn entry(seq: i64, run_id: &str, key: &str, role: Role, content: &str) -> HistoryEntry {
        HistoryEntry {
            seq,
            key: format!("{run_id}:{key}"),
            role,
            content: content.into(),
            run_id: run_id.to_owned(),
            ..Default::default()
        }
    }

    fn answer_with_calls(seq: i64, turn: u32, ids: &[&str]) -> HistoryEntry {
        let calls: Vec<_> = ids
            .iter()
            .map(|id| json!({"id": id, "name": "clock", "arguments": {}}))
            .collect();
        HistoryEntry {
            data: json!({ "toolCalls": calls }).to_string(),
            ..entry(seq, RUN, &format!("t{turn}:a"), Role::Assistant, "")
        }
    }

    fn result(seq: i64, turn: u32, id: &str) -> HistoryEntry {
        HistoryEntry {
            tool_call_id: id.to_owned(),
            ..entry(seq, RUN, &format!("t{turn}:r:{id}"), Role::Tool, "12:00")
        }
    }

    /// An earlier run (seq 1–2), then the steps this run may have persisted, in order.
    fn steps() -> Vec<HistoryEntry> {
        vec![
            entry(1, "run-1", "user", Role::User, "hello"),
            entry(2, "run-1", "t1:a", Role::Assistant, "hi"),
            entry(3, RUN, "user", Role::User, "what time is it, and in Paris?"),
            answer_with_calls(4, 1, &["c1", "c2"]),
            result(5, 1, "c1"),
            result(6, 1, "c2"),
            answer_with_calls(7, 2, &["c3"]),
        ]
    }

    fn input() -> Vec<Input> {
        vec![Input {
            key: format!("{RUN}:user"),
            text: "what time is it, and in Paris?".to_owned(),
            idempotency_key: "k-1".to_owned(),
            flag: None,
        }]
    }

    #[test]
    fn a_run_resumes_after_each_persisted_step() {
        // (entries of this run persisted, unwritten inputs, turns done, calls to run first)
        let cases: [(usize, usize, u32, &[&str]); 6] = [
            (0, 1, 0, &[]),
            (1, 0, 0, &[]),
            (2, 0, 1, &["c1", "c2"]),
            (3, 0, 1, &["c2"]),
            (4, 0, 1, &[]),
            (5, 0, 2, &["c3"]),
        ];
        for (persisted, unwritten, turns, calls) in cases {
            let history = &steps()[..2 + persisted];
            let start = start(history, RUN, input());
            assert_eq!(start.unwritten.len(), unwritten, "after {persisted} steps");
            assert_eq!(start.turns_done, turns, "after {persisted} steps");
            let ids: Vec<_> = start.unanswered.iter().map(|c| c.id.as_str()).collect();
            assert_eq!(ids, calls, "after {persisted} steps");
            // The earlier run is what a compaction may summarize, however far this one got.
            assert_eq!(start.prior, 2, "after {persisted} steps");
            assert_eq!(start.prior_through_seq, 2, "after {persisted} steps");
            // The input is in the conversation exactly once: from the history or appended.
            let asked = start
                .messages
                .iter()
                .filter(|m| matches!(m, ChatMessage::User { content } if content.contains("Paris")))
                .count();
            assert_eq!(asked, 1, "after {persisted} steps");
        }
    }

    #[test]
    fn a_new_run_counts_the_whole_history_as_prior() {
        let history = &steps()[..2];
        let start = start(history, RUN, input());
        assert_eq!(start.prior, 2);
        assert_eq!(start.messages.len(), 3, "history and the new input");
        assert_eq!(start.turns_done, 0);
    }

    #[test]
    fn an_empty_session_starts_with_the_input_alone() {
        let start = start(&[], RUN, input());
        assert_eq!(start.prior, 0);
        assert_eq!(start.prior_through_seq, 0);
        assert_eq!(start.messages.len(), 1);
        assert_eq!(start.unwritten, input());
    }
}
