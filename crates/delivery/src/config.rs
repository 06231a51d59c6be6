//! Delivery settings: `[bus]`, `[delivery]` and `[channels]`.

use agentloop_bus::BusConfig;

/// Everything delivery reads from the merged configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct DeliveryConfig {
    /// NATS connection and stream layout.
    pub bus: BusConfig,
    /// Delivery-only settings.
    pub delivery: DeliverySettings,
    /// Chat apps replies are posted to (`[channels.<name>]`).
    pub channels: agentloop_channels::ChannelsConfig,
}

agentloop_lifecycle::config_schema!(DeliveryConfig);

/// `[delivery]`
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct DeliverySettings {
    /// Admin HTTP address (`/healthz`, `/readyz`, `/metrics`); empty means an ephemeral port.
    pub admin_listen: String,
    /// Durable consumer name shared by delivery replicas.
    pub consumer: String,
    /// Replies delivered at once.
    pub concurrency: usize,
    /// A session's replies reach its channel in their OUTBOUND order, also when some were
    /// pulled through a connection that died or by another replica: a later one waits (at
    /// most `bus.ack_wait_ms` × `bus.max_deliver`) until the earlier one is delivered.
    pub keep_order: bool,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            admin_listen: String::new(),
            consumer: "delivery".to_owned(),
            concurrency: 256,
            keep_order: true,
        }
    }
}
