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
mod gauges;
mod grpc;
mod server;
mod store;

pub use config::{MemoryConfig, MemorySettings};
pub use error::MemoryError;
pub use server::Memory;
pub use store::{
    BatchCounters, BatchSettings, Caller, Claim, DispatchLookup, Enqueued, Entry, Finished,
    HistoryAsk, InboxItem, InboxKind, NewEntry, Run, RunOutcome, RunStatus, Session, SessionInfo,
    SessionPatch, Store, Taken, Waiting,
};

use agentloop_lifecycle::AdminError;
use tokio_util::sync::CancellationToken;

/// Binds the admin server (`[memory] admin_listen`, logging its address) and the gRPC server,
/// and serves both until `shutdown` is cancelled.
///
/// # Errors
/// [`MemoryError::Bind`] when an address cannot be bound, or what [`Memory::serve`] returns.
/// An unreachable database is not an error: the service waits for it, not ready.
pub async fn run(config: MemoryConfig, shutdown: CancellationToken) -> Result<(), MemoryError> {
    let admin_listen = config.memory.admin_listen.clone();
    agentloop_lifecycle::run_with_admin(
        "memory",
        &admin_listen,
        shutdown,
        |health, shutdown| async move { Memory::bind(config, health).await?.serve(shutdown).await },
    )
    .await
}

impl From<AdminError> for MemoryError {
    fn from(err: AdminError) -> Self {
        Self::Bind {
            addr: err.addr,
            source: err.source,
        }
    }
}
