//! Anthropic Messages: request body and stream decoding.

use std::collections::VecDeque;

use serde_json::{Value, json};

use crate::openai::parse_arguments;
use crate::sse::SseEvent;
use crate::types::{
    ChatMessage, ChatRequest, MAX_TOOL_CALLS, StopReason, StreamEvent, ToolCall, Usage,
};
use crate::{ModelError, Provider};

/// Returns the streaming request body.
pub(crate) fn request_body(req: &ChatRequest, default_max_tokens: u32) -> Value {
    // Anthropic wants alternating roles: tool results are user content, and consecutive
    // same-role messages are merged into one message with several blocks.
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::with_capacity(req.messages.len());
    for message in &req.messages {
        let (role, blocks) = match message {
            ChatMessage::User { content } => {
                ("user", vec![json!({"type": "text", "text": content})])
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                let mut blocks = Vec::with_capacity(1 + tool_calls.len());
                if !content.is_empty() {
                    blocks.push(json!({"type": "text", "text": content}));
                }
                for call in tool_calls {
                    blocks.push(json!({
                        "type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(&call.arguments),
                    }));
                }
                ("assistant", blocks)
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let mut block =
                    json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content});
                if *is_error {
                    block["is_error"] = Value::Bool(true);
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut body = json!({
        "model": req.model.model,
        "max_tokens": req.max_tokens.unwrap_or(default_max_tokens),
        "messages": messages,
        "stream": true,
    });
    if let Some(system) = &req.system {
        body["system"] = Value::from(system.as_str());
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|tool| json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters}))
            .collect();
        body["tools"] = Value::Array(tools);
    }
    if let Some(level) = &req.thinking {
        // Anthropic takes a token budget, and max_tokens must leave room for the answer.
        let budget: u32 = match level.as_str() {
            "low" => 1_024,
            "medium" => 4_096,
            _ => 16_384,
        };
        body["thinking"] = serde_json::json!({"type": "enabled", "budget_tokens": budget});
        let max = body["max_tokens"].as_u64().unwrap_or(0);
        if max <= u64::from(budget) {
            body["max_tokens"] = Value::from(budget + 4_096);
        }
    }
    body
}

/// Anthropic requires an object; raw (invalid JSON) arguments are parsed again or dropped.
fn tool_input(arguments: &Value) -> Value {
    match arguments {
        Value::Object(_) => arguments.clone(),
        Value::String(raw) => serde_json::from_str::<Value>(raw)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({})),
        _ => json!({}),
    }
}

#[derive(Debug)]
struct PartialToolUse {
    index: u64,
    id: String,
    name: String,
    json: String,
    initial_input: Value,
}

/// Turns the Messages event sequence into stream events.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    tool_uses: Vec<PartialToolUse>,
    stop: Option<StopReason>,
    usage: Usage,
}

fn protocol(message: String) -> ModelError {
    ModelError::Protocol {
        provider: Provider::Anthropic,
        message,
    }
}

