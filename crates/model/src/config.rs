//! Model provider settings; the config loader maps the ecosystem env vars onto these fields.

/// Settings for every model provider.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct ModelsConfig {
    /// Model used when a session names none, as `provider/model` (`AGENTLOOP_MODEL`).
    pub default_model: String,
    /// Base URL of an OpenAI-compatible server, including `/v1` (`OPENAI_BASE_URL`).
    pub openai_base_url: String,
    /// Bearer token for the OpenAI-compatible server; none sends no `Authorization` (`OPENAI_API_KEY`).
    pub openai_api_key: Option<String>,
    /// Base URL of the Anthropic API, without `/v1` (`ANTHROPIC_BASE_URL`).
    pub anthropic_base_url: String,
    /// Anthropic API key, sent as `x-api-key` (`ANTHROPIC_API_KEY`).
    pub anthropic_api_key: Option<String>,
    /// Bounds the wait for response headers, and each wait for the next streamed bytes.
    pub request_timeout_ms: u64,
    /// Bounds establishing a connection.
    pub connect_timeout_ms: u64,
    /// Output token cap sent when a request sets none (Anthropic requires one).
    pub max_tokens: u32,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            default_model: "openai/gpt-4o-mini".to_owned(),
            openai_base_url: "https://api.openai.com/v1".to_owned(),
            openai_api_key: None,
            anthropic_base_url: "https://api.anthropic.com".to_owned(),
            anthropic_api_key: None,
            request_timeout_ms: 120_000,
            connect_timeout_ms: 5_000,
            max_tokens: 4096,
        }
    }
}
