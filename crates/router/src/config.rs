//! Router settings: `[bus]`, `[memory]` (url), `[models]` (default, allowlist), `[scanner]`,
//! `[channels]` (direct-message policies) and `[router]`.

use agentloop_bus::BusConfig;

/// Everything the router reads from the merged configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct RouterConfig {
    /// NATS connection and stream layout.
    pub bus: BusConfig,
    /// Where the memory service is.
    pub memory: agentloop_lifecycle::MemoryEndpoint,
    /// Model defaults.
    pub models: ModelDefaults,
    /// Router-only settings.
    pub router: RouterSettings,
    /// The part of `[agents.<id>]` the router uses: each agent's model.
    pub agents: std::collections::BTreeMap<String, AgentModel>,
    /// The injection scanner every inbound message goes through.
    pub scanner: agentloop_scanner::ScannerConfig,
    /// The part of `[channels.<name>]` the router uses: who may write on direct messages.
    pub channels: agentloop_channels::ChannelsConfig,
}

agentloop_lifecycle::config_schema!(RouterConfig);

/// An agent's model (`[agents.<id>] model`), between a session's override and the default.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct AgentModel {
    /// `provider/model`; empty for the global default.
    pub model: String,
}

/// The part of `[models]` the router uses for model resolution.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct ModelDefaults {
    /// The global default `provider/model`.
    pub default_model: String,
    /// When not empty, the only models a session may use.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allowlist: Vec<String>,
}

impl Default for ModelDefaults {
    fn default() -> Self {
        Self {
            default_model: agentloop_lifecycle::DEFAULT_MODEL.to_owned(),
            allowlist: Vec::new(),
        }
    }
}

/// `[router]`
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct RouterSettings {
    /// Admin HTTP address (`/healthz`, `/readyz`, `/metrics`); empty means an ephemeral port.
    pub admin_listen: String,
    /// Durable consumer name shared by router replicas.
    pub consumer: String,
    /// Sessions whose messages are routed at once; each session's messages go one after
    /// another, in order.
    pub concurrency: usize,
    /// How long a resolved session is reused without asking memory again (0: always ask).
    /// A session's id never changes; a model override or queue mode set meanwhile may take
    /// this long to apply.
    pub session_cache_ttl_ms: u64,
    /// How often the streams' depths and consumers' backlogs are read into the
    /// `agentloop_stream_messages` and `agentloop_consumer_*` gauges (0: never).
    pub depth_interval_ms: u64,
    /// A session's inbound messages become run commands in their INBOUND order, also when
    /// earlier ones were pulled through a connection that died or by another replica: a later
    /// one waits (at most `bus.ack_wait_ms` × `bus.max_deliver`) until the earlier one is
    /// routed.
    pub keep_order: bool,
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            admin_listen: String::new(),
            consumer: "router".to_owned(),
            concurrency: 256,
            session_cache_ttl_ms: 1_000,
            depth_interval_ms: 15_000,
            keep_order: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)]) -> RouterConfig {
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        agentloop_lifecycle::load_config_from(None, env).unwrap()
    }

    #[test]
    fn the_allowlist_comes_as_comma_separated_text_from_the_environment() {
        let config = load(&[("AGENTLOOP_MODELS__ALLOWLIST", "openai/a, openai/b")]);
        assert_eq!(config.models.allowlist, ["openai/a", "openai/b"]);
    }

    #[test]
    fn a_channels_allow_list_and_the_scanners_rule_files_come_as_comma_separated_text() {
        let config = load(&[
            ("AGENTLOOP_CHANNELS__TELEGRAM__ALLOW_FROM", "4242, 77"),
            ("AGENTLOOP_CHANNELS__SLACK__ALLOW_FROM", "U1"),
            ("AGENTLOOP_SCANNER__RULES_FILES", "/etc/a.toml,/etc/b.toml"),
        ]);
        assert_eq!(config.channels.telegram.allow_from, ["4242", "77"]);
        assert_eq!(config.channels.slack.allow_from, ["U1"]);
        assert_eq!(config.scanner.rules_files, ["/etc/a.toml", "/etc/b.toml"]);
    }

    #[test]
    fn the_default_model_is_the_shared_one_unless_configured() {
        assert_eq!(
            load(&[]).models.default_model,
            agentloop_lifecycle::DEFAULT_MODEL
        );
        let config = load(&[("AGENTLOOP_MODEL", "openai/x")]);
        assert_eq!(config.models.default_model, "openai/x");
    }
}
