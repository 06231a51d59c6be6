//! The conversation the model is sent, rebuilt from the transcript and trimmed to fit the
//! model's window, and the token estimates every part of the context is counted with.

use std::collections::HashSet;

use agentloop_model::{ChatMessage, ToolCall, ToolSpec};

use crate::history::{HistoryEntry, Role};

/// Rough token estimate (about four bytes a token) that errs on the large side for prose.
pub(crate) fn estimate_tokens(text: &str) -> usize {
    text.len() / 4 + 1
}

/// Estimates the tokens of a JSON value by the length of its text, counted without building it
/// (a `to_string` per tool and per call, on every model turn, was an allocation each).
fn json_tokens(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0 / 4 + 1
}

/// Estimates the tokens of the tools' specs.
fn tools_tokens(tools: &[ToolSpec]) -> usize {
    tools
        .iter()
        .map(|t| json_tokens(&t.parameters) + estimate_tokens(&t.description) + 8)
        .sum()
}

fn message_tokens(message: &ChatMessage) -> usize {
    match message {
        ChatMessage::User { content } => estimate_tokens(content) + 4,
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => {
            estimate_tokens(content)
                + tool_calls
                    .iter()
                    .map(|c| json_tokens(&c.arguments) + estimate_tokens(&c.name) + 8)
                    .sum::<usize>()
                + 4
        }
        ChatMessage::Tool { content, .. } => estimate_tokens(content) + 8,
    }
}

/// Estimates the tokens of the conversation alone.
#[cfg(test)]
fn messages_tokens(messages: &[ChatMessage]) -> usize {
    messages.iter().map(message_tokens).sum()
}

/// Estimates the tokens of a whole request.
pub(crate) fn estimate_request(
    messages: &[ChatMessage],
    system: &str,
    tools: &[ToolSpec],
) -> usize {
    estimate_tokens(system)
        + tools_tokens(tools)
        + messages.iter().map(message_tokens).sum::<usize>()
}

/// Returns the message that stands for a compacted stretch of conversation.
pub(crate) fn summary_message(summary: &str) -> ChatMessage {
    ChatMessage::user(format!("[Summary of the earlier conversation]\n{summary}"))
}

/// Rebuilds the conversation from transcript entries. Tool calls that never got a result (a run
/// cut short) get a synthetic one, except those of `open_run`, which is being resumed.
pub(crate) fn conversation(entries: &[HistoryEntry], open_run: &str) -> Vec<ChatMessage> {
    // The latest compaction summary stands for every entry up to the seq it covers.
    let summary = entries.iter().rev().find(|e| e.role == Role::Summary);
    let kept = match summary {
        Some(summary) => {
            let through = serde_json::from_str::<serde_json::Value>(&summary.data)
                .ok()
                .and_then(|d| d["throughSeq"].as_i64())
                .unwrap_or(i64::MIN);
            &entries[entries.partition_point(|e| e.seq <= through)..]
        }
        None => entries,
    };
    // The newest run's tool results are what a follow-up question is likely about; older ones
    // are cut short in what the model is sent (the stored transcript keeps them whole).
    let latest_tool_run = kept
        .iter()
        .rev()
        .find(|e| e.role == Role::Tool && e.run_id != open_run)
        .map_or("", |e| e.run_id.as_str());
    let mut messages = Vec::with_capacity(kept.len() + 1);
    if let Some(summary) = summary {
        messages.push(summary_message(&summary.content));
    }
    // The ids of answered calls are gathered only once an assistant entry with calls shows up:
    // most conversations have none, and this runs for every entry of every run.
    let mut answered: Option<HashSet<&str>> = None;
    for entry in kept {
        match entry.role {
            Role::User => messages.push(match crate::untrusted::Flag::in_entry(&entry.data) {
                Some(flag) => {
                    ChatMessage::user(crate::untrusted::for_model(&entry.content, Some(&flag)))
                }
                // The shared text, not a copy: this runs for every entry of every run.
                None => ChatMessage::user(entry.content.clone()),
            }),
            Role::Assistant => {
                let tool_calls = tool_calls_of(entry);
                let synthetic: Vec<ChatMessage> =
                    if tool_calls.is_empty() || entry.run_id == open_run {
                        Vec::new()
                    } else {
                        let answered = answered.get_or_insert_with(|| {
                            kept.iter()
                                .filter(|e| e.role == Role::Tool)
                                .map(|e| e.tool_call_id.as_str())
                                .collect()
                        });
                        tool_calls
                            .iter()
                            .filter(|c| !answered.contains(c.id.as_str()))
                            .map(|c| {
                                ChatMessage::tool_result(
                                    c.id.clone(),
                                    "skipped: the run ended before this tool ran",
                                    true,
                                )
                            })
                            .collect()
                    };
                messages.push(ChatMessage::Assistant {
                    content: entry.content.clone(),
                    tool_calls,
                });
                messages.extend(synthetic);
            }
            Role::Tool => {
                let is_error = !entry.data.is_empty()
                    && serde_json::from_str::<serde_json::Value>(&entry.data)
                        .map(|d| d["isError"].as_bool().unwrap_or(false))
                        .unwrap_or(false);
                let content = if entry.run_id == open_run || entry.run_id == latest_tool_run {
                    entry.content.clone()
                } else {
                    pruned(&entry.content)
                };
                messages.push(ChatMessage::tool_result(
                    entry.tool_call_id.clone(),
                    content,
                    is_error,
                ));
            }
            Role::Summary | Role::Other => {}
        }
    }
    messages
}

