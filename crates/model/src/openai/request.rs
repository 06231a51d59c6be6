//! The Chat Completions request body, written by hand.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;

use crate::types::{ChatMessage, ChatRequest, ToolSpec};

// The request body is written by hand (`request_body`): serde's escaping of every string of a
// long conversation, byte by byte, was 11.5 % of the runner's instructions (callgrind) at one
// session with a full history window.

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ToolFunction<'a>,
}

#[derive(Serialize)]
struct ToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// Tool lists in their request JSON, serialized once each. A runner shares one list (one `Arc`)
/// among all requests of an agent, and serializing its JSON schemas for every request was
/// 2.6 % of the runner's instructions at 100 sessions.
#[derive(Debug, Default)]
pub(crate) struct ToolsJson {
    held: Mutex<Vec<(Arc<[ToolSpec]>, ToolsText)>>,
}

/// A tool list's JSON text, shared by the requests that send it.
type ToolsText = Arc<str>;

impl ToolsJson {
    /// Lists kept; a request with a list not kept serializes it and replaces the oldest.
    const KEPT: usize = 16;

    /// The JSON of `tools` (`None` for no tools).
    pub(crate) fn get(&self, tools: &Arc<[ToolSpec]>) -> Option<ToolsText> {
        if tools.is_empty() {
            return None;
        }
        // Holding the list's `Arc` keeps its address from being reused by another list.
        if let Ok(held) = self.held.lock()
            && let Some((_, json)) = held.iter().find(|(list, _)| Arc::ptr_eq(list, tools))
        {
            return Some(json.clone());
        }
        let functions: Vec<Tool<'_>> = tools
            .iter()
            .map(|tool| Tool {
                kind: "function",
                function: ToolFunction {
                    name: &tool.name,
                    description: &tool.description,
                    parameters: &tool.parameters,
                },
            })
            .collect();
        // Strings and JSON values always serialize.
        let json: ToolsText = serde_json::to_string(&functions).ok()?.into();
        if let Ok(mut held) = self.held.lock() {
            if held.len() >= Self::KEPT {
                held.remove(0);
            }
            held.push((tools.clone(), json.clone()));
        }
        Some(json)
    }
}

