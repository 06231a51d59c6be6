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
    // Stopped with the service, also when it fails to start: a service that cannot run must
    // exit with its error, not keep serving "not ready".
    let admin_stop = shutdown.child_token();
    let admin_task = tokio::spawn(admin.serve(admin_stop.clone()));
    let result = serve(config, health, shutdown).await;
    admin_stop.cancel();
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
