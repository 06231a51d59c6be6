//! The session inbox and the runs that consume it.

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use uuid::Uuid;

use super::{InboxKind, Run, Store, error::translate};
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
    /// The input's position in the inbox (the existing row's on a repeat; 0 when refused).
    pub seq: i64,
    /// Refused: the session already had `memory.inbox_max_pending` inputs pending, so nothing
    /// was stored (`inserted` is false and `seq` 0). Never set for a repeated key, which is
    /// answered with its stored row whether or not the inbox is full.
    pub queue_full: bool,
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

/// The row `agentloop_enqueue` returns: the enqueue, the claim, the take (as
/// `agentloop_take` returns it) and the history window.
#[derive(sqlx::FromRow)]
pub(crate) struct EnqueueRow {
    session_found: bool,
    inserted: Option<bool>,
    enqueued_seq: Option<i64>,
    pub(crate) claimed: Option<bool>,
    pub(crate) epoch: Option<i64>,
    pub(crate) owner: Option<String>,
    #[sqlx(flatten)]
    take: TakeRow,
    #[sqlx(flatten)]
    history: HistoryWindow,
}

/// A history window as `agentloop_history_window` returns it: parallel arrays, oldest first.
#[derive(sqlx::FromRow, Default)]
pub(crate) struct HistoryWindow {
    /// Whether the arrays hold only the entries after the caller's copy.
    h_delta: Option<bool>,
    h_seq: Option<Vec<i64>>,
    h_key: Option<Vec<String>>,
    h_role: Option<Vec<String>>,
    h_content: Option<Vec<String>>,
    h_run_id: Option<Vec<Option<Uuid>>>,
    h_tool_call_id: Option<Vec<Option<String>>>,
    h_tool_name: Option<Vec<Option<String>>>,
    h_data: Option<Vec<Option<String>>>,
    h_created_at: Option<Vec<DateTime<Utc>>>,
}

impl HistoryWindow {
    /// Returns whether the window is a delta, and its entries oldest first.
    pub(crate) fn into_entries(self) -> (bool, Vec<super::Entry>) {
        let seqs = self.h_seq.unwrap_or_default();
        let mut keys = self.h_key.unwrap_or_default().into_iter();
        let mut roles = self.h_role.unwrap_or_default().into_iter();
        let mut contents = self.h_content.unwrap_or_default().into_iter();
        let mut run_ids = self.h_run_id.unwrap_or_default().into_iter();
        let mut call_ids = self.h_tool_call_id.unwrap_or_default().into_iter();
        let mut names = self.h_tool_name.unwrap_or_default().into_iter();
        let mut data = self.h_data.unwrap_or_default().into_iter();
        let mut created = self.h_created_at.unwrap_or_default().into_iter();
        let entries = seqs
            .into_iter()
            .map(|seq| super::Entry {
                seq,
                key: keys.next().unwrap_or_default(),
                role: roles.next().unwrap_or_default(),
                content: contents.next().unwrap_or_default(),
                run_id: run_ids.next().flatten(),
                tool_call_id: call_ids.next().flatten(),
                tool_name: names.next().flatten(),
                data: data.next().flatten(),
                created_at: created.next().unwrap_or_else(Utc::now),
            })
            .collect();
        (self.h_delta.unwrap_or(false), entries)
    }
}

/// With an owner, [`enqueue_call`] also claims; with a history limit too, it takes and reads.
pub(crate) struct ClaimAlong<'a> {
    pub(crate) owner: &'a str,
    pub(crate) ttl_ms: i64,
    pub(crate) take_with_history: Option<super::HistoryAsk>,
}

/// One `agentloop_enqueue` call, owned so it can wait for a batch.
pub(crate) struct EnqueueArgs {
    pub(crate) session_id: Uuid,
    key: String,
    kind: &'static str,
    payload: Vec<u8>,
    owner: Option<String>,
    ttl_ms: Option<i64>,
    history_limit: Option<i64>,
    history_after: i64,
}

/// Calls `agentloop_enqueue` (in the next batch): the insert and, with `claim`, the claim, take
/// and history read, in one round trip.
pub(crate) async fn enqueue_call(
    store: &Store,
    session_id: Uuid,
    idempotency_key: &str,
    kind: InboxKind,
    payload: &[u8],
    claim: Option<ClaimAlong<'_>>,
) -> Result<EnqueueRow, MemoryError> {
    let take = claim.as_ref().and_then(|c| c.take_with_history);
    let args = EnqueueArgs {
        session_id,
        key: idempotency_key.to_owned(),
        kind: kind.as_str(),
        payload: payload.to_vec(),
        owner: claim.as_ref().map(|c| c.owner.to_owned()),
        ttl_ms: claim.as_ref().map(|c| c.ttl_ms),
        history_limit: take.map(|h| i64::from(h.limit)),
        history_after: take.map_or(0, |h| h.after_seq),
    };
    let row = store.run_path.enqueue(args).await?;
    if !row.session_found {
        return Err(MemoryError::SessionNotFound(session_id));
    }
    Ok(row)
}

/// An [`EnqueueRow`] with the item's 1-based position in its batch.
#[derive(sqlx::FromRow)]
pub(crate) struct IndexedEnqueueRow {
    pub(crate) idx: i32,
    #[sqlx(flatten)]
    pub(crate) row: EnqueueRow,
}

