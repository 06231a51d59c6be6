//! Model provider clients used by the agent runner.
//!
//! One [`ModelClient`] speaks OpenAI-compatible Chat Completions (OpenAI, vLLM, llama.cpp,
//! Ollama) and Anthropic Messages, always streaming. A provider-neutral [`ChatRequest`] goes in;
//! a [`ModelStream`] of [`StreamEvent`]s comes out (text deltas, complete tool calls, then
//! `Done`). Every failure is a [`ModelError`] whose [`ErrorKind`] drives the runner's recovery.

mod anthropic;
mod config;
mod connections;
mod embeddings;
mod error;
mod model_ref;
mod openai;
mod redact;
mod sse;
mod stream;
mod types;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

pub use config::AuthProfile;
pub use config::ModelsConfig;
pub use embeddings::MAX_EMBED_INPUTS;
pub use error::{ErrorKind, ModelError};
pub use model_ref::{ModelRef, Provider};
pub use redact::{Secret, redact_secrets};
pub use stream::ModelStream;
pub use types::{
    ChatMessage, ChatRequest, ChatResponse, Credential, MAX_TOOL_CALLS, StopReason, StreamEvent,
    ToolCall, ToolSpec, Usage,
};

/// A pooled client for every provider; cheap to clone.
#[derive(Debug, Clone)]
pub struct ModelClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connections: connections::Connections,
    default_model: ModelRef,
    // Parsed once: reqwest parses a URL given as text on every request.
    openai_url: reqwest::Url,
    embeddings_url: reqwest::Url,
    openai_api_key: Option<Secret>,
    anthropic_url: reqwest::Url,
    anthropic_api_key: Option<Secret>,
    request_timeout: Duration,
    max_tokens: u32,
    openai_tools: openai::ToolsJson,
}

