//! The session inbox and the runs that consume it.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{InboxKind, Run, RunOutcome, Store, error::translate};
use crate::MemoryError;

/// An input waiting in a session's inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxItem {
    /// Position in the inbox; also identifies the input's run.
    pub seq: i64,
    /// The key that made the enqueue idempotent.
    pub idempotency_key: String,
    /// `user`, `followup`, `steer`, `collect` or `interrupt`.
    pub kind: String,
    /// The encoded RunCommand.
    pub payload: Vec<u8>,
}

/// The input taken by [`Store::take_next`] and its run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The oldest pending input.
    pub item: InboxItem,
    /// Its run, started or resumed.
    pub run: Run,
}

/// The result of [`Store::enqueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Enqueued {
    /// Whether the input is new (false: its idempotency key was seen before).
    pub inserted: bool,
    /// The input's position in the inbox (the existing row's on a repeat).
    pub seq: i64,
}

#[derive(sqlx::FromRow)]
pub(crate) struct TakeRow {
    pub(crate) held: bool,
    seq: Option<i64>,
    idempotency_key: Option<String>,
    kind: Option<String>,
    payload: Option<Vec<u8>>,
    run_id: Option<Uuid>,
    status: Option<String>,
    attempts: Option<i32>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
pub(crate) struct FinishRow {
    pub(crate) held: bool,
    pub(crate) found: bool,
    pub(crate) finished: bool,
}

/// Runs the fenced finish statement on any executor (the pool, or a transaction).
pub(crate) async fn finish_on<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    session_id: Uuid,
    epoch: i64,
    outcome: &RunOutcome,
) -> Result<FinishRow, sqlx::Error> {
    sqlx::query_as::<_, FinishRow>(include_str!("queries/finish_run.sql"))
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
        .bind(outcome.profile.as_deref())
        .fetch_one(executor)
        .await
}

impl Store {
    /// Puts an input in a session's inbox; returns whether it was new and its seq (the existing
    /// row's when the idempotency key was seen before). Not fenced: any replica may enqueue.
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`], or a database error.
    pub async fn enqueue(
        &self,
        session_id: Uuid,
        idempotency_key: &str,
        kind: InboxKind,
        payload: &[u8],
    ) -> Result<Enqueued, MemoryError> {
        let row = sqlx::query_as::<_, Enqueued>(include_str!("queries/enqueue.sql"))
            .bind(session_id)
            .bind(idempotency_key)
            .bind(kind.as_str())
            .bind(payload)
            .fetch_optional(&self.pool)
            .await
            .map_err(|err| translate(err, session_id))?;
        let row = match row {
            Some(row) => row,
            // A concurrent duplicate committed after this statement's snapshot.
            None => sqlx::query_as::<_, Enqueued>(include_str!("queries/inbox_seq_by_key.sql"))
                .bind(session_id)
                .bind(idempotency_key)
                .fetch_one(&self.pool)
                .await
                .map_err(|err| translate(err, session_id))?,
        };
        Ok(row)
    }

    /// Takes the oldest pending input for the lease holder `epoch` and starts its run (or
    /// resumes it, counting one more attempt); `None` when the inbox is empty.
    ///
    /// # Errors
    /// [`MemoryError::LeaseLost`], [`MemoryError::SessionNotFound`], or a database error.
    pub async fn take_next(
        &self,
        session_id: Uuid,
        epoch: i64,
        owner: &str,
    ) -> Result<Option<Taken>, MemoryError> {
        let row = take_on(&self.pool, session_id, epoch, owner)
            .await
            .map_err(|err| translate(err, session_id))?;
        if !row.held {
            return Err(self.lease_failure(session_id, epoch).await);
        }
        Ok(taken_from(row, session_id))
    }
}

/// Runs the fenced take on any executor (the pool, or a transaction).
pub(crate) async fn take_on<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    session_id: Uuid,
    epoch: i64,
    owner: &str,
) -> Result<TakeRow, sqlx::Error> {
    sqlx::query_as::<_, TakeRow>(include_str!("queries/take_next.sql"))
        .bind(session_id)
        .bind(epoch)
        .bind(owner)
        .bind(Uuid::now_v7())
        .fetch_one(executor)
        .await
}

/// Returns the taken input and its run, `None` when the inbox was empty.
pub(crate) fn taken_from(row: TakeRow, session_id: Uuid) -> Option<Taken> {
    let TakeRow {
        seq: Some(seq),
        idempotency_key: Some(idempotency_key),
        kind: Some(kind),
        payload: Some(payload),
        run_id: Some(run_id),
        status: Some(status),
        attempts: Some(attempts),
        started_at: Some(started_at),
        finished_at,
        ..
    } = row
    else {
        return None;
    };
    Some(Taken {
        item: InboxItem {
            seq,
            idempotency_key,
            kind,
            payload,
        },
        run: Run {
            id: run_id,
            session_id,
            inbox_seq: seq,
            status,
            attempts,
            started_at,
            finished_at,
        },
    })
}

impl Store {
    /// Marks the run's input consumed, the run finished with `outcome` and adds its tokens to
    /// the session, in one transaction fenced by `epoch`. Returns false when a previous call had
    /// already done it (a retry changes nothing).
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
        let row = finish_on(&self.pool, session_id, epoch, outcome)
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
        Ok(row.finished)
    }
}
