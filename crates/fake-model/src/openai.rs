//! OpenAI Chat Completions rendering: JSON completions, `chat.completion.chunk` SSE, errors.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::plan::{Plan, PlannedCall};
use crate::state::Failure;
use crate::wire::{
    ReplyContext, argument_pieces, json_response, sse_frame, sse_response, text_pieces, unix_now,
};

/// Returns the error response for `failure` in OpenAI's shape. Like the real API, an auth
/// error names the key it was given, so tests can check that clients keep it out of sight.
pub(crate) fn error(failure: Failure, presented_key: Option<&str>) -> Response {
    let auth_message;
    let (message, kind, code) = match failure {
        Failure::Auth => {
            auth_message = match presented_key {
                Some(key) => format!(
                    "Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys."
                ),
                None => "You didn't provide an API key.".to_owned(),
            };
            (
                auth_message.as_str(),
                "invalid_request_error",
                Some("invalid_api_key"),
            )
        }
        Failure::RateLimit => (
            "Rate limit reached for requests. Please try again in 1s.",
            "requests",
            Some("rate_limit_exceeded"),
        ),
        Failure::Server => (
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
            None,
        ),
        Failure::Overflow => (
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            Some("context_length_exceeded"),
        ),
        Failure::UnsupportedThinking => (
            "Unsupported value: 'reasoning_effort' does not support this level with this model.",
            "invalid_request_error",
            Some("unsupported_value"),
        ),
    };
    let status =
        StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    json_response(status, &body)
}

/// Returns a 400 for a malformed request, in OpenAI's shape.
pub(crate) fn bad_request(message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}});
    json_response(StatusCode::BAD_REQUEST, &body)
}

fn call_id(ctx: &ReplyContext, index: usize, call: &PlannedCall) -> String {
    call.id
        .clone()
        .unwrap_or_else(|| format!("call_fake_{}_{index}", ctx.id))
}

fn finish_reason(plan: &Plan) -> &'static str {
    if plan.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn usage(ctx: &ReplyContext, plan: &Plan) -> Value {
    let output = plan.output_tokens();
    json!({
        "prompt_tokens": ctx.input_tokens,
        "completion_tokens": output,
        "total_tokens": ctx.input_tokens + output,
    })
}

/// Returns a non-streaming `chat.completion`.
pub(crate) fn complete(plan: &Plan, ctx: &ReplyContext) -> Response {
    let mut message = json!({
        "role": "assistant",
        "content": if plan.text.is_empty() && !plan.tool_calls.is_empty() { Value::Null } else { Value::from(plan.text.as_str()) },
    });
    if !plan.tool_calls.is_empty() {
        let calls: Vec<Value> = plan
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                json!({
                    "id": call_id(ctx, index, call),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    let body = json!({
        "id": format!("chatcmpl-fake-{}", ctx.id),
        "object": "chat.completion",
        "created": unix_now(),
        "model": ctx.model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(plan)}],
        "usage": usage(ctx, plan),
    });
    json_response(StatusCode::OK, &body)
}

/// Returns a streamed reply: role chunk, content pieces, tool call pieces, finish, usage, `[DONE]`.
pub(crate) fn stream(plan: &Plan, ctx: &ReplyContext) -> Response {
    let id = format!("chatcmpl-fake-{}", ctx.id);
    let created = unix_now();
    let chunk = |delta: Value, finish: Value| {
        let mut chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if ctx.include_usage {
            chunk["usage"] = Value::Null;
        }
        sse_frame(None, &chunk.to_string())
    };
    let mut frames = Vec::with_capacity(8);
    frames.push(chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    ));
    for piece in text_pieces(&plan.text) {
        frames.push(chunk(json!({"content": piece}), Value::Null));
    }
    for (index, call) in plan.tool_calls.iter().enumerate() {
        let head = json!({"tool_calls": [{
            "index": index,
            "id": call_id(ctx, index, call),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]});
        frames.push(chunk(head, Value::Null));
        for piece in argument_pieces(&call.arguments) {
            let delta = json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]});
            frames.push(chunk(delta, Value::Null));
        }
    }
    frames.push(chunk(json!({}), Value::from(finish_reason(plan))));
    if ctx.include_usage {
        let last = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model,
            "choices": [],
            "usage": usage(ctx, plan),
        });
        frames.push(sse_frame(None, &last.to_string()));
    }
    frames.push(sse_frame(None, "[DONE]"));
    sse_response(frames, plan.chunk_delay)
}

/// Returns the `GET /v1/models` listing.
pub(crate) fn models() -> Response {
    let created = unix_now();
    let data: Vec<Value> = ["gpt-4o-mini", "gpt-4o", "fake-model"]
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": created, "owned_by": "agentloop-fake-model"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}
