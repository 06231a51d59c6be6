//! Router: turns each `InboundMessage` into a `RunCommand` on its session's run subject.
//! Consumes `<prefix>.inbound.>` (stream INBOUND, durable consumer shared by replicas), asks
//! memory's `SessionService` for the session, publishes `<prefix>.run.<session_id>`.

mod config;
mod error;
mod route;

pub use agentloop_lifecycle::MemoryEndpoint;
pub use config::{AgentModel, ModelDefaults, RouterConfig, RouterSettings};
pub use error::RouterError;

use agentloop_lifecycle::{AdminServer, Health};
use tokio_util::sync::CancellationToken;

/// Runs the router with its own admin server until `shutdown` is cancelled.
///
/// # Errors
/// Only startup failures; a bad message is dead-lettered, never returned.
pub async fn run(config: RouterConfig, shutdown: CancellationToken) -> Result<(), RouterError> {
    let health = Health::new();
    let addr = config.router.admin_listen.clone();
    let admin = AdminServer::bind(&addr, health.clone())
        .await
        .map_err(|source| RouterError::Admin { addr, source })?;
    if let Ok(local) = admin.local_addr() {
        tracing::info!(admin = %local, "router admin endpoints listening");
    }
    let admin_task = tokio::spawn(admin.serve(shutdown.clone()));
    let result = serve(config, health, shutdown).await;
    let _ = admin_task.await;
    result
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