impl Decoder {
    /// Handles one SSE event; returns `true` once the stream is complete.
    pub(crate) fn on_event(
        &mut self,
        event: &SseEvent,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<bool, ModelError> {
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|err| protocol(format!("event is not json: {err}")))?;
        // The `type` in the data is authoritative; `event:` repeats it.
        let kind = data["type"]
            .as_str()
            .or(event.event.as_deref())
            .unwrap_or("");
        match kind {
            "message_start" => {
                let usage = &data["message"]["usage"];
                self.usage.input_tokens = usage["input_tokens"].as_u64().unwrap_or(0);
                self.usage.output_tokens = usage["output_tokens"].as_u64().unwrap_or(0);
            }
            "content_block_start" => {
                let block = &data["content_block"];
                match block["type"].as_str() {
                    Some("tool_use") if self.tool_uses.len() >= MAX_TOOL_CALLS => {
                        return Err(protocol(format!(
                            "more than the {MAX_TOOL_CALLS} tool calls an answer may hold"
                        )));
                    }
                    Some("tool_use") => self.tool_uses.push(PartialToolUse {
                        index: data["index"].as_u64().unwrap_or(0),
                        id: block["id"].as_str().unwrap_or("").to_owned(),
                        name: block["name"].as_str().unwrap_or("").to_owned(),
                        json: String::new(),
                        initial_input: block["input"].clone(),
                    }),
                    Some("text") => {
                        if let Some(text) = block["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push_back(StreamEvent::TextDelta(text.to_owned()));
                        }
                    }
                    _ => {} // thinking and other block kinds are not surfaced
                }
            }
            "content_block_delta" => {
                let delta = &data["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        if let Some(text) = delta["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push_back(StreamEvent::TextDelta(text.to_owned()));
                        }
                    }
                    Some("input_json_delta") => {
                        let index = data["index"].as_u64().unwrap_or(0);
                        let tool_use = self
                            .tool_uses
                            .iter_mut()
                            .find(|t| t.index == index)
                            .ok_or_else(|| {
                                protocol(format!("input_json_delta for unknown block {index}"))
                            })?;
                        tool_use
                            .json
                            .push_str(delta["partial_json"].as_str().unwrap_or(""));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = data["index"].as_u64().unwrap_or(0);
                if let Some(position) = self.tool_uses.iter().position(|t| t.index == index) {
                    let tool_use = self.tool_uses.remove(position);
                    let arguments =
                        if tool_use.json.is_empty() && tool_use.initial_input.is_object() {
                            tool_use.initial_input
                        } else {
                            parse_arguments(tool_use.json)
                        };
                    out.push_back(StreamEvent::ToolCall(ToolCall {
                        id: tool_use.id,
                        name: tool_use.name,
                        arguments,
                    }));
                }
            }
            "message_delta" => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.stop = Some(match reason {
                        "end_turn" => StopReason::EndTurn,
                        "tool_use" => StopReason::ToolUse,
                        "max_tokens" => StopReason::MaxTokens,
                        other => StopReason::Other(other.to_owned()),
                    });
                }
                let usage = &data["usage"];
                if let Some(output) = usage["output_tokens"].as_u64() {
                    self.usage.output_tokens = output;
                }
                if let Some(input) = usage["input_tokens"].as_u64() {
                    self.usage.input_tokens = input;
                }
            }
            "message_stop" => {
                out.push_back(StreamEvent::Done {
                    stop_reason: self.stop.take().unwrap_or(StopReason::EndTurn),
                    usage: self.usage,
                });
                return Ok(true);
            }
            "error" => {
                return Err(ModelError::from_stream_error(
                    Provider::Anthropic,
                    &data["error"],
                ));
            }
            _ => {} // ping and future event types
        }
        Ok(false)
    }

    /// Handles the end of the body: without `message_stop` the answer is incomplete.
    pub(crate) fn on_eof(&mut self, _out: &mut VecDeque<StreamEvent>) -> Result<(), ModelError> {
        Err(protocol("stream ended before message_stop".to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_more_tool_calls_than_the_cap_is_a_protocol_error() {
        let mut decoder = Decoder::default();
        let mut out = VecDeque::new();
        let start = |index: usize| SseEvent {
            event: Some("content_block_start".to_owned()),
            data: json!({"type": "content_block_start", "index": index,
                         "content_block": {"type": "tool_use", "id": format!("t{index}"),
                                           "name": "x", "input": {}}})
            .to_string(),
        };
        for index in 0..MAX_TOOL_CALLS {
            assert!(decoder.on_event(&start(index), &mut out).is_ok());
        }
        let past = decoder.on_event(&start(MAX_TOOL_CALLS), &mut out);
        assert!(
            matches!(&past, Err(ModelError::Protocol { message, .. }) if message.contains("tool calls")),
            "{past:?}"
        );
    }
}
