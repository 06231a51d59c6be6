//! The run path's calls, enqueues and run ends, gathered into one batch: when both kinds wait
//! at once they go to Postgres as one statement (`agentloop_run_path`), one round trip and one
//! commit, run ends first.

use std::sync::Arc;

use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool};

use super::batch::{self, BatchCounters, BatchSettings, Batcher};
use super::finish::{self, FinishArgs, FinishRow, IndexedFinishRow};
use super::held::Held;
use super::inbox::{self, EnqueueArgs, EnqueueRow, IndexedEnqueueRow};
use crate::MemoryError;

/// One call of the run path.
pub(crate) enum Call {
    Enqueue(EnqueueArgs),
    Finish(FinishArgs),
}

/// What a [`Call`] answered, of the same kind.
// Moved a few times per call; boxing the large variant would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Answer {
    Enqueue(EnqueueRow),
    Finish(FinishRow),
}

/// The batched calls of the run path.
#[derive(Debug)]
pub(crate) struct RunPath {
    batcher: Batcher<Call, Answer>,
    connections: Arc<LaneConnections>,
}

impl RunPath {
    /// Returns the run path, batching as `settings` say, on connections of its own opened with
    /// `shared`'s options, one per lane.
    pub(crate) fn new(shared: &PgPool, settings: BatchSettings, counters: &BatchCounters) -> Self {
        // The shared pool hands out its idle connections oldest first, so consecutive batches
        // would rotate over every backend it ever opened, each cold in the CPU's caches. A lane
        // that always finds the same backend cost Postgres about a tenth less CPU per run at one
        // session (bench/HISTORY.md).
        let lanes = u32::try_from(settings.lanes.max(1)).unwrap_or(u32::MAX);
        let pool = PgPoolOptions::new()
            .max_connections(lanes)
            .acquire_timeout(shared.options().get_acquire_timeout())
            .test_before_acquire(shared.options().get_test_before_acquire())
            .connect_lazy_with((*shared.connect_options()).clone());
        let batch_counters = counters.clone();
        let connections = Arc::new(LaneConnections(Held::new(pool, settings.lanes.max(1))));
        let lanes = connections.clone();
        Self {
            batcher: Batcher::new(
                settings,
                counters.clone(),
                Arc::new(move |calls| {
                    let (lanes, counters) = (lanes.clone(), batch_counters.clone());
                    Box::pin(async move { lanes.execute(calls, &counters).await })
                }),
            ),
            connections,
        }
    }

    /// Closes the lanes' connections: those held at once, each one still in a batch once that
    /// batch is over.
    pub(crate) async fn close(&self) {
        self.connections.0.release();
        self.connections.0.pool().close().await;
    }

    /// Runs one enqueue (as `agentloop_enqueue` answers it) in the next batch.
    pub(crate) async fn enqueue(&self, args: EnqueueArgs) -> Result<EnqueueRow, MemoryError> {
        match self.batcher.call(Call::Enqueue(args)).await? {
            Answer::Enqueue(row) => Ok(row),
            Answer::Finish(_) => Err(mismatch()),
        }
    }

    /// Runs one run end (as `agentloop_finish_run` answers it) in the next batch.
    pub(crate) async fn finish(&self, args: FinishArgs) -> Result<FinishRow, MemoryError> {
        match self.batcher.call(Call::Finish(args)).await? {
            Answer::Finish(row) => Ok(row),
            Answer::Enqueue(_) => Err(mismatch()),
        }
    }
}

/// The error for an answer of the wrong kind (a bug in `execute`, never expected).
fn mismatch() -> MemoryError {
    MemoryError::Internal("a run-path call was answered for a call of the other kind".to_owned())
}

/// The lanes' connections, held from one batch to the next (see [`Held`]).
#[derive(Debug)]
struct LaneConnections(Held);

impl LaneConnections {
    /// Runs a batch on a held connection (or one from the pool), then keeps the connection
    /// for the next batch unless a call failed in a way that may have broken it.
    async fn execute(
        &self,
        calls: Vec<Call>,
        counters: &BatchCounters,
    ) -> Vec<Result<Answer, MemoryError>> {
        let mut conn = match self.0.acquire().await {
            Ok(conn) => conn,
            Err(err) => return batch::unavailable(calls.len(), &err),
        };
        let results = execute(&mut conn, calls, counters).await;
        // Postgres refusing a call leaves the connection as good as before; anything else
        // (an I/O error, an answer that could not be read) may have broken it.
        conn.keep_if(!results.iter().any(|result| {
            matches!(
                result,
                Err(MemoryError::Unavailable(_) | MemoryError::Internal(_))
            )
        }));
        results
    }
}

