//! Anthropic Messages rendering: JSON messages, the named SSE event sequence, errors.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::plan::{Plan, PlannedCall};
use crate::state::Failure;
use crate::wire::{
    ReplyContext, argument_pieces, json_response, sse_frame, sse_response, text_pieces,
};

/// Returns the error response for `failure` in Anthropic's shape.
pub(crate) fn error(failure: Failure) -> Response {
    let (kind, message) = match failure {
        Failure::Auth => ("authentication_error", "invalid x-api-key"),
        Failure::RateLimit => (
            "rate_limit_error",
            "This request would exceed the rate limit for your organization.",
        ),
        Failure::Server => ("api_error", "Internal server error"),
        Failure::Overflow => (
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
        ),
        Failure::UnsupportedThinking => (
            "invalid_request_error",
            "thinking with this budget is not supported by this model",
        ),
    };
    let status =
        StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(
        status,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// Returns a 400 for a malformed request, in Anthropic's shape.
pub(crate) fn bad_request(message: &str) -> Response {
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
    )
}

fn tool_id(ctx: &ReplyContext, index: usize, call: &PlannedCall) -> String {
    call.id
        .clone()
        .unwrap_or_else(|| format!("toolu_fake_{}_{index}", ctx.id))
}

fn stop_reason(plan: &Plan) -> &'static str {
    if plan.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// Returns a non-streaming `message`.
pub(crate) fn complete(plan: &Plan, ctx: &ReplyContext) -> Response {
    let mut content = Vec::with_capacity(1 + plan.tool_calls.len());
    if !plan.text.is_empty() || plan.tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": plan.text}));
    }
    for (index, call) in plan.tool_calls.iter().enumerate() {
        content.push(json!({
            "type": "tool_use",
            "id": tool_id(ctx, index, call),
            "name": call.name,
            "input": tool_input(&call.arguments),
        }));
    }
    let body = json!({
        "id": format!("msg_fake_{}", ctx.id),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": stop_reason(plan),
        "stop_sequence": null,
        "usage": {"input_tokens": ctx.input_tokens, "output_tokens": plan.output_tokens()},
    });
    json_response(StatusCode::OK, &body)
}

/// Returns the streamed event sequence, `message_start` to `message_stop`.
pub(crate) fn stream(plan: &Plan, ctx: &ReplyContext) -> Response {
    let mut frames = Vec::with_capacity(8);
    let mut event = |name: &str, data: Value| frames.push(sse_frame(Some(name), &data.to_string()));
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_fake_{}", ctx.id),
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": ctx.input_tokens, "output_tokens": 1},
        }}),
    );
    let mut index = 0;
    if !plan.text.is_empty() || plan.tool_calls.is_empty() {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        );
        event("ping", json!({"type": "ping"}));
        for piece in text_pieces(&plan.text) {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}),
            );
        }
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    for (call_index, call) in plan.tool_calls.iter().enumerate() {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": tool_id(ctx, call_index, call), "name": call.name, "input": {},
            }}),
        );
        for piece in argument_pieces(&call.arguments) {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}),
            );
        }
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    event(
        "message_delta",
        json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(plan), "stop_sequence": null},
            "usage": {"output_tokens": plan.output_tokens()}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    sse_response(frames, plan.chunk_delay)
}
