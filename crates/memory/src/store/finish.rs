//! The end of a run in one round trip: its last transcript entries, the finished run and the
//! consumed input, and the lease given back when nothing else is pending.

use uuid::Uuid;

use super::transcript::bind_entries;
use super::{NewEntry, RunOutcome, Store, error::translate};
use crate::MemoryError;

/// What [`Store::finish_run_and_release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// False when an earlier call already finished the run.
    pub finished: bool,
    /// Whether the lease was given back.
    pub released: bool,
}

#[derive(sqlx::FromRow)]
struct FinishRow {
    held: bool,
    found: bool,
    finished: bool,
    released: bool,
}

impl Store {
    /// Appends `entries`, finishes the run and, when `release_if_idle` and no other input is
    /// pending, gives the lease back, all fenced by `epoch` in one transaction.
    ///
    /// # Errors
    /// [`MemoryError::LeaseLost`], [`MemoryError::RunNotFound`], or a database error.
    pub async fn finish_run_and_release(
        &self,
        session_id: Uuid,
        epoch: i64,
        outcome: &RunOutcome,
        entries: &[NewEntry],
        release_if_idle: bool,
    ) -> Result<Finished, MemoryError> {
        let query = sqlx::query_as::<_, FinishRow>(include_str!("queries/finish_run.sql"))
            .bind(session_id)
            .bind(epoch)
            .bind(outcome.run_id)
            .bind(outcome.inbox_seq)
            .bind(outcome.status.as_str())
            .bind(outcome.error.as_deref())
            .bind(outcome.model.as_deref())
            .bind(outcome.input_tokens)
            .bind(outcome.output_tokens)
            .bind(outcome.provider.as_deref())
            .bind(outcome.profile.as_deref());
        let row = bind_entries(query, entries)
            .bind(release_if_idle)
            .fetch_one(&self.pool)
            .await
            .map_err(|err| translate(err, session_id))?;
        if !row.held {
            return Err(self.lease_failure(session_id, epoch).await);
        }
        if !row.found {
            return Err(MemoryError::RunNotFound {
                run_id: outcome.run_id,
                inbox_seq: outcome.inbox_seq,
            });
        }
        Ok(Finished {
            finished: row.finished,
            released: row.released,
        })
    }

    /// Marks the run's input consumed, the run finished with `outcome` and adds its tokens to
    /// the session, in one transaction fenced by `epoch`; keeps the lease. Returns false when a
    /// previous call had already done it (a retry changes nothing).
    ///
    /// # Errors
    /// [`MemoryError::LeaseLost`], [`MemoryError::SessionNotFound`],
    /// [`MemoryError::RunNotFound`] when the run is not this session's run of that input, or a
    /// database error.
    pub async fn finish_run(
        &self,
        session_id: Uuid,
        epoch: i64,
        outcome: &RunOutcome,
    ) -> Result<bool, MemoryError> {
        self.finish_run_and_release(session_id, epoch, outcome, &[], false)
            .await
            .map(|finished| finished.finished)
    }
}