/// Runs a batch: a batch of one kind through that kind's batch function, both kinds as one
/// `agentloop_run_path`. Returns one result per call, in call order.
async fn execute(
    conn: &mut PgConnection,
    calls: Vec<Call>,
    counters: &BatchCounters,
) -> Vec<Result<Answer, MemoryError>> {
    let n = calls.len();
    let (mut enqueues, mut enqueue_at) = (Vec::new(), Vec::new());
    let (mut finishes, mut finish_at) = (Vec::new(), Vec::new());
    for (at, call) in calls.into_iter().enumerate() {
        match call {
            Call::Enqueue(args) => {
                enqueue_at.push(at);
                enqueues.push(args);
            }
            Call::Finish(args) => {
                finish_at.push(at);
                finishes.push(args);
            }
        }
    }
    let (finished, enqueued) = if enqueues.is_empty() {
        (
            finish::finish_batch(conn, finishes, counters).await,
            Vec::new(),
        )
    } else if finishes.is_empty() {
        (
            Vec::new(),
            inbox::enqueue_batch(conn, enqueues, counters).await,
        )
    } else {
        both(conn, finishes, enqueues, counters).await
    };
    let mut results: Vec<Option<Result<Answer, MemoryError>>> = (0..n).map(|_| None).collect();
    for (at, result) in finish_at.into_iter().zip(finished) {
        results[at] = Some(result.map(Answer::Finish));
    }
    for (at, result) in enqueue_at.into_iter().zip(enqueued) {
        results[at] = Some(result.map(Answer::Enqueue));
    }
    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| {
                Err(MemoryError::Internal(
                    "the run-path batch carrying this call gave it no answer".to_owned(),
                ))
            })
        })
        .collect()
}

/// A row of `agentloop_run_path`: an item of either half.
#[allow(clippy::large_enum_variant)] // as `Answer`
enum Row {
    Finish(IndexedFinishRow),
    Enqueue(IndexedEnqueueRow),
}

impl<'r> sqlx::FromRow<'r, PgRow> for Row {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        if row.try_get::<bool, _>("is_finish")? {
            IndexedFinishRow::from_row(row).map(Self::Finish)
        } else {
            IndexedEnqueueRow::from_row(row).map(Self::Enqueue)
        }
    }
}

/// The answers of a batch of both kinds: run ends, then enqueues, each in its calls' order.
type Halves = (
    Vec<Result<FinishRow, MemoryError>>,
    Vec<Result<EnqueueRow, MemoryError>>,
);

/// Both halves in one statement; when it fails for a reason that rolled it back, each half on
/// its own (run ends first), where a failing batch runs its calls one by one.
async fn both(
    conn: &mut PgConnection,
    finishes: Vec<FinishArgs>,
    enqueues: Vec<EnqueueArgs>,
    counters: &BatchCounters,
) -> Halves {
    let finish_order = batch::lock_order(&finishes, |call| call.session_id);
    let enqueue_order = batch::lock_order(&enqueues, |call| call.session_id);
    let answered = {
        let finish_ordered: Vec<&FinishArgs> = finish_order.iter().map(|&i| &finishes[i]).collect();
        let enqueue_ordered: Vec<&EnqueueArgs> =
            enqueue_order.iter().map(|&i| &enqueues[i]).collect();
        let query = sqlx::query_as::<_, Row>(include_str!("queries/run_path.sql"));
        let query = finish::bind_many(query, &finish_ordered);
        inbox::bind_many(query, &enqueue_ordered)
            .fetch_all(&mut *conn)
            .await
    };
    let (finish_calls, enqueue_calls) = (finishes.len(), enqueues.len());
    match answered {
        Ok(rows) => {
            counters.combined.inc();
            let (mut finish_rows, mut enqueue_rows) = (Vec::new(), Vec::new());
            for row in rows {
                match row {
                    Row::Finish(r) => finish_rows.push((r.idx, r.row)),
                    Row::Enqueue(r) => enqueue_rows.push((r.idx, r.row)),
                }
            }
            (
                batch::settle_rows("finish", finish_rows, &finish_order),
                batch::settle_rows("enqueue", enqueue_rows, &enqueue_order),
            )
        }
        Err(err) => match batch::judge("run-path", &err, finish_calls + enqueue_calls, counters) {
            // Refused and rolled back: each half on its own, run ends first.
            None => {
                let finished = finish::finish_batch(conn, finishes, counters).await;
                let enqueued = inbox::enqueue_batch(conn, enqueues, counters).await;
                (finished, enqueued)
            }
            Some(failure) => (
                failure.answers("finish", &err, finish_calls),
                failure.answers("enqueue", &err, enqueue_calls),
            ),
        },
    }
}
