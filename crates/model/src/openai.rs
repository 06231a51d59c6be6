//! OpenAI Chat Completions: request body and stream decoding.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sse::SseEvent;
use crate::types::{ChatMessage, ChatRequest, StopReason, StreamEvent, ToolCall, ToolSpec, Usage};
use crate::{ModelError, Provider};

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

/// Returns parsed tool arguments, or the raw text as a JSON string when it is not JSON.
pub(crate) fn parse_arguments(raw: String) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(&raw).unwrap_or(Value::String(raw))
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The fields of a `chat.completion.chunk` the decoder reads, borrowed from the event's text
/// where they need no unescaping (a `Value` tree cost an allocation per field of every chunk).
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Default, Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<CallDelta<'a>>>,
}

#[derive(Deserialize)]
struct CallDelta<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// Turns `chat.completion.chunk` events into stream events.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    calls: Vec<PartialCall>,
    stop: Option<StopReason>,
    usage: Usage,
}

impl Decoder {
    /// Handles one SSE event; returns `true` once the stream is complete.
    pub(crate) fn on_event(
        &mut self,
        event: &SseEvent,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<bool, ModelError> {
        if event.data.trim() == "[DONE]" {
            self.finish(out);
            return Ok(true);
        }
        let chunk: Chunk<'_> =
            serde_json::from_str(&event.data).map_err(|err| ModelError::Protocol {
                provider: Provider::OpenAi,
                message: format!("chunk is not a chat.completion.chunk: {err}"),
            })?;
        if let Some(error) = &chunk.error {
            return Err(ModelError::from_stream_error(Provider::OpenAi, error));
        }
        if let Some(usage) = &chunk.usage {
            self.usage.input_tokens = usage.prompt_tokens.unwrap_or(0);
            self.usage.output_tokens = usage.completion_tokens.unwrap_or(0);
        }
        let Some(choice) = chunk.choices.into_iter().flatten().next() else {
            return Ok(false);
        };
        let delta = choice.delta.unwrap_or_default();
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            out.push_back(StreamEvent::TextDelta(text.into_owned()));
        }
        for (position, call) in delta.tool_calls.into_iter().flatten().enumerate() {
            // Some servers omit `index` when they send whole calls.
            let index = call
                .index
                .map_or(self.calls.len() + position, |i| i as usize);
            if self.calls.len() <= index {
                self.calls.resize_with(index + 1, PartialCall::default);
            }
            let partial = &mut self.calls[index];
            if let Some(id) = call.id {
                partial.id.push_str(&id);
            }
            if let Some(function) = call.function {
                if let Some(name) = function.name {
                    partial.name.push_str(&name);
                }
                if let Some(arguments) = function.arguments {
                    partial.arguments.push_str(&arguments);
                }
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.stop = Some(match &*reason {
                "stop" => StopReason::EndTurn,
                "tool_calls" | "function_call" => StopReason::ToolUse,
                "length" => StopReason::MaxTokens,
                other => StopReason::Other(other.to_owned()),
            });
            self.flush_calls(out);
        }
        Ok(false)
    }

    /// Handles the end of the body; a stream that saw a finish reason but no `[DONE]` is accepted.
    pub(crate) fn on_eof(&mut self, out: &mut VecDeque<StreamEvent>) -> Result<(), ModelError> {
        if self.stop.is_none() {
            return Err(ModelError::Protocol {
                provider: Provider::OpenAi,
                message: "stream ended before a finish reason".to_owned(),
            });
        }
        self.finish(out);
        Ok(())
    }

    fn flush_calls(&mut self, out: &mut VecDeque<StreamEvent>) {
        for call in self.calls.drain(..) {
            if call.name.is_empty() && call.arguments.is_empty() {
                continue; // an index gap, not a call
            }
            out.push_back(StreamEvent::ToolCall(ToolCall {
                id: call.id,
                name: call.name,
                arguments: parse_arguments(call.arguments),
            }));
        }
    }

    fn finish(&mut self, out: &mut VecDeque<StreamEvent>) {
        self.flush_calls(out);
        let stop_reason = self.stop.take().unwrap_or(StopReason::EndTurn);
        out.push_back(StreamEvent::Done {
            stop_reason,
            usage: self.usage,
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ModelRef;
    use crate::types::ToolSpec;

    fn decode(chunks: &[&str]) -> (Vec<StreamEvent>, Result<bool, ModelError>) {
        let mut decoder = Decoder::default();
        let mut out = VecDeque::new();
        let mut last = Ok(false);
        for data in chunks {
            let event = SseEvent {
                event: None,
                data: (*data).to_owned(),
            };
            last = decoder.on_event(&event, &mut out);
            if last.is_err() {
                break;
            }
        }
        (out.into_iter().collect(), last)
    }

    #[test]
    fn chunks_with_nulls_escapes_and_a_usage_only_tail_decode() {
        let (events, last) = decode(&[
            r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"delta":{"content":"say \"hi\"\n"}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#,
            "[DONE]",
        ]);
        assert!(matches!(last, Ok(true)));
        assert!(
            matches!(&events[0], StreamEvent::TextDelta(text) if text == "say \"hi\"\n"),
            "{events:?}"
        );
        match &events[1] {
            StreamEvent::Done { stop_reason, usage } => {
                assert_eq!(*stop_reason, StopReason::EndTurn);
                assert_eq!((usage.input_tokens, usage.output_tokens), (12, 3));
            }
            other => panic!("expected the end, got {other:?}"),
        }
    }

    #[test]
    fn an_error_in_the_stream_and_a_malformed_chunk_are_errors() {
        let (_, last) = decode(&[r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#]);
        let err = last.expect_err("an in-stream error");
        assert_eq!(err.kind(), crate::ErrorKind::RateLimit, "{err}");
        let (_, last) = decode(&[r#"{"choices":"#]);
        assert!(matches!(last, Err(ModelError::Protocol { .. })), "{last:?}");
    }

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