/// Runs a batch of enqueues: one alone as `agentloop_enqueue`, more as one
/// `agentloop_enqueue_many` in lock order; when the batch fails, each on its own.
pub(crate) async fn enqueue_batch(
    conn: &mut sqlx::PgConnection,
    items: Vec<EnqueueArgs>,
    counters: &super::BatchCounters,
) -> Vec<Result<EnqueueRow, MemoryError>> {
    if items.len() > 1 {
        let order = super::batch::lock_order(&items, |item| item.session_id);
        let ordered: Vec<&EnqueueArgs> = order.iter().map(|&i| &items[i]).collect();
        let query =
            sqlx::query_as::<_, IndexedEnqueueRow>(include_str!("queries/enqueue_many.sql"));
        let rows = bind_many(query, &ordered).fetch_all(&mut *conn).await;
        let answered = rows.map(|rows| rows.into_iter().map(|r| (r.idx, r.row)).collect());
        if let Some(settled) = super::batch::settle("enqueue", answered, &order, counters) {
            return settled;
        }
    }
    super::batch::one_by_one(conn, &items, enqueue_one).await
}

/// Binds the arrays of `agentloop_enqueue_many`, one element per call in `ordered`.
pub(crate) fn bind_many<'q, O>(
    query: QueryAs<'q, Postgres, O, PgArguments>,
    ordered: &[&'q EnqueueArgs],
) -> QueryAs<'q, Postgres, O, PgArguments> {
    use super::batch::column;
    query
        .bind(column(ordered, |a| a.session_id))
        .bind(column(ordered, |a| a.key.as_str()))
        .bind(column(ordered, |a| a.kind))
        .bind(column(ordered, |a| a.payload.as_slice()))
        .bind(column(ordered, |a| a.owner.as_deref()))
        .bind(column(ordered, |a| a.ttl_ms))
        .bind(column(ordered, |a| a.history_limit))
        .bind(column(ordered, |a| a.history_after))
}

async fn enqueue_one(
    conn: &mut sqlx::PgConnection,
    item: &EnqueueArgs,
) -> Result<EnqueueRow, MemoryError> {
    sqlx::query_as::<_, EnqueueRow>(include_str!("queries/enqueue.sql"))
        .bind(item.session_id)
        .bind(item.key.as_str())
        .bind(item.kind)
        .bind(item.payload.as_slice())
        .bind(item.owner.as_deref())
        .bind(item.ttl_ms)
        .bind(item.history_limit)
        .bind(item.history_after)
        .fetch_one(conn)
        .await
        .map_err(|err| translate(err, item.session_id))
}

impl EnqueueRow {
    /// Whether the input was new, and its seq, or that the inbox cap refused it.
    pub(crate) fn enqueued(&self) -> Enqueued {
        let inserted = self.inserted.unwrap_or(false);
        Enqueued {
            inserted,
            seq: self.enqueued_seq.unwrap_or_default(),
            // The cap's trigger skips the row, so the enqueue functions find it neither
            // inserted nor stored under its key (a repeat would have found its row).
            queue_full: self.session_found && !inserted && self.enqueued_seq.is_none(),
        }
    }

    /// The input taken along with its run (when there was one), and the history read along.
    pub(crate) fn taken(self, session_id: Uuid) -> (Option<Taken>, (bool, Vec<super::Entry>)) {
        (
            taken_from(self.take, session_id),
            self.history.into_entries(),
        )
    }
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
        enqueue_call(self, session_id, idempotency_key, kind, payload, None)
            .await
            .map(|row| row.enqueued())
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
        let mut conn = self.conn(session_id).await?;
        let taken = take_on(&mut *conn, session_id, epoch, owner).await;
        let row = conn
            .settle(taken)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::synchronous_commit;
    use sqlx::PgPool;

    fn args(session_id: Uuid, key: &str) -> EnqueueArgs {
        EnqueueArgs {
            session_id,
            key: key.to_owned(),
            kind: InboxKind::User.as_str(),
            payload: key.as_bytes().to_vec(),
            owner: Some("runner-a".to_owned()),
            ttl_ms: Some(60_000),
            history_limit: Some(50),
            history_after: 0,
        }
    }

    #[sqlx::test(migrations = "./migrations")]
    async fn an_enqueue_commits_without_waiting_for_the_disk_and_a_flush_makes_it_durable(
        pool: PgPool,
    ) {
        let store = Store::new(pool);
        let session = store
            .resolve_session("cli:async", "main", Some("cli"))
            .await
            .unwrap();
        let one = args(session.id, "k1");
        let mut tx = store.pool().begin().await.unwrap();
        let row = enqueue_one(&mut tx, &one).await.unwrap();
        assert_eq!(synchronous_commit(&mut *tx).await, "off", "a lone enqueue");
        tx.commit().await.unwrap();
        let seq = row.enqueued().seq;

        let (two, three) = (args(session.id, "k2"), args(session.id, "k3"));
        let mut tx = store.pool().begin().await.unwrap();
        let rows = bind_many(
            sqlx::query_as::<_, IndexedEnqueueRow>(include_str!("queries/enqueue_many.sql")),
            &[&two, &three],
        )
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(rows.len(), 2, "one row per enqueue");
        assert_eq!(
            synchronous_commit(&mut *tx).await,
            "off",
            "a batch of enqueues"
        );
        tx.commit().await.unwrap();

        // The setting ended with each transaction: what runs next on the connection waits for
        // the disk again, and the flush (what the runner's acks wait for) finds the row.
        let mut conn = store.pool().acquire().await.unwrap();
        assert_eq!(synchronous_commit(&mut *conn).await, "on");
        let durable = store
            .flush(&[(seq, "k1".to_owned()), (seq, "not-k1".to_owned())])
            .await
            .unwrap();
        assert_eq!(durable, vec![(seq, "k1".to_owned())]);
    }
}