/// A tool result of an earlier run longer than this many characters is cut short.
const PRUNE_OVER_CHARS: usize = 1_000;
/// What is kept of it.
const PRUNED_KEEP_CHARS: usize = 300;

/// An old tool result as the model is sent it: its head, and how much was left out.
fn pruned(content: &std::sync::Arc<str>) -> std::sync::Arc<str> {
    // No more bytes than the limit, no more characters: most results end here, uncounted.
    if content.len() <= PRUNE_OVER_CHARS {
        return content.clone();
    }
    let total = content.chars().count();
    if total <= PRUNE_OVER_CHARS {
        return content.clone();
    }
    let head: String = content.chars().take(PRUNED_KEEP_CHARS).collect();
    format!(
        "{head}\n[… {} more characters of this earlier tool result left out]",
        total - PRUNED_KEEP_CHARS
    )
    .into()
}

/// Returns the tool calls stored with an assistant entry.
pub(crate) fn tool_calls_of(entry: &HistoryEntry) -> Vec<ToolCall> {
    if entry.data.is_empty() {
        return Vec::new();
    }
    serde_json::from_str::<serde_json::Value>(&entry.data)
        .ok()
        .and_then(|d| serde_json::from_value(d["toolCalls"].clone()).ok())
        .unwrap_or_default()
}

/// What [`fit`] did, in estimated tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fitted {
    /// Messages dropped from the front.
    pub(crate) dropped: usize,
    /// The conversation's tokens after the drop.
    pub(crate) messages_tokens: usize,
    /// The whole request's: system prompt, tools and conversation.
    pub(crate) total_tokens: usize,
}

