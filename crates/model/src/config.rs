//! Model provider settings; the config loader maps the ecosystem env vars onto these fields.

use crate::Secret;

/// Settings for every model provider.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct ModelsConfig {
    /// Model used when a session names none, as `provider/model` (`AGENTLOOP_MODEL`).
    pub default_model: String,
    /// Base URL of an OpenAI-compatible server, including `/v1` (`OPENAI_BASE_URL`).
    pub openai_base_url: String,
    /// Bearer token for the OpenAI-compatible server; none sends no `Authorization` (`OPENAI_API_KEY`).
    pub openai_api_key: Option<Secret>,
    /// Base URL of the Anthropic API, without `/v1` (`ANTHROPIC_BASE_URL`).
    pub anthropic_base_url: String,
    /// Anthropic API key, sent as `x-api-key` (`ANTHROPIC_API_KEY`).
    pub anthropic_api_key: Option<Secret>,
    /// Bounds the wait for response headers, and each wait for the next streamed bytes.
    pub request_timeout_ms: u64,
    /// Bounds establishing a connection.
    pub connect_timeout_ms: u64,
    /// 0: model calls go over HTTP/1.1, a connection per call in flight. Above 0: over HTTP/2
    /// (also on `http://`, by prior knowledge), at most this many calls sharing a connection;
    /// keep it at or below the provider's limit on concurrent streams.
    pub http2_streams: u32,
    /// Output token cap sent when a request sets none (Anthropic requires one).
    pub max_tokens: u32,
    /// Auth profiles (`[[models.profiles]]`): tried in order, a failing one cools down. With
    /// none for a provider, its single configured key is its only profile.
    pub profiles: Vec<AuthProfile>,
    /// Models tried, in order, when the session's model fails for good (`provider/model`).
    pub fallbacks: Vec<String>,
    /// Reasoning effort requested by default (`low`, `medium`, `high`; empty for none).
    pub thinking: String,
    /// Known context windows in tokens, by `provider/model`; used to skip a model that is too
    /// small before calling it.
    pub context_windows: std::collections::BTreeMap<String, usize>,
    /// First cooldown of a failing auth profile; doubles on each further failure.
    pub cooldown_base_ms: u64,
    /// Longest cooldown.
    pub cooldown_max_ms: u64,
    /// When not empty, the only models (besides the default) a session may use; enforced by the
    /// router and the runner's intake, not by the client.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allowlist: Vec<String>,
}

/// Credentials for one provider (`[[models.profiles]]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthProfile {
    /// A name for logs, the runs table and the cooldown store.
    pub name: String,
    /// `openai` or `anthropic`.
    pub provider: String,
    /// The key.
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// A base URL other than the provider's configured one.
    #[serde(default)]
    pub base_url: Option<String>,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            default_model: agentloop_lifecycle::DEFAULT_MODEL.to_owned(),
            openai_base_url: "https://api.openai.com/v1".to_owned(),
            openai_api_key: None,
            anthropic_base_url: "https://api.anthropic.com".to_owned(),
            anthropic_api_key: None,
            request_timeout_ms: 120_000,
            connect_timeout_ms: 5_000,
            http2_streams: 0,
            max_tokens: 4096,
            profiles: Vec::new(),
            fallbacks: Vec::new(),
            thinking: String::new(),
            context_windows: std::collections::BTreeMap::new(),
            cooldown_base_ms: 1_000,
            cooldown_max_ms: 300_000,
            allowlist: Vec::new(),
        }
    }
}
