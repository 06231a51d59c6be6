//! Chat Completions stream decoding: `chat.completion.chunk` events into stream events.

use std::borrow::Cow;
use std::collections::VecDeque;

use serde::Deserialize;
use serde_json::Value;

use crate::sse::SseEvent;
use crate::types::{MAX_TOOL_CALLS, StopReason, StreamEvent, ToolCall, Usage};
use crate::{ModelError, Provider};

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
            let index = call.index.map_or(Some(self.calls.len() + position), |i| {
                usize::try_from(i).ok()
            });
            let Some(index) = index.filter(|i| *i < MAX_TOOL_CALLS) else {
                return Err(ModelError::Protocol {
                    provider: Provider::OpenAi,
                    message: format!(
                        "tool call index {:?} is past the {MAX_TOOL_CALLS} calls an answer may hold",
                        call.index
                    ),
                });
            };
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
    use super::*;

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
    fn a_tool_call_index_past_the_cap_is_a_protocol_error_not_a_panic_or_an_allocation() {
        for index in [u64::MAX, 1 << 36, MAX_TOOL_CALLS as u64] {
            let chunk = format!(
                r#"{{"choices":[{{"delta":{{"tool_calls":[{{"index":{index},"id":"c","function":{{"name":"x","arguments":"{{}}"}}}}]}}}}]}}"#
            );
            let (_, last) = decode(&[&chunk]);
            assert!(
                matches!(&last, Err(ModelError::Protocol { message, .. }) if message.contains("past")),
                "{index}: {last:?}"
            );
        }
        let last_allowed = MAX_TOOL_CALLS - 1;
        let chunk = format!(
            r#"{{"choices":[{{"delta":{{"tool_calls":[{{"index":{last_allowed},"id":"c","function":{{"name":"x","arguments":"{{}}"}}}}]}}}}]}}"#
        );
        assert!(matches!(decode(&[&chunk]).1, Ok(false)));
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
}