impl ModelClient {
    /// Returns a client for `config`.
    ///
    /// # Errors
    /// `InvalidModelRef` for a bad `default_model`, `InvalidConfig` for a base URL that is not
    /// http(s) or a zero timeout, `Client` when the HTTP client cannot be built.
    pub fn new(config: &ModelsConfig) -> Result<Self, ModelError> {
        let default_model = ModelRef::parse(&config.default_model)?;
        if config.request_timeout_ms == 0 || config.connect_timeout_ms == 0 {
            return Err(ModelError::InvalidConfig(
                "timeouts must be positive".to_owned(),
            ));
        }
        let openai_base = base_url("openai_base_url", &config.openai_base_url)?;
        let anthropic_base = base_url("anthropic_base_url", &config.anthropic_base_url)?;
        // Anthropic's base URL has no `/v1`; tolerate one given by habit.
        let anthropic_url = match anthropic_base.strip_suffix("/v1") {
            Some(base) => format!("{base}/v1/messages"),
            None => format!("{anthropic_base}/v1/messages"),
        };
        let connections = connections::Connections::new(
            Duration::from_millis(config.connect_timeout_ms),
            config.http2_streams,
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                connections,
                default_model,
                openai_url: endpoint(
                    "openai_base_url",
                    &format!("{openai_base}/chat/completions"),
                )?,
                embeddings_url: endpoint("openai_base_url", &format!("{openai_base}/embeddings"))?,
                openai_api_key: config.openai_api_key.clone().filter(|k| !k.is_empty()),
                anthropic_url: endpoint("anthropic_base_url", &anthropic_url)?,
                anthropic_api_key: config.anthropic_api_key.clone().filter(|k| !k.is_empty()),
                request_timeout: Duration::from_millis(config.request_timeout_ms),
                max_tokens: config.max_tokens,
                openai_tools: openai::ToolsJson::default(),
            }),
        })
    }

    /// Returns the configured default model.
    pub fn default_model(&self) -> &ModelRef {
        &self.inner.default_model
    }

    /// Sends `req` with streaming on and returns the event stream once headers arrive.
    ///
    /// The request timeout bounds the wait for response headers, and then each wait for
    /// more streamed bytes.
    ///
    /// # Errors
    /// `Connect` (server down), `Timeout`, `Transport`, or `Api` for an error status;
    /// see [`ModelError::kind`].
    pub async fn stream(&self, req: &ChatRequest) -> Result<ModelStream, ModelError> {
        let inner = &*self.inner;
        let provider = req.model.provider;
        let (http, slot) = inner.connections.take()?;
        let credential = req.credential.as_ref();
        let override_url = credential.and_then(|c| c.base_url.as_deref());
        let (url, request) = match provider {
            Provider::OpenAi => {
                let tools = inner.openai_tools.get(&req.tools);
                let body = openai::request_body(req, tools.as_deref(), None);
                let custom = override_url
                    .map(|base| format!("{}/chat/completions", base.trim_end_matches('/')));
                let (url, request) = post(&http, custom, &inner.openai_url);
                let mut request = request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body);
                let key = credential
                    .and_then(|c| c.api_key.as_ref())
                    .or(inner.openai_api_key.as_ref());
                if let Some(key) = key {
                    request = request.bearer_auth(key.expose());
                }
                (url, request)
            }
            Provider::Anthropic => {
                let body = anthropic::request_body(req, inner.max_tokens);
                let custom = override_url.map(|base| {
                    let base = base.trim_end_matches('/');
                    format!("{}/v1/messages", base.strip_suffix("/v1").unwrap_or(base))
                });
                let (url, request) = post(&http, custom, &inner.anthropic_url);
                let mut request = request
                    .header("anthropic-version", "2023-06-01")
                    .json(&body);
                let key = credential
                    .and_then(|c| c.api_key.as_ref())
                    .or(inner.anthropic_api_key.as_ref());
                if let Some(key) = key {
                    request = request.header("x-api-key", key.expose());
                }
                (url, request)
            }
        };
        let url = &url;
        let request = request.header(reqwest::header::ACCEPT, "text/event-stream");
        let timeout_ms = u64::try_from(inner.request_timeout.as_millis()).unwrap_or(u64::MAX);
        let timed_out = || ModelError::Timeout {
            provider,
            timeout_ms,
        };
        let deadline = tokio::time::Instant::now() + inner.request_timeout;
        let response = tokio::time::timeout_at(deadline, request.send())
            .await
            .map_err(|_| timed_out())?
            .map_err(|err| ModelError::transport(provider, url, err))?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = tokio::time::timeout_at(deadline, error_body(response))
                .await
                .map_err(|_| timed_out())?
                .map_err(|err| ModelError::transport(provider, url, err))?;
            let err = ModelError::from_response(provider, status.as_u16(), &body, retry_after);
            tracing::debug!(error = %err, model = %req.model, "model call failed");
            return Err(err);
        }
        Ok(ModelStream::new(
            provider,
            url.to_string(),
            response,
            inner.request_timeout,
            slot,
        ))
    }

    /// Sends `req` and collects the whole response; the request timeout bounds the whole call.
    ///
    /// # Errors
    /// As [`ModelClient::stream`], plus any error raised mid-stream.
    pub async fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, ModelError> {
        let timeout = self.inner.request_timeout;
        let provider = req.model.provider;
        tokio::time::timeout(timeout, self.collect(req))
            .await
            .map_err(|_| ModelError::Timeout {
                provider,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            })?
    }

    async fn collect(&self, req: &ChatRequest) -> Result<ChatResponse, ModelError> {
        let mut stream = self.stream(req).await?;
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        while let Some(event) = stream.next().await {
            match event? {
                StreamEvent::TextDelta(delta) => text.push_str(&delta),
                StreamEvent::ToolCall(call) => tool_calls.push(call),
                StreamEvent::Done { stop_reason, usage } => {
                    return Ok(ChatResponse {
                        text,
                        tool_calls,
                        stop_reason,
                        usage,
                    });
                }
            }
        }
        Err(ModelError::Protocol {
            provider: req.model.provider,
            message: "stream ended without a final event".to_owned(),
        })
    }
}

/// Validates a base URL and drops trailing slashes.
fn base_url(field: &str, url: &str) -> Result<String, ModelError> {
    let url = url.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ModelError::InvalidConfig(format!(
            "{field} must start with http:// or https://, got {url:?}"
        )));
    }
    Ok(url.to_owned())
}

/// A POST on `http` to a profile's own endpoint when it has one, else to the configured
/// `default`; with the URL, for errors.
fn post<'a>(
    http: &reqwest::Client,
    custom: Option<String>,
    default: &'a reqwest::Url,
) -> (Cow<'a, str>, reqwest::RequestBuilder) {
    match custom {
        Some(url) => {
            let request = http.post(&url);
            (Cow::Owned(url), request)
        }
        None => (Cow::Borrowed(default.as_str()), http.post(default.clone())),
    }
}

/// Parses an endpoint built from the base URL of `field`.
fn endpoint(field: &str, url: &str) -> Result<reqwest::Url, ModelError> {
    reqwest::Url::parse(url)
        .map_err(|err| ModelError::InvalidConfig(format!("{field} gives {url:?}: {err}")))
}

/// The most of an error response's body read: enough for any provider's error object, while a
/// body without end is not held.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Reads an error response's body, up to [`MAX_ERROR_BODY`] bytes (the rest is left unread).
async fn error_body(mut response: reqwest::Response) -> reqwest::Result<Vec<u8>> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        let Some(chunk) = response.chunk().await? else {
            break;
        };
        let room = MAX_ERROR_BODY - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(body)
}
