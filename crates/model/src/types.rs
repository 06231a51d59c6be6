//! The provider-neutral request, message and stream event types.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ModelRef;

/// One model call, independent of the provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Which provider and model to call.
    pub model: ModelRef,
    /// System prompt.
    pub system: Option<String>,
    /// The conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may call; shared, since an agent's tools are the same on every call.
    pub tools: Arc<[ToolSpec]>,
    /// Output token cap; the config's `max_tokens` when `None`.
    pub max_tokens: Option<u32>,
    /// Reasoning effort (`low`, `medium`, `high`); `None` sends none.
    #[serde(default)]
    pub thinking: Option<String>,
    /// Credentials for this call (an auth profile); `None` uses the configured default.
    #[serde(default, skip_serializing)]
    pub credential: Option<Credential>,
}

/// An auth profile's credentials for one call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    /// API key (a bearer token for OpenAI-compatible servers, `x-api-key` for Anthropic).
    pub api_key: Option<crate::Secret>,
    /// Base URL replacing the provider's configured one.
    pub base_url: Option<String>,
}

/// One conversation message. Texts are shared: a session's history is the bulk of every request,
/// and each run's conversation takes them from the runner's held copy without copying them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// A user turn.
    User {
        /// The user's text.
        content: Arc<str>,
    },
    /// A model turn: text and/or tool calls.
    Assistant {
        /// The model's text (may be empty).
        content: Arc<str>,
        /// Tool calls the model made.
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    Tool {
        /// The `ToolCall::id` this answers.
        tool_call_id: String,
        /// The result text.
        content: Arc<str>,
        /// Whether the tool failed (sent to Anthropic as `is_error`; OpenAI has no such field).
        #[serde(default)]
        is_error: bool,
    },
}

impl ChatMessage {
    /// Returns a user message.
    pub fn user(content: impl Into<Arc<str>>) -> Self {
        Self::User {
            content: content.into(),
        }
    }

    /// Returns an assistant message with text only.
    pub fn assistant(content: impl Into<Arc<str>>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// Returns a tool result message.
    pub fn tool_result(
        tool_call_id: impl Into<String>,
        content: impl Into<Arc<str>>,
        is_error: bool,
    ) -> Self {
        Self::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
            is_error,
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// A tool call made by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned call id, echoed back in the tool result.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Parsed arguments; a JSON string holding the raw text when the model sent invalid JSON.
    pub arguments: serde_json::Value,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    /// The model finished its answer.
    EndTurn,
    /// The model wants tool results.
    ToolUse,
    /// The output token cap was hit.
    MaxTokens,
    /// Any other provider reason, verbatim.
    Other(String),
}

/// Token counts reported by the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
}

/// One item of a model response stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A piece of answer text.
    TextDelta(String),
    /// A complete tool call, arguments assembled.
    ToolCall(ToolCall),
    /// The end of the response; always the last event.
    Done {
        /// Why the model stopped.
        stop_reason: StopReason,
        /// Token counts.
        usage: Usage,
    },
}

/// A whole collected response.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The answer text.
    pub text: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped.
    pub stop_reason: StopReason,
    /// Token counts.
    pub usage: Usage,
}

/// The most tool calls one answer may hold. A stream naming more (or a call index past it) is a
/// protocol error: a call index comes from the provider and sizes a buffer, and every call of
/// an answer runs at once.
pub const MAX_TOOL_CALLS: usize = 128;