/// Drops the oldest messages until the context fits `budget` tokens, never leaving a tool result
/// without the assistant turn that asked for it. The last message is always kept.
pub(crate) fn fit(
    messages: &mut Vec<ChatMessage>,
    system: &str,
    tools: &[ToolSpec],
    budget: usize,
) -> Fitted {
    let fixed = estimate_tokens(system) + tools_tokens(tools);
    let mut total: usize = fixed + messages.iter().map(message_tokens).sum::<usize>();
    let mut drop = 0;
    while total > budget && drop + 1 < messages.len() {
        total -= message_tokens(&messages[drop]);
        drop += 1;
    }
    // A conversation must not start with tool results or in the middle of a tool exchange.
    while drop + 1 < messages.len() && !matches!(messages[drop], ChatMessage::User { .. }) {
        total -= message_tokens(&messages[drop]);
        drop += 1;
    }
    if drop > 0 {
        tracing::debug!(dropped = drop, "context trimmed to fit the model window");
        messages.drain(..drop);
    }
    Fitted {
        dropped: drop,
        messages_tokens: total - fixed,
        total_tokens: total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(role: &str, content: &str, run: &str) -> HistoryEntry {
        HistoryEntry {
            role: Role::parse(role),
            content: content.into(),
            run_id: run.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_unanswered_tool_call_of_an_ended_run_gets_a_synthetic_result() {
        let mut assistant = entry("assistant", "", "r1");
        assistant.data = r#"{"toolCalls":[{"id":"c1","name":"x","arguments":{}}]}"#.into();
        let entries = vec![entry("user", "hi", "r1"), assistant.clone()];
        let messages = conversation(&entries, "r2");
        assert_eq!(messages.len(), 3);
        assert!(
            matches!(&messages[2], ChatMessage::Tool { tool_call_id, is_error: true, .. } if tool_call_id == "c1")
        );
        let resumed = conversation(&entries, "r1");
        assert_eq!(
            resumed.len(),
            2,
            "the open run's calls are resumed, not skipped"
        );
    }

    #[test]
    fn the_conversation_shares_the_held_texts_instead_of_copying_them() {
        let mut tool = entry("tool", "result", "r1");
        tool.tool_call_id = "c1".into();
        let entries = vec![
            entry("user", "hi", "r1"),
            entry("assistant", "hello", "r1"),
            tool,
        ];

        let messages = conversation(&entries, "r2");

        assert_eq!(messages.len(), 3);
        for (message, entry) in messages.iter().zip(&entries) {
            let (ChatMessage::User { content }
            | ChatMessage::Assistant { content, .. }
            | ChatMessage::Tool { content, .. }) = message;
            assert!(
                std::sync::Arc::ptr_eq(content, &entry.content),
                "{:?} was copied",
                entry.role
            );
        }
    }

    #[test]
    fn long_tool_results_of_older_runs_are_cut_and_the_newest_runs_kept_whole() {
        let call = |run: &str, id: &str| {
            let mut assistant = entry("assistant", "", run);
            assistant.data =
                format!(r#"{{"toolCalls":[{{"id":"{id}","name":"x","arguments":{{}}}}]}}"#);
            assistant
        };
        let result = |run: &str, id: &str, text: &str| HistoryEntry {
            tool_call_id: id.into(),
            ..entry("tool", text, run)
        };
        let long = "y".repeat(5_000);
        let entries = vec![
            entry("user", "search", "r1"),
            call("r1", "c1"),
            result("r1", "c1", &long),
            entry("user", "short one", "r1"),
            call("r1", "c2"),
            result("r1", "c2", "small"),
            entry("user", "again", "r2"),
            call("r2", "c3"),
            result("r2", "c3", &long),
        ];

        let messages = conversation(&entries, "r9");
        let contents: Vec<String> = messages
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Tool { content, .. } => Some(content.to_string()),
                _ => None,
            })
            .collect();

        assert_eq!(contents.len(), 3);
        assert!(contents[0].starts_with(&"y".repeat(300)));
        assert!(
            contents[0].ends_with("[… 4700 more characters of this earlier tool result left out]")
        );
        assert_eq!(contents[1], "small", "a short result stays whole");
        assert_eq!(contents[2], long, "the newest run's result stays whole");
        assert_eq!(
            &*entries[2].content,
            long.as_str(),
            "the transcript is untouched"
        );
    }

    #[test]
    fn the_latest_summary_stands_for_the_entries_it_covers() {
        let mut entries: Vec<HistoryEntry> = (1..=6)
            .map(|seq| HistoryEntry {
                seq,
                ..entry(
                    if seq % 2 == 1 { "user" } else { "assistant" },
                    &format!("e{seq}"),
                    "r",
                )
            })
            .collect();
        entries.insert(
            4,
            HistoryEntry {
                seq: 5,
                data: r#"{"throughSeq":4}"#.into(),
                ..entry("summary", "what came before", "r")
            },
        );
        for entry in &mut entries[5..] {
            entry.seq += 1;
        }

        let messages = conversation(&entries, "r2");

        assert_eq!(
            messages,
            vec![
                summary_message("what came before"),
                ChatMessage::user("e5"),
                ChatMessage::assistant("e6"),
            ]
        );
    }

    #[test]
    fn trimming_keeps_the_newest_and_never_starts_with_a_tool_result() {
        let mut messages = vec![
            ChatMessage::user("x".repeat(4000)),
            ChatMessage::Assistant {
                content: "".into(),
                tool_calls: vec![ToolCall {
                    id: "c".into(),
                    name: "t".into(),
                    arguments: serde_json::json!({}),
                }],
            },
            ChatMessage::tool_result("c", "y".repeat(400), false),
            ChatMessage::user("latest"),
        ];
        let fitted = fit(&mut messages, "system", &[], 200);
        assert_eq!(messages, vec![ChatMessage::user("latest")]);
        assert_eq!(fitted.messages_tokens, messages_tokens(&messages));
        assert_eq!(
            fitted.total_tokens,
            estimate_request(&messages, "system", &[])
        );
    }
}
