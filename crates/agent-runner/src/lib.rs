//! Agent runner: owns sessions and runs their inputs one at a time, across every replica.
//!
//! Consumes `<prefix>.run.>` (stream RUNS, durable consumer shared by replicas). Each command is
//! written to the session's inbox in the memory service, acknowledged, and then the replica
//! tries to claim the session's lease; the owner runs the inbox empty, every write fenced by
//! the lease epoch. Produces SystemEvents on `<prefix>.events.<session_id>.<run_id>`, transcript
//! writes through memory's gRPC API, and the final OutboundMessage on `<prefix>.outbound.<channel>`.

mod acks;
mod admission;
mod backfill;
mod backoff;
mod config;
mod context;
mod control;
mod coverage;
mod error;
mod events;
mod guardian;
mod history;
mod hooks;
mod intake;
mod learn;
mod learner;
mod leases;
mod memory;
mod order;
mod owner;
mod preview;
mod prompt;
mod queue_full;
mod recall_cache;
mod replica;
mod run;
mod service;
mod signals;
mod skills;
mod tools;
mod untrusted;

pub use agentloop_lifecycle::MemoryEndpoint;
pub use backfill::{BackfillError, Backfilled, backfill_embeddings};
pub use config::{AgentConfig, MemoryMode, RunnerConfig, RunnerSettings};
pub use context::{Part, PartKind};
pub use error::RunnerError;
pub use guardian::GuardianConfig;
pub use hooks::{ExternalHookConfig, Hook, HookOutcome, HookPoint};
pub use preview::{Preview, PreviewError, PreviewRequest, preview};
pub use tools::mcp::{McpConfig, McpServerConfig};
pub use tools::{SentMessage, Tool, ToolContext, ToolError};

use std::sync::Arc;

/// In-process additions to a runner: tools and hooks given as code rather than configuration.
#[derive(Default, Clone)]
pub struct Extensions {
    /// Extra tools, offered next to the built-ins and the remote ones.
    pub tools: Vec<Arc<dyn Tool>>,
    /// In-process hooks, called before the external ones.
    pub hooks: Vec<Arc<dyn Hook>>,
}

use agentloop_lifecycle::Health;
use tokio_util::sync::CancellationToken;

/// Runs the runner with its own admin server until `shutdown` is cancelled.
///
/// # Errors
/// Only startup failures; a bad command is dead-lettered, a failed run is answered with an error.
pub async fn run(config: RunnerConfig, shutdown: CancellationToken) -> Result<(), RunnerError> {
    run_with(config, shutdown, Extensions::default()).await
}

/// Like [`run`], with in-process tools and hooks.
///
/// # Errors
/// Only startup failures.
pub async fn run_with(
    config: RunnerConfig,
    shutdown: CancellationToken,
    extensions: Extensions,
) -> Result<(), RunnerError> {
    let admin_listen = config.runner.admin_listen.clone();
    agentloop_lifecycle::run_with_admin("runner", &admin_listen, shutdown, |health, shutdown| {
        serve_with(config, health, shutdown, extensions)
    })
    .await
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
    service::serve(config, health, shutdown, Extensions::default()).await
}

/// Like [`serve`], with in-process tools and hooks.
///
/// # Errors
/// Only startup failures.
pub async fn serve_with(
    config: RunnerConfig,
    health: Health,
    shutdown: CancellationToken,
    extensions: Extensions,
) -> Result<(), RunnerError> {
    service::serve(config, health, shutdown, extensions).await
}
