//! Decides what to answer: the sticky failure, then the script queue, then directives
//! found in the last user message, then an echo.

use std::time::Duration;

use serde_json::Value;

use crate::request::Message;
use crate::state::{Failure, FakeModelState, ScriptedReply};

/// Which wire protocol a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    OpenAi,
    Anthropic,
}

/// A tool call to answer with; `arguments` is JSON text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlannedCall {
    pub name: String,
    pub arguments: String,
    /// The id to send instead of the numbered one.
    pub id: Option<String>,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub failure: Option<Failure>,
    pub delay: Duration,
    pub chunk_delay: Duration,
    pub text: String,
    pub tool_calls: Vec<PlannedCall>,
}

/// What the fake model reads from a conversation.
#[derive(Debug, Default, PartialEq)]
struct Conversation {
    /// Text of the last user message that carried text.
    last_user_text: String,
    /// Tool result contents that came after that message.
    tool_results: Vec<String>,
}

/// Directives found in a user message, plus the text without them.
#[derive(Debug, Default, PartialEq)]
struct Directives {
    failure: Option<Failure>,
    delay_ms: Option<u64>,
    chunk_delay_ms: Option<u64>,
    reply: Option<String>,
    tools: Vec<PlannedCall>,
    stripped: String,
}

pub(crate) fn plan(state: &FakeModelState, protocol: Protocol, messages: &[Message<'_>]) -> Plan {
    let default_chunk_delay = state.default_chunk_delay();
    if let Some(failure) = state.failure() {
        return Plan::failure(failure, default_chunk_delay);
    }
    if let Some(reply) = state.pop_script() {
        return Plan::from_script(reply, default_chunk_delay);
    }
    let conversation = conversation(protocol, messages);
    let directives = parse_directives(&conversation.last_user_text);
    let mut plan = Plan {
        failure: directives.failure,
        delay: Duration::from_millis(directives.delay_ms.unwrap_or(0)),
        chunk_delay: directives
            .chunk_delay_ms
            .map_or(default_chunk_delay, Duration::from_millis),
        text: String::new(),
        tool_calls: Vec::new(),
    };
    if !conversation.tool_results.is_empty() {
        plan.text = match directives.reply {
            Some(reply) => reply,
            None => format!("tool results: {}", conversation.tool_results.join(" | ")),
        };
    } else if !directives.tools.is_empty() {
        plan.tool_calls = directives.tools;
    } else if let Some(reply) = directives.reply {
        plan.text = reply;
    } else {
        plan.text = format!("echo: {}", directives.stripped);
    }
    plan
}

impl Plan {
    /// Returns a plan that answers with `failure` at once.
    pub(crate) fn failed(failure: Failure) -> Self {
        Self::failure(failure, Duration::ZERO)
    }

    fn failure(failure: Failure, chunk_delay: Duration) -> Self {
        Self {
            failure: Some(failure),
            delay: Duration::ZERO,
            chunk_delay,
            text: String::new(),
            tool_calls: Vec::new(),
        }
    }

    fn from_script(reply: ScriptedReply, default_chunk_delay: Duration) -> Self {
        Self {
            failure: reply.error,
            delay: Duration::from_millis(reply.delay_ms),
            chunk_delay: reply
                .chunk_delay_ms
                .map_or(default_chunk_delay, Duration::from_millis),
            text: reply.text,
            tool_calls: reply
                .tool_calls
                .into_iter()
                .map(|call| PlannedCall {
                    name: call.name,
                    arguments: arguments_text(&call.arguments),
                    id: call.id,
                })
                .collect(),
        }
    }

    /// Returns a rough output token count: words plus a quarter of the argument bytes.
    pub(crate) fn output_tokens(&self) -> u64 {
        let words = self.text.split_whitespace().count();
        let args: usize = self
            .tool_calls
            .iter()
            .map(|c| c.arguments.len() / 4 + 1)
            .sum();
        (words + args).max(1) as u64
    }
}

fn arguments_text(arguments: &Value) -> String {
    if arguments.is_null() {
        "{}".to_owned()
    } else {
        arguments.to_string()
    }
}

/// Reads the conversation from its end: the last user turn with text, and the tool results
/// that came after it (in order). Only the messages from that turn on are parsed.
fn conversation(protocol: Protocol, messages: &[Message<'_>]) -> Conversation {
    let mut conversation = Conversation::default();
    // Collected newest first, reversed at the end.
    let mut results: Vec<String> = Vec::new();
    for message in messages.iter().rev() {
        match (protocol, message.role().as_deref()) {
            (Protocol::OpenAi, Some("tool")) => results.push(content_text(&message.content())),
            (Protocol::OpenAi, Some("user")) => {
                let text = content_text(&message.content());
                // Some clients (OpenClaw) append an internal context envelope as a user
                // message after the real one; the echo is of what the person wrote.
                if text.trim_start().starts_with("<<<BEGIN_") {
                    continue;
                }
                conversation.last_user_text = text;
                break;
            }
            (Protocol::Anthropic, Some("user")) => {
                let content = message.content();
                let Some(blocks) = content.as_array() else {
                    conversation.last_user_text = content_text(&content);
                    break;
                };
                let mut text = Vec::new();
                let mut here = Vec::new();
                for block in blocks {
                    match block.get("type").and_then(Value::as_str) {
                        Some("tool_result") => {
                            here.push(content_text(block.get("content").unwrap_or(&Value::Null)));
                        }
                        Some("text") => {
                            if let Some(t) = block.get("text").and_then(Value::as_str) {
                                text.push(t);
                            }
                        }
                        _ => {}
                    }
                }
                if !text.is_empty() {
                    // A turn with text starts the conversation over, its own results included.
                    conversation.last_user_text = text.join("\n");
                    break;
                }
                results.extend(here.into_iter().rev());
            }
            _ => {}
        }
    }
    results.reverse();
    conversation.tool_results = results;
    conversation
}

/// Returns the text of a message content: a string, or the text parts of an array.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn parse_directives(text: &str) -> Directives {
    let mut directives = Directives::default();
    let mut stripped = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[[") {
        stripped.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match parse_one(after, &mut directives) {
            Some(consumed) => rest = &after[consumed..],
            None => {
                // Not a directive we know: keep it as text.
                stripped.push_str("[[");
                rest = after;
            }
        }
    }
    stripped.push_str(rest);
    directives.stripped = stripped.split_whitespace().collect::<Vec<_>>().join(" ");
    directives
}

/// Parses one directive body (after `[[`); returns the bytes consumed including `]]`.
fn parse_one(after: &str, directives: &mut Directives) -> Option<usize> {
    if let Some(tool) = after.strip_prefix("tool:") {
        return parse_tool(tool, directives).map(|consumed| consumed + "tool:".len());
    }
    let end = after.find("]]")?;
    let inner = &after[..end];
    let (name, value) = inner.split_once(':').unwrap_or((inner, ""));
    match name {
        "fail" => directives.failure = Some(Failure::from_status(value.trim().parse().ok()?)?),
        "overflow" => directives.failure = Some(Failure::Overflow),
        "delay_ms" => directives.delay_ms = Some(value.trim().parse().ok()?),
        "chunk_delay_ms" => directives.chunk_delay_ms = Some(value.trim().parse().ok()?),
        "reply" => directives.reply = Some(value.to_owned()),
        _ => return None,
    }
    Some(end + 2)
}

/// Parses `NAME:{json}]]` or `NAME]]`; the JSON may itself contain `]]`.
fn parse_tool(text: &str, directives: &mut Directives) -> Option<usize> {
    let name_end = text.find([':', ']'])?;
    let name = text[..name_end].trim();
    if name.is_empty() {
        return None;
    }
    let (arguments, consumed) = if text[name_end..].starts_with(':') {
        let json = &text[name_end + 1..];
        let mut values = serde_json::Deserializer::from_str(json).into_iter::<Value>();
        let value = values.next()?.ok()?;
        let offset = values.byte_offset();
        let tail = &json[offset..];
        let trimmed = tail.trim_start();
        (value, name_end + 1 + offset + (tail.len() - trimmed.len()))
    } else {
        (Value::Object(serde_json::Map::new()), name_end)
    };
    if !text[consumed..].starts_with("]]") {
        return None;
    }
    directives.tools.push(PlannedCall {
        name: name.to_owned(),
        arguments: arguments_text(&arguments),
        id: None,
    });
    Some(consumed + 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn directives_are_parsed_and_stripped() {
        let d = parse_directives(
            "hi [[delay_ms:5]] there [[tool:search:{\"q\":[[1]]}]] [[tool:now]] [[unknown]]",
        );
        assert_eq!(d.delay_ms, Some(5));
        assert_eq!(d.tools.len(), 2);
        assert_eq!(d.tools[0].name, "search");
        assert_eq!(d.tools[0].arguments, r#"{"q":[[1]]}"#);
        assert_eq!(d.tools[1].arguments, "{}");
        assert_eq!(d.stripped, "hi there [[unknown]]");
    }

    #[test]
    fn fail_and_reply_directives_are_recognised() {
        let d = parse_directives("[[fail:429]][[reply:NO_REPLY]]");
        assert_eq!(d.failure, Some(Failure::RateLimit));
        assert_eq!(d.reply.as_deref(), Some("NO_REPLY"));
        assert_eq!(
            parse_directives("[[overflow]]").failure,
            Some(Failure::Overflow)
        );
    }

    #[test]
    fn anthropic_tool_results_after_the_user_text_are_collected() {
        let body = json!({"messages": [
            {"role": "user", "content": "go [[tool:a:{}]]"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "a", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "one"},
                                         {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "two"}]}]}
        ]});
        let body = body.to_string();
        let request = crate::request::Request::parse(body.as_bytes()).unwrap();
        let c = conversation(Protocol::Anthropic, &request.messages());
        assert_eq!(c.last_user_text, "go [[tool:a:{}]]");
        assert_eq!(c.tool_results, vec!["one", "two"]);
    }

    #[test]
    fn openai_reads_the_last_user_turn_and_the_tool_results_after_it() {
        let body = json!({"messages": [
            {"role": "user", "content": "first"},
            {"role": "tool", "content": "stale"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]},
            {"role": "assistant", "content": null},
            {"role": "tool", "content": "r1"},
            {"role": "tool", "content": "r2"},
            {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> x"}
        ]})
        .to_string();
        let request = crate::request::Request::parse(body.as_bytes()).unwrap();
        let c = conversation(Protocol::OpenAi, &request.messages());
        assert_eq!(c.last_user_text, "second");
        assert_eq!(c.tool_results, vec!["r1", "r2"]);
    }
}
