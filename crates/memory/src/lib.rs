//! Memory service: owns the Postgres database of agentloop (sessions, transcripts, the
//! per-session inbox and its fenced lease, runs, usage, auth-profile cooldowns, long-term
//! memory) and its migrations. Consumes SessionService gRPC calls from the router and the
//! runners; produces rows, and answers with them. No other service opens the database.
//!
//! Every write of a run is fenced by the session's lease epoch inside the statement that
//! performs it, so a replica that lost its lease cannot write (STACK.md §2, design c2).

mod auth;
mod config;
mod error;
mod grpc;
mod server;
mod store;

pub use config::{MemoryConfig, MemorySettings};
pub use error::MemoryError;
pub use server::Memory;
pub use store::{
    BatchCounters, BatchSettings, Caller, Claim, DispatchLookup, Enqueued, Entry, Finished,
    HistoryAsk, InboxItem, InboxKind, NewEntry, Run, RunOutcome, RunStatus, Session, SessionInfo,
    SessionPatch, Store, Taken,
};

use agentloop_lifecycle::{AdminServer, Health};
use tokio_util::sync::CancellationToken;

/// Binds the admin server (`[memory] admin_listen`, logging its address) and the gRPC server,
/// and serves both until `shutdown` is cancelled.
///
/// # Errors
/// [`MemoryError::Bind`] when an address cannot be bound, or what [`Memory::serve`] returns.
/// An unreachable database is not an error: the service waits for it, not ready.
pub async fn run(config: MemoryConfig, shutdown: CancellationToken) -> Result<(), MemoryError> {
    let health = Health::new();
    let admin_addr = match config.memory.admin_listen.as_str() {
        "" => "127.0.0.1:0".to_owned(),
        addr => addr.to_owned(),
    };
    let bind_error = |source| MemoryError::Bind {
        addr: admin_addr.clone(),
        source,
    };
    let admin = AdminServer::bind(&admin_addr, health.clone())
        .await
        .map_err(bind_error)?;
    let admin_local = admin.local_addr().map_err(bind_error)?;
    tracing::info!(addr = %admin_local, "memory admin listening (/healthz, /readyz, /metrics)");
    let memory = Memory::bind(config, health).await?;
    // The admin server outlives a failed gRPC server only until that failure is returned.
    let admin_stop = shutdown.child_token();
    let admin_task = admin.serve(admin_stop.clone());
    let serve = async {
        let served = memory.serve(shutdown).await;
        admin_stop.cancel();
        served
    };
    let ((), served) = tokio::join!(admin_task, serve);
    served
}
