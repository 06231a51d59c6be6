//! `ModelError` and the classification the runner's recovery chain acts on.

use std::time::Duration;

use crate::Provider;

/// What a caller can do about a failed model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The prompt does not fit the context window: compact or truncate, then retry.
    ContextOverflow,
    /// Bad or missing credentials: switch auth profile, do not retry as is.
    Auth,
    /// Rate limited: back off (see `ModelError::retry_after`) or fail over.
    RateLimit,
    /// No response (or no streamed bytes) within the request timeout.
    Timeout,
    /// Server down, unreachable, overloaded or 5xx: retry later or fail over.
    Unavailable,
    /// The model does not support the requested thinking (reasoning) level: lower it.
    UnsupportedThinking,
    /// The request was rejected for another reason: retrying will not help.
    BadRequest,
    /// The response did not follow the provider's protocol.
    Protocol,
}

/// Errors from model provider calls.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A `provider/model` string that cannot be used.
    #[error("invalid model reference {input:?}: {reason}")]
    InvalidModelRef {
        /// The string given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value that cannot be used.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// The HTTP client could not be built.
    #[error("failed to build the http client")]
    Client(#[source] reqwest::Error),
    /// The provider answered with an error status.
    #[error("{provider} returned status {status}: {message}")]
    Api {
        /// Which provider.
        provider: Provider,
        /// HTTP status.
        status: u16,
        /// Classification.
        kind: ErrorKind,
        /// The provider's error message (or the start of the body).
        message: String,
        /// The provider's error code or type, when given.
        code: Option<String>,
        /// The `retry-after` header, when given.
        retry_after: Option<Duration>,
    },
    /// The provider reported an error inside a stream.
    #[error("{provider} stream error: {message}")]
    Stream {
        /// Which provider.
        provider: Provider,
        /// Classification.
        kind: ErrorKind,
        /// The provider's error message.
        message: String,
    },
    /// No response headers within the request timeout.
    #[error("{provider} request timed out after {timeout_ms} ms")]
    Timeout {
        /// Which provider.
        provider: Provider,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// No streamed bytes within the request timeout.
    #[error("{provider} stream stalled: no data for {timeout_ms} ms")]
    Stalled {
        /// Which provider.
        provider: Provider,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// The connection could not be established.
    #[error("failed to connect to {provider} at {url}")]
    Connect {
        /// Which provider.
        provider: Provider,
        /// The URL called.
        url: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The connection failed after it was established.
    #[error("{provider} request failed")]
    Transport {
        /// Which provider.
        provider: Provider,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The response did not follow the protocol.
    #[error("invalid {provider} response: {message}")]
    Protocol {
        /// Which provider.
        provider: Provider,
        /// What was wrong.
        message: String,
    },
}

impl ModelError {
    /// Returns what a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidModelRef { .. } | Self::InvalidConfig(_) | Self::Client(_) => {
                ErrorKind::BadRequest
            }
            Self::Api { kind, .. } | Self::Stream { kind, .. } => *kind,
            Self::Timeout { .. } | Self::Stalled { .. } => ErrorKind::Timeout,
            Self::Connect { .. } | Self::Transport { .. } => ErrorKind::Unavailable,
            Self::Protocol { .. } => ErrorKind::Protocol,
        }
    }

    /// Returns a fixed word for the failure (`auth`, `rate_limit`, `timeout`, `bad_request`,
    /// `overloaded`, `server_error`, `context_overflow`, ...), safe to show a user, emit in
    /// events and store: unlike the error's text it never quotes the provider, whose messages
    /// can hold the API key.
    pub fn label(&self) -> &'static str {
        match self.kind() {
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::Auth => "auth",
            ErrorKind::RateLimit => "rate_limit",
            ErrorKind::Timeout => "timeout",
            ErrorKind::UnsupportedThinking => "unsupported_thinking",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Unavailable => match self {
                Self::Connect { .. } | Self::Transport { .. } => "unreachable",
                _ if self.is_overloaded() => "overloaded",
                _ => "server_error",
            },
        }
    }

    fn is_overloaded(&self) -> bool {
        match self {
            Self::Api { status: 529, .. } => true,
            Self::Api { code, message, .. } => {
                code.as_deref().is_some_and(|c| c.contains("overloaded"))
                    || message.to_lowercase().contains("overloaded")
            }
            Self::Stream { message, .. } => message.to_lowercase().contains("overloaded"),
            _ => false,
        }
    }

    /// Returns the provider's `retry-after` hint, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Returns the HTTP status of an `Api` error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub(crate) fn transport(provider: Provider, url: &str, source: reqwest::Error) -> Self {
        if source.is_connect() {
            Self::Connect {
                provider,
                url: url.to_owned(),
                source,
            }
        } else {
            Self::Transport { provider, source }
        }
    }

    /// Builds an `Api` error from a non-success response body.
    pub(crate) fn from_response(
        provider: Provider,
        status: u16,
        body: &[u8],
        retry_after: Option<Duration>,
    ) -> Self {
        let (message, code, kind_hint) = parse_error_body(body);
        let kind = classify(status, code.as_deref(), kind_hint.as_deref(), &message);
        Self::Api {
            provider,
            status,
            kind,
            message,
            code: code.or(kind_hint),
            retry_after,
        }
    }

    /// Builds a `Stream` error from an in-stream error object.
    pub(crate) fn from_stream_error(provider: Provider, error: &serde_json::Value) -> Self {
        let (message, code, kind_hint) = error_fields(error);
        // In-stream errors carry no status; rely on the code, type and message alone.
        let kind = match kind_hint.as_deref().or(code.as_deref()) {
            Some("rate_limit_error" | "rate_limit_exceeded") => ErrorKind::RateLimit,
            Some("overloaded_error" | "api_error" | "server_error") => ErrorKind::Unavailable,
            Some("authentication_error" | "permission_error" | "invalid_api_key") => {
                ErrorKind::Auth
            }
            _ if is_overflow(code.as_deref(), kind_hint.as_deref(), &message) => {
                ErrorKind::ContextOverflow
            }
            Some("invalid_request_error") => ErrorKind::BadRequest,
            _ => ErrorKind::Unavailable,
        };
        Self::Stream {
            provider,
            kind,
            message,
        }
    }
}

