//! Gateway settings: `[bus]` and `[gateway]`.

use agentloop_bus::BusConfig;

/// Everything the gateway reads from the merged configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// NATS connection and stream layout.
    pub bus: BusConfig,
    /// Gateway-only settings.
    pub gateway: GatewaySettings,
}

/// `[gateway]`
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct GatewaySettings {
    /// HTTP address for clients and `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// How long an `agentloop.ask` caller waits for the final reply.
    pub ask_timeout_ms: u64,
    /// Queue group shared by gateway replicas answering `agentloop.ask`.
    pub ask_queue_group: String,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".to_owned(),
            ask_timeout_ms: 120_000,
            ask_queue_group: "agentloop-gateway".to_owned(),
        }
    }
}
