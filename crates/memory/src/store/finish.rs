//! The end of a run in one round trip: its last transcript entries, the finished run and the
//! consumed input, and the lease given back when nothing else is pending.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
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
pub(crate) struct FinishRow {
    held: bool,
    found: bool,
    finished: bool,
    released: bool,
}

/// A [`FinishRow`] with the item's 1-based position in its batch.
#[derive(sqlx::FromRow)]
pub(crate) struct IndexedFinishRow {
    pub(crate) idx: i32,
    #[sqlx(flatten)]
    pub(crate) row: FinishRow,
}

/// One `agentloop_finish_run` call, owned so it can wait for a batch.
pub(crate) struct FinishArgs {
    pub(crate) session_id: Uuid,
    epoch: i64,
    outcome: RunOutcome,
    entries: Vec<NewEntry>,
    release: bool,
}

/// Runs a batch of run ends: one alone as `agentloop_finish_run`, more as one
/// `agentloop_finish_many` in lock order; when the batch fails, each on its own.
pub(crate) async fn finish_batch(
    conn: &mut sqlx::PgConnection,
    items: Vec<FinishArgs>,
    counters: &super::BatchCounters,
) -> Vec<Result<FinishRow, MemoryError>> {
    if items.len() > 1 {
        let order = super::batch::lock_order(&items, |item| item.session_id);
        let ordered: Vec<&FinishArgs> = order.iter().map(|&i| &items[i]).collect();
        let query = sqlx::query_as::<_, IndexedFinishRow>(include_str!("queries/finish_many.sql"));
        let rows = bind_many(query, &ordered).fetch_all(&mut *conn).await;
        let answered = rows.map(|rows| rows.into_iter().map(|r| (r.idx, r.row)).collect());
        if let Some(settled) = super::batch::settle("finish", answered, &order, counters) {
            return settled;
        }
    }
    super::batch::one_by_one(conn, &items, finish_one).await
}

/// Binds the arrays of `agentloop_finish_many`, one element per call in `ordered` (and the
/// calls' entries, one after the other).
pub(crate) fn bind_many<'q, O>(
    query: QueryAs<'q, Postgres, O, PgArguments>,
    ordered: &[&'q FinishArgs],
) -> QueryAs<'q, Postgres, O, PgArguments> {
    use super::batch::column;
    let entry_ends: Vec<i32> = ordered
        .iter()
        .scan(0_i32, |end, call| {
            *end += i32::try_from(call.entries.len()).unwrap_or(i32::MAX);
            Some(*end)
        })
        .collect();
    let query = query
        .bind(column(ordered, |a| a.session_id))
        .bind(column(ordered, |a| a.epoch))
        .bind(column(ordered, |a| a.outcome.run_id))
        .bind(column(ordered, |a| a.outcome.inbox_seq))
        .bind(column(ordered, |a| a.outcome.status.as_str()))
        .bind(column(ordered, |a| a.outcome.error.as_deref()))
        .bind(column(ordered, |a| a.outcome.model.as_deref()))
        .bind(column(ordered, |a| a.outcome.input_tokens))
        .bind(column(ordered, |a| a.outcome.output_tokens))
        .bind(column(ordered, |a| a.outcome.provider.as_deref()))
        .bind(column(ordered, |a| a.outcome.profile.as_deref()))
        .bind(column(ordered, |a| a.release))
        .bind(entry_ends);
    // The entries are bound where they lie, run after run in lock order, not copied.
    bind_entries(query, ordered.iter().flat_map(|call| call.entries.iter()))
        .bind(column(ordered, |a| a.outcome.prompt_report.as_deref()))
}

async fn finish_one(
    conn: &mut sqlx::PgConnection,
    item: &FinishArgs,
) -> Result<FinishRow, MemoryError> {
    let outcome = &item.outcome;
    let query = sqlx::query_as::<_, FinishRow>(include_str!("queries/finish_run.sql"))
        .bind(item.session_id)
        .bind(item.epoch)
        .bind(outcome.run_id)
        .bind(outcome.inbox_seq)
        .bind(outcome.status.as_str())
        .bind(outcome.error.as_deref())
        .bind(outcome.model.as_deref())
        .bind(outcome.input_tokens)
        .bind(outcome.output_tokens)
        .bind(outcome.provider.as_deref())
        .bind(outcome.profile.as_deref());
    bind_entries(query, item.entries.iter())
        .bind(item.release)
        .bind(outcome.prompt_report.as_deref())
        .fetch_one(conn)
        .await
        .map_err(|err| translate(err, item.session_id))
}

impl Store {
    /// Appends `entries`, finishes the run and, when `release_if_idle` and no other input is
    /// pending, gives the lease back, all fenced by `epoch` in one transaction (shared with
    /// other sessions' run ends that arrive at the same time).
    ///
    /// # Errors
    /// [`MemoryError::LeaseLost`], [`MemoryError::RunNotFound`], or a database error.
    pub async fn finish_run_and_release(
        &self,
        session_id: Uuid,
        epoch: i64,
        outcome: RunOutcome,
        entries: Vec<NewEntry>,
        release_if_idle: bool,
    ) -> Result<Finished, MemoryError> {
        let (run_id, inbox_seq) = (outcome.run_id, outcome.inbox_seq);
        let row = self
            .run_path
            .finish(FinishArgs {
                session_id,
                epoch,
                outcome,
                entries,
                release: release_if_idle,
            })
            .await?;
        if !row.held {
            return Err(self.lease_failure(session_id, epoch).await);
        }
        if !row.found {
            return Err(MemoryError::RunNotFound { run_id, inbox_seq });
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
        self.finish_run_and_release(session_id, epoch, outcome.clone(), Vec::new(), false)
            .await
            .map(|finished| finished.finished)
    }
}