/// Returns `(message, code, type)` from an error body of either provider (or plain text).
fn parse_error_body(body: &[u8]) -> (String, Option<String>, Option<String>) {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(json) => match json.get("error") {
            Some(error @ serde_json::Value::Object(_)) => error_fields(error),
            // Ollama and some proxies send `{"error": "text"}`.
            Some(serde_json::Value::String(message)) => (message.clone(), None, None),
            _ => (truncate(&json.to_string()), None, None),
        },
        Err(_) => (truncate(&String::from_utf8_lossy(body)), None, None),
    }
}

fn error_fields(error: &serde_json::Value) -> (String, Option<String>, Option<String>) {
    let text = |key: &str| match error.get(key) {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let message = text("message").unwrap_or_else(|| truncate(&error.to_string()));
    (message, text("code"), text("type"))
}

fn truncate(text: &str) -> String {
    const MAX: usize = 500;
    let text = text.trim();
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn is_overflow(code: Option<&str>, kind: Option<&str>, message: &str) -> bool {
    const HINTS: [&str; 7] = [
        "context length",
        "context_length",
        "maximum context",
        "context window",
        "context size",
        "prompt is too long",
        "too many tokens",
    ];
    if code == Some("context_length_exceeded") || kind == Some("exceed_context_size_error") {
        return true;
    }
    let message = message.to_lowercase();
    HINTS.iter().any(|hint| message.contains(hint))
}

fn is_unsupported_thinking(message: &str) -> bool {
    let message = message.to_lowercase();
    (message.contains("reasoning_effort") || message.contains("thinking"))
        && (message.contains("not support") || message.contains("unsupported"))
}

fn classify(status: u16, code: Option<&str>, kind: Option<&str>, message: &str) -> ErrorKind {
    match status {
        401 | 403 => ErrorKind::Auth,
        429 => ErrorKind::RateLimit,
        408 => ErrorKind::Timeout,
        413 => ErrorKind::ContextOverflow,
        400..=499 if is_overflow(code, kind, message) => ErrorKind::ContextOverflow,
        400..=499 if is_unsupported_thinking(message) => ErrorKind::UnsupportedThinking,
        400..=499 => ErrorKind::BadRequest,
        500..=599 => ErrorKind::Unavailable,
        _ => ErrorKind::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_classified() {
        let openai = br#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        let overloaded =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let cases = [
            (400, &openai[..], ErrorKind::ContextOverflow),
            (400, &anthropic[..], ErrorKind::ContextOverflow),
            (
                400,
                br#"{"error":"model not found"}"#,
                ErrorKind::BadRequest,
            ),
            (401, b"nope", ErrorKind::Auth),
            (429, b"", ErrorKind::RateLimit),
            (529, &overloaded[..], ErrorKind::Unavailable),
            (503, b"<html>bad gateway</html>", ErrorKind::Unavailable),
        ];
        for (status, body, kind) in cases {
            let err = ModelError::from_response(Provider::OpenAi, status, body, None);
            assert_eq!(err.kind(), kind, "{status} {err}");
        }
    }

    #[test]
    fn labels_name_the_class_and_never_the_provider_text() {
        let cases: [(u16, &[u8], &str); 6] = [
            (
                401,
                br#"{"error":{"message":"Incorrect API key provided: sk-proj-abcdefgh1234","code":"invalid_api_key"}}"#,
                "auth",
            ),
            (429, b"", "rate_limit"),
            (400, br#"{"error":"model not found"}"#, "bad_request"),
            (
                529,
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                "overloaded",
            ),
            (500, b"oops", "server_error"),
            (
                400,
                br#"{"error":{"message":"maximum context length is 8192","code":"context_length_exceeded"}}"#,
                "context_overflow",
            ),
        ];
        for (status, body, label) in cases {
            let err = ModelError::from_response(Provider::OpenAi, status, body, None);
            assert_eq!(err.label(), label, "{status}");
        }
        let timeout = ModelError::Timeout {
            provider: Provider::OpenAi,
            timeout_ms: 5,
        };
        assert_eq!(timeout.label(), "timeout");
    }

    #[test]
    fn api_error_messages_name_provider_status_and_message() {
        let body =
            br#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
        let err = ModelError::from_response(Provider::Anthropic, 500, body, None);
        assert_eq!(
            err.to_string(),
            "anthropic returned status 500: Internal server error"
        );
    }
}
