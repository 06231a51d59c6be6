//! The end of a run in one transaction: its last transcript entries, the finished run and the
//! consumed input, and the lease given back when nothing else is pending. One commit instead of
//! three on the hot path.

use uuid::Uuid;

use super::inbox::finish_on;
use super::sessions::release_on;
use super::transcript::append_on;
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
        let fail = |err| translate(err, session_id);
        let mut tx = self.pool.begin().await.map_err(fail)?;
        if !entries.is_empty() {
            let appended = append_on(&mut *tx, session_id, epoch, entries)
                .await
                .map_err(fail)?;
            if !appended.held {
                drop(tx);
                return Err(self.lease_failure(session_id, epoch).await);
            }
        }
        let row = finish_on(&mut *tx, session_id, epoch, outcome)
            .await
            .map_err(fail)?;
        if !row.held {
            drop(tx);
            return Err(self.lease_failure(session_id, epoch).await);
        }
        if !row.found {
            return Err(MemoryError::RunNotFound {
                run_id: outcome.run_id,
                inbox_seq: outcome.inbox_seq,
            });
        }
        // A later statement of the same transaction sees this run's input as consumed.
        let released = if release_if_idle {
            release_on(&mut *tx, session_id, epoch)
                .await
                .map_err(fail)?
        } else {
            false
        };
        tx.commit().await.map_err(fail)?;
        Ok(Finished {
            finished: row.finished,
            released,
        })
    }
}
