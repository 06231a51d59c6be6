//! OpenAI Chat Completions: request body and stream decoding.

use std::collections::VecDeque;

use serde_json::{Value, json};

use crate::sse::SseEvent;
use crate::types::{ChatMessage, ChatRequest, StopReason, StreamEvent, ToolCall, Usage};
use crate::{ModelError, Provider};

/// Returns the streaming request body.
pub(crate) fn request_body(req: &ChatRequest, default_max_tokens: Option<u32>) -> Value {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in &req.messages {
        messages.push(match message {
            ChatMessage::User { content } => json!({"role": "user", "content": content}),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } if tool_calls.is_empty() => json!({"role": "assistant", "content": content}),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": arguments_text(&call.arguments)},
                        })
                    })
                    .collect();
                let content = if content.is_empty() {
                    Value::Null
                } else {
                    Value::from(content.as_str())
                };
                json!({"role": "assistant", "content": content, "tool_calls": calls})
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
                ..
            } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}),
        });
    }
    let mut body = json!({
        "model": req.model.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name, "description": tool.description, "parameters": tool.parameters,
                }})
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    if let Some(max_tokens) = req.max_tokens.or(default_max_tokens) {
        body["max_tokens"] = Value::from(max_tokens);
    }
    if let Some(level) = &req.thinking {
        body["reasoning_effort"] = Value::from(level.as_str());
    }
    body
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
        let chunk: Value =
            serde_json::from_str(&event.data).map_err(|err| ModelError::Protocol {
                provider: Provider::OpenAi,
                message: format!("chunk is not json: {err}"),
            })?;
        if let Some(error) = chunk.get("error") {
            return Err(ModelError::from_stream_error(Provider::OpenAi, error));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage.input_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
            self.usage.output_tokens = usage["completion_tokens"].as_u64().unwrap_or(0);
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(false);
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            out.push_back(StreamEvent::TextDelta(text.to_owned()));
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for (position, call) in calls.iter().enumerate() {
                // Some servers omit `index` when they send whole calls.
                let index = call["index"]
                    .as_u64()
                    .map_or(self.calls.len() + position, |i| i as usize);
                if self.calls.len() <= index {
                    self.calls.resize_with(index + 1, PartialCall::default);
                }
                let partial = &mut self.calls[index];
                if let Some(id) = call["id"].as_str() {
                    partial.id.push_str(id);
                }
                if let Some(name) = call["function"]["name"].as_str() {
                    partial.name.push_str(name);
                }
                if let Some(arguments) = call["function"]["arguments"].as_str() {
                    partial.arguments.push_str(arguments);
                }
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.stop = Some(match reason {
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
