//! One reading of what waits in memory (`agentloop_gauges` in SQL, migration 0020).

use uuid::Uuid;

use super::{Store, error::translate};
use crate::MemoryError;

/// What waits in memory at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Sessions whose lease is held (a run live or about to start).
    pub sessions_active: i64,
    /// Inputs not yet consumed, by inbox kind (`user`, `followup`, `steer`, …).
    pub inbox_pending: Vec<(String, i64)>,
    /// Sessions holding their lease with an input waiting past the stuck threshold.
    pub sessions_stuck: i64,
    /// Tool calls waiting for an operator's decision.
    pub approvals_pending: i64,
}

impl Store {
    /// Reads what waits now; an input pending longer than `stuck_ms` in a held session makes
    /// it stuck.
    ///
    /// # Errors
    /// A database error.
    pub async fn waiting(&self, stuck_ms: u64) -> Result<Waiting, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT name, label, value FROM agentloop_gauges($1)")
                .bind(i64::try_from(stuck_ms).unwrap_or(i64::MAX))
                .fetch_all(&mut *conn)
                .await
                .map_err(|err| translate(err, Uuid::nil()))?;
        let mut waiting = Waiting::default();
        for (name, label, value) in rows {
            match name.as_str() {
                "sessions_active" => waiting.sessions_active = value,
                "inbox_pending" => waiting.inbox_pending.push((label, value)),
                "sessions_stuck" => waiting.sessions_stuck = value,
                "approvals_pending" => waiting.approvals_pending = value,
                other => tracing::debug!(gauge = other, "unknown gauge from agentloop_gauges"),
            }
        }
        Ok(waiting)
    }
}
