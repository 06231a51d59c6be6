//! Agent runner: owns sessions and runs their inputs one at a time, across every replica.
//!
//! Consumes `<prefix>.run.>` (stream RUNS, durable consumer shared by replicas). Each command is
//! written to the session's inbox in the memory service, acknowledged, and then the replica
//! tries to claim the session's lease; the owner runs the inbox empty, every write fenced by
//! the lease epoch. Produces SystemEvents on `<prefix>.events.<session_id>.<run_id>`, transcript
//! writes through memory's gRPC API, and the final OutboundMessage on `<prefix>.outbound.<channel>`.

mod config;
mod error;
mod events;
mod intake;
mod memory;
mod owner;
mod run;

pub use config::{MemoryEndpoint, RunnerConfig, RunnerSettings};
pub use error::RunnerError;

use agentloop_lifecycle::{AdminServer, Health};
use tokio_util::sync::CancellationToken;

/// Runs the runner with its own admin server until `shutdown` is cancelled.
///
/// # Errors
/// Only startup failures; a bad command is dead-lettered, a failed run is answered with an error.
pub async fn run(config: RunnerConfig, shutdown: CancellationToken) -> Result<(), RunnerError> {
    let health = Health::new();
    let addr = config.runner.admin_listen.clone();
    let admin = AdminServer::bind(&addr, health.clone())
        .await
        .map_err(|source| RunnerError::Admin { addr, source })?;
    if let Ok(local) = admin.local_addr() {
        tracing::info!(admin = %local, "runner admin endpoints listening");
    }
    let admin_task = tokio::spawn(admin.serve(shutdown.clone()));
    let result = serve(config, health, shutdown).await;
    let _ = admin_task.await;
    result
}

/// Runs sessions until `shutdown`, reporting readiness into `health`.
///
/// # Errors
/// Only startup failures.
pub async fn serve(
    config: RunnerConfig,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), RunnerError> {
    intake::serve(config, health, shutdown).await
}
