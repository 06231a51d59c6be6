//! Delivery: takes each OutboundMessage from `<prefix>.outbound.>` (stream OUTBOUND, durable
//! consumer shared by replicas), suppresses `NO_REPLY`, answers request/reply callers on their
//! reply subject, and hands the reply to the channel's adapter: a chat app configured under
//! `[channels.<name>]` (Telegram) gets it through its API; every other channel (`cli`, `nats`)
//! is published as JSON on `<prefix>.deliver.<channel>.<session_id>`.

mod apps;
mod config;
mod deliver;
mod failure;
mod recent;

pub use config::{DeliveryConfig, DeliverySettings};

use agentloop_lifecycle::Health;
use tokio_util::sync::CancellationToken;

/// What stops delivery (per-message failures are retried or dead-lettered, never returned).
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The bus could not be set up.
    #[error("bus setup failed")]
    Bus(#[from] agentloop_bus::BusError),
    /// The admin server could not bind.
    #[error(transparent)]
    Admin(#[from] agentloop_lifecycle::AdminError),
    /// A `[channels]` setting cannot be served.
    #[error("invalid channels setting: {0}")]
    Config(String),
    /// The consumer's message stream could not be opened.
    #[error("failed to open the outbound message stream")]
    Stream(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Runs delivery with its own admin server until `shutdown` is cancelled.
///
/// # Errors
/// Only startup failures.
pub async fn run(config: DeliveryConfig, shutdown: CancellationToken) -> Result<(), DeliveryError> {
    let admin_listen = config.delivery.admin_listen.clone();
    agentloop_lifecycle::run_with_admin("delivery", &admin_listen, shutdown, |health, shutdown| {
        serve(config, health, shutdown)
    })
    .await
}

/// Delivers replies until `shutdown`, reporting readiness into `health`.
///
/// # Errors
/// Only startup failures.
pub async fn serve(
    config: DeliveryConfig,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), DeliveryError> {
    deliver::serve(config, health, shutdown).await
}
