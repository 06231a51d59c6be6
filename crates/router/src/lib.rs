//! Router: turns each `InboundMessage` into a `RunCommand` on its session's run subject.
//! Consumes `<prefix>.inbound.>` (stream INBOUND, durable consumer shared by replicas), asks
//! memory's `SessionService` for the session, publishes `<prefix>.run.<session_id>`.

mod config;
mod ctx;
mod direct;
mod error;
mod order;
mod pairing;
mod route;
mod screen;

pub use agentloop_lifecycle::MemoryEndpoint;
pub use config::{AgentModel, ModelDefaults, RouterConfig, RouterSettings};
pub use error::RouterError;

use agentloop_lifecycle::Health;
use tokio_util::sync::CancellationToken;

/// Runs the router with its own admin server until `shutdown` is cancelled.
///
/// # Errors
/// Only startup failures; a bad message is dead-lettered, never returned.
pub async fn run(config: RouterConfig, shutdown: CancellationToken) -> Result<(), RouterError> {
    let admin_listen = config.router.admin_listen.clone();
    agentloop_lifecycle::run_with_admin("router", &admin_listen, shutdown, |health, shutdown| {
        serve(config, health, shutdown)
    })
    .await
}

/// Routes inbound messages until `shutdown`, reporting readiness into `health`.
///
/// # Errors
/// Only startup failures; a bad message is dead-lettered, never returned.
pub async fn serve(
    config: RouterConfig,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), RouterError> {
    route::serve(config, health, shutdown).await
}