/// Returns the streaming request body as JSON text; `tools` is the JSON of `req.tools`
/// ([`ToolsJson`]).
pub(crate) fn request_body(
    req: &ChatRequest,
    tools: Option<&str>,
    default_max_tokens: Option<u32>,
) -> Vec<u8> {
    let texts: usize = req.messages.iter().map(message_len).sum();
    let mut out = Vec::with_capacity(
        256 + texts + req.system.as_ref().map_or(0, String::len) + tools.map_or(0, str::len),
    );
    out.extend_from_slice(b"{\"model\":");
    write_str(&mut out, &req.model.model);
    out.extend_from_slice(b",\"messages\":[");
    let mut first = true;
    let mut open = |out: &mut Vec<u8>, role: &[u8]| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"role\":\"");
        out.extend_from_slice(role);
        out.push(b'"');
    };
    if let Some(system) = &req.system {
        open(&mut out, b"system");
        out.extend_from_slice(b",\"content\":");
        write_str(&mut out, system);
        out.push(b'}');
    }
    for message in &req.messages {
        match message {
            ChatMessage::User { content } => {
                open(&mut out, b"user");
                out.extend_from_slice(b",\"content\":");
                write_str(&mut out, content);
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                open(&mut out, b"assistant");
                out.extend_from_slice(b",\"content\":");
                // Null when a turn is only tool calls.
                if content.is_empty() && !tool_calls.is_empty() {
                    out.extend_from_slice(b"null");
                } else {
                    write_str(&mut out, content);
                }
                if !tool_calls.is_empty() {
                    out.extend_from_slice(b",\"tool_calls\":[");
                    for (i, call) in tool_calls.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(b"{\"id\":");
                        write_str(&mut out, &call.id);
                        out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                        write_str(&mut out, &call.name);
                        out.extend_from_slice(b",\"arguments\":");
                        write_str(&mut out, &arguments_text(&call.arguments));
                        out.extend_from_slice(b"}}");
                    }
                    out.push(b']');
                }
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
                ..
            } => {
                open(&mut out, b"tool");
                out.extend_from_slice(b",\"tool_call_id\":");
                write_str(&mut out, tool_call_id);
                out.extend_from_slice(b",\"content\":");
                write_str(&mut out, content);
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    if let Some(tools) = tools {
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(tools.as_bytes());
    }
    if let Some(max_tokens) = req.max_tokens.or(default_max_tokens) {
        out.extend_from_slice(b",\"max_tokens\":");
        // Writing to a Vec cannot fail.
        let _ = std::io::Write::write_fmt(&mut out, format_args!("{max_tokens}"));
    }
    if let Some(effort) = &req.thinking {
        out.extend_from_slice(b",\"reasoning_effort\":");
        write_str(&mut out, effort);
    }
    out.push(b'}');
    out
}

/// The bytes a message's texts take, to size the body once.
fn message_len(message: &ChatMessage) -> usize {
    match message {
        ChatMessage::User { content } => content.len() + 32,
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => content.len() + 40 + tool_calls.len() * 96,
        ChatMessage::Tool {
            tool_call_id,
            content,
            ..
        } => content.len() + tool_call_id.len() + 48,
    }
}

/// Writes `text` as a JSON string. Text with nothing to escape (nearly all of it) is checked
/// in blocks the compiler turns into vector compares, then copied whole; the rest goes through
/// serde_json, whose output for text without escapes is the same quoted copy.
fn write_str(out: &mut Vec<u8>, text: &str) {
    fn escaped(b: u8) -> bool {
        b < 0x20 || b == b'"' || b == b'\\'
    }
    let bytes = text.as_bytes();
    let mut chunks = bytes.chunks_exact(16);
    let mut needs = false;
    for chunk in &mut chunks {
        needs |= chunk.iter().fold(false, |any, &b| any | escaped(b));
        if needs {
            break;
        }
    }
    needs |= chunks.remainder().iter().any(|&b| escaped(b));
    if needs {
        // Writing to a Vec cannot fail, and a str always serializes.
        let _ = serde_json::to_writer(&mut *out, text);
    } else {
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        out.extend_from_slice(bytes);
        out.push(b'"');
    }
}

/// OpenAI wants arguments as JSON text; a raw string (invalid JSON kept verbatim) goes as is.
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        Value::Null => "{}".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::ToolCall;
    use crate::{ModelRef, Provider};

    /// An OpenAI request for `model` with `messages` and nothing else set.
    fn openai_request(model: &str, messages: Vec<ChatMessage>) -> ChatRequest {
        ChatRequest {
            model: ModelRef {
                provider: Provider::OpenAi,
                model: model.to_owned(),
            },
            system: None,
            messages,
            tools: Arc::from(Vec::new()),
            max_tokens: None,
            thinking: None,
            credential: None,
        }
    }

    /// The body `request_body` writes, parsed.
    fn parsed_body(req: &ChatRequest, tools: Option<&str>, max_tokens: Option<u32>) -> Value {
        serde_json::from_slice(&request_body(req, tools, max_tokens)).unwrap()
    }

    #[test]
    fn the_request_body_has_the_chat_completions_shape() {
        let call = ToolCall {
            id: "call_1".to_owned(),
            name: "search".to_owned(),
            arguments: json!({"q": "rust"}),
        };
        let req = ChatRequest {
            system: Some("be brief".to_owned()),
            tools: Arc::from(vec![ToolSpec {
                name: "search".to_owned(),
                description: "searches".to_owned(),
                parameters: json!({"type": "object"}),
            }]),
            thinking: Some("low".to_owned()),
            ..openai_request(
                "gpt-4o-mini",
                vec![
                    ChatMessage::user("look it up"),
                    ChatMessage::Assistant {
                        content: "".into(),
                        tool_calls: vec![call],
                    },
                    ChatMessage::tool_result("call_1", "found it", false),
                    ChatMessage::Assistant {
                        content: "".into(),
                        tool_calls: Vec::new(),
                    },
                ],
            )
        };
        let cache = ToolsJson::default();
        let tools = cache.get(&req.tools).unwrap();
        let body = parsed_body(&req, Some(&tools), Some(256));
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "look it up"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "search", "arguments": "{\"q\":\"rust\"}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "found it"},
                    {"role": "assistant", "content": ""},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {
                    "name": "search", "description": "searches", "parameters": {"type": "object"}
                }}],
                "max_tokens": 256,
                "reasoning_effort": "low",
            })
        );
    }

    #[test]
    fn strings_are_written_exactly_as_serde_json_writes_them() {
        let long = "a plain sentence, long enough to fill a few blocks of sixteen";
        for text in [
            "",
            "plain",
            long,
            &format!("{long}\""),
            "quote \" and backslash \\ and slash /",
            "tab\tnewline\ncr\rnul\u{0}bell\u{7}del\u{7f}",
            "caf\u{e9} \u{1f600} \u{2028}",
            &format!("{long}{long}\n"),
        ] {
            let mut out = Vec::new();
            write_str(&mut out, text);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn texts_that_need_escapes_survive_the_round_trip() {
        let req = ChatRequest {
            system: Some("line one\nline \"two\"".to_owned()),
            max_tokens: Some(7),
            ..openai_request(
                "m",
                vec![
                    ChatMessage::user("C:\\path\t\u{1}"),
                    ChatMessage::Assistant {
                        content: "".into(),
                        tool_calls: vec![ToolCall {
                            id: "c\"1".to_owned(),
                            name: "run".to_owned(),
                            arguments: Value::String("{not json".to_owned()),
                        }],
                    },
                    ChatMessage::tool_result("c\"1", "out\n", true),
                ],
            )
        };
        let body = parsed_body(&req, None, None);
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "line one\nline \"two\""},
                    {"role": "user", "content": "C:\\path\t\u{1}"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c\"1", "type": "function",
                         "function": {"name": "run", "arguments": "{not json"}}
                    ]},
                    {"role": "tool", "tool_call_id": "c\"1", "content": "out\n"},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 7,
            })
        );
    }

    #[test]
    fn a_tool_list_is_serialized_once_and_no_tools_send_no_field() {
        let spec = |name: &str| ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            parameters: json!({}),
        };
        let cache = ToolsJson::default();
        let first: Arc<[ToolSpec]> = Arc::from(vec![spec("a")]);
        let other: Arc<[ToolSpec]> = Arc::from(vec![spec("b")]);

        let kept = cache.get(&first).unwrap();

        assert!(Arc::ptr_eq(&kept, &cache.get(&first.clone()).unwrap()));
        assert!(cache.get(&other).unwrap().contains(r#""name":"b""#));
        assert!(cache.get(&Arc::from(Vec::new())).is_none());
        let body = parsed_body(
            &openai_request("m", vec![ChatMessage::user("hi")]),
            None,
            None,
        );
        assert!(body.get("tools").is_none(), "{body}");
    }
}
