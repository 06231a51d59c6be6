//! The Postgres store: one method per SessionService operation, each a single statement (one
//! round trip) so the hot path stays cheap; enqueues and run ends arriving together share one
//! statement and one commit (see `batch`). Every write of a run is fenced by the lease epoch
//! inside the statement that performs it.

mod batch;
pub(crate) mod cooldowns;
pub(crate) mod error;
mod finish;
mod gateway;
mod gauges;
pub(crate) mod guard;
mod held;
mod inbox;
pub(crate) mod learn;
pub(crate) mod memories;
mod queued;
mod run_path;
pub use batch::{BatchCounters, BatchSettings};
pub use finish::Finished;
mod sessions;
mod transcript;
pub(crate) mod usage;

use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::MemoryError;

pub use gateway::{Caller, Dispatch, DispatchLookup, SessionInfo, SessionPatch};
pub use gauges::Waiting;

pub use guard::{ApprovalAsk, ApprovalRow, AuditRow, PairedSender};
pub use inbox::{Enqueued, InboxItem, Taken};
pub use learn::LearnJob;
pub use memories::{Embedding, Memory, MemoryScope, SkillSnapshot};
pub use sessions::Claim;

/// The memory store over a Postgres pool. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    /// The shared pool, for every call but the run path's batches.
    shared: Arc<held::Held>,
    run_path: Arc<run_path::RunPath>,
    /// When this replica next sweeps expired dispatch records (`None`: at the next dispatch).
    next_dispatch_sweep: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Recently searched users' memories with their vectors, for hybrid search.
    vectors: Arc<memories::VectorCache>,
}

impl Store {
    /// Returns a store over an already migrated pool, batching with the default settings.
    pub fn new(pool: PgPool) -> Self {
        Self::with_batching(pool, BatchSettings::default(), &BatchCounters::default())
    }

    /// Returns a store over an already migrated pool whose enqueues and run ends are gathered
    /// into batches as `settings` say, counted in `counters`. The batches get connections of
    /// their own, one per lane, opened with the pool's options.
    pub fn with_batching(pool: PgPool, settings: BatchSettings, counters: &BatchCounters) -> Self {
        let run_path = run_path::RunPath::new(&pool, settings, counters);
        // Half the pool at most is held idle (none of a pool of one), so callers of `pool()`
        // always find room in it.
        let keep = usize::try_from(pool.options().get_max_connections() / 2).unwrap_or(0);
        Self {
            shared: Arc::new(held::Held::new(pool, keep)),
            run_path: Arc::new(run_path),
            next_dispatch_sweep: Arc::default(),
            vectors: Arc::new(memories::VectorCache::new(
                memories::DEFAULT_VECTOR_CACHE_BYTES,
            )),
        }
    }

    /// This store, keeping at most `bytes` of recently searched users' vectors for hybrid
    /// search (0: none kept; every hybrid search reads the user's vectors).
    #[must_use]
    pub fn with_vector_cache(mut self, bytes: usize) -> Self {
        self.vectors = Arc::new(memories::VectorCache::new(bytes));
        self
    }

    /// Closes the pools: waits for connections in use to come back, then closes them all.
    pub async fn close(&self) {
        self.run_path.close().await;
        self.shared.release();
        self.shared.pool().close().await;
    }

    /// Makes every write committed before the call durable (a server may run with
    /// `synchronous_commit = off`) and returns those of the given inbox rows (seq, idempotency
    /// key) that exist, and so are on disk now.
    ///
    /// # Errors
    /// A database error.
    pub async fn flush(&self, rows: &[(i64, String)]) -> Result<Vec<(i64, String)>, MemoryError> {
        let (seqs, keys): (Vec<i64>, Vec<&str>) =
            rows.iter().map(|(seq, key)| (*seq, key.as_str())).unzip();
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, (i64, String)>(
            "SELECT seq, idempotency_key FROM agentloop_flush($1, $2)",
        )
        .bind(seqs)
        .bind(keys)
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| error::translate(err, Uuid::nil()))
    }

    /// Returns the underlying pool.
    pub fn pool(&self) -> &PgPool {
        self.shared.pool()
    }

    /// A connection of the shared pool, held between calls rather than given back (and pinged)
    /// after each.
    async fn conn(&self, session_id: Uuid) -> Result<held::HeldConn<'_>, MemoryError> {
        self.shared
            .acquire()
            .await
            .map_err(|err| error::translate(err, session_id))
    }

    /// Sets the most pending (unconsumed) inputs one session's inbox may hold; 0 means no cap.
    /// Stored in the database, where the inbox's insert trigger reads it, so it holds for every
    /// replica (the last one started wins when their configs differ).
    ///
    /// # Errors
    /// A database error.
    pub async fn set_inbox_max_pending(&self, cap: u64) -> Result<(), MemoryError> {
        write_inbox_max_pending(self.shared.pool(), cap)
            .await
            .map_err(|err| error::translate(err, Uuid::nil()))
    }

    /// Runs a trivial query to learn whether Postgres answers.
    ///
    /// # Errors
    /// [`MemoryError::Unavailable`] when it does not.
    pub async fn ping(&self) -> Result<(), MemoryError> {
        sqlx::query("SELECT 1")
            .execute(self.shared.pool())
            .await
            .map(|_| ())
            .map_err(|err| error::translate(err, Uuid::nil()))
    }

    /// Explains why a fenced statement matched nothing: the session is unknown, or the epoch
    /// no longer holds its lease. Only runs on that (rare) failure path, to keep the fenced
    /// statements themselves lean.
    async fn lease_failure(&self, session_id: Uuid, epoch: i64) -> MemoryError {
        let mut conn = match self.conn(session_id).await {
            Ok(conn) => conn,
            Err(err) => return err,
        };
        let exists = sqlx::query_scalar::<_, bool>(include_str!("queries/session_exists.sql"))
            .bind(session_id)
            .fetch_one(&mut *conn)
            .await;
        match conn.settle(exists) {
            Ok(true) => MemoryError::LeaseLost { session_id, epoch },
            Ok(false) => MemoryError::SessionNotFound(session_id),
            Err(err) => error::translate(err, session_id),
        }
    }
}

/// How much history to send along with a taken input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryAsk {
    /// The newest this many entries.
    pub limit: u32,
    /// The caller holds the transcript through this seq: only newer entries when it still
    /// exists. 0: the whole window.
    pub after_seq: i64,
}

/// A conversation session.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Session {
    /// The id the memory service assigned.
    pub id: Uuid,
    /// The client's session key.
    pub key: String,
    /// The agent serving the session.
    pub agent_id: String,
    /// The channel the session was first seen on.
    pub channel: Option<String>,
    /// A model chosen for this session, overriding the agent's.
    pub model_override: Option<String>,
    /// The session's queue mode, when set.
    pub queue_mode: Option<String>,
    /// When the session was first seen.
    pub created_at: DateTime<Utc>,
    /// Whether this call created it.
    pub created: bool,
}

/// A transcript entry to append.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewEntry {
    /// Unique per session; a retry with the same key is absorbed.
    pub key: String,
    /// `user`, `assistant`, `tool` or `system`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The run that produced it, if any.
    pub run_id: Option<Uuid>,
    /// The tool call this entry belongs to, if any.
    pub tool_call_id: Option<String>,
    /// The tool's name, if any.
    pub tool_name: Option<String>,
    /// Extra JSON, if any.
    pub data: Option<String>,
}

/// A stored transcript entry.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Entry {
    /// Position in the transcript (increasing, with gaps).
    pub seq: i64,
    /// The entry's key.
    #[sqlx(rename = "entry_key")]
    pub key: String,
    /// `user`, `assistant`, `tool` or `system`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The run that produced it, if any.
    pub run_id: Option<Uuid>,
    /// The tool call this entry belongs to, if any.
    pub tool_call_id: Option<String>,
    /// The tool's name, if any.
    pub tool_name: Option<String>,
    /// Extra JSON, if any.
    pub data: Option<String>,
    /// When it was appended.
    pub created_at: DateTime<Utc>,
}

/// What an inbox item asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboxKind {
    /// A new user message.
    User,
    /// Runs after the live run ends.
    Followup,
    /// Injected at the next safe point of the live run.
    Steer,
    /// Merged with other queued messages into one follow-up.
    Collect,
    /// Aborts the live run, then runs.
    Interrupt,
}

impl InboxKind {
    /// Returns the word stored and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Followup => "followup",
            Self::Steer => "steer",
            Self::Collect => "collect",
            Self::Interrupt => "interrupt",
        }
    }
}

impl FromStr for InboxKind {
    type Err = MemoryError;

    fn from_str(kind: &str) -> Result<Self, Self::Err> {
        match kind {
            "user" => Ok(Self::User),
            "followup" => Ok(Self::Followup),
            "steer" => Ok(Self::Steer),
            "collect" => Ok(Self::Collect),
            "interrupt" => Ok(Self::Interrupt),
            other => Err(MemoryError::InvalidArgument(format!(
                "unknown inbox kind {other:?} (expected user, followup, steer, collect or interrupt)"
            ))),
        }
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// A final answer was produced.
    Completed,
    /// The run failed.
    Error,
    /// The run was aborted.
    Aborted,
    /// The run hit its timeout.
    Timeout,
    /// The run hit its turn budget.
    MaxTurns,
}

impl RunStatus {
    /// Returns the word stored in `runs.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Error => "error",
            Self::Aborted => "aborted",
            Self::Timeout => "timeout",
            Self::MaxTurns => "max_turns",
        }
    }
}

impl FromStr for RunStatus {
    type Err = MemoryError;

    fn from_str(status: &str) -> Result<Self, Self::Err> {
        match status {
            "completed" => Ok(Self::Completed),
            "error" => Ok(Self::Error),
            "aborted" => Ok(Self::Aborted),
            "timeout" => Ok(Self::Timeout),
            "max_turns" => Ok(Self::MaxTurns),
            other => Err(MemoryError::InvalidArgument(format!(
                "unknown run status {other:?} (expected completed, error, aborted, timeout or max_turns)"
            ))),
        }
    }
}

/// A run: the processing of one inbox item, possibly over several attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The run's id.
    pub id: Uuid,
    /// Its session.
    pub session_id: Uuid,
    /// The inbox item it processes.
    pub inbox_seq: i64,
    /// `running` or how it ended.
    pub status: String,
    /// How many times the item was taken (1 on first take).
    pub attempts: i32,
    /// When it was first taken.
    pub started_at: DateTime<Utc>,
    /// When it finished, if it did.
    pub finished_at: Option<DateTime<Utc>>,
}

/// The end of a run, as reported by its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The run.
    pub run_id: Uuid,
    /// The inbox item it processed.
    pub inbox_seq: i64,
    /// How it ended.
    pub status: RunStatus,
    /// The error, when it failed.
    pub error: Option<String>,
    /// The model that answered last.
    pub model: Option<String>,
    /// Prompt tokens used.
    pub input_tokens: i64,
    /// Completion tokens used.
    pub output_tokens: i64,
    /// The provider that answered.
    pub provider: Option<String>,
    /// The auth profile that answered.
    pub profile: Option<String>,
    /// What the model received, part by part (JSON, checked), when the runner reported it.
    pub prompt_report: Option<String>,
}

/// Returns `None` for an empty string: proto3 has no null, the schema does.
pub(crate) fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Stores the inbox cap where `agentloop_inbox_cap()` (migration 0012) reads it.
pub(crate) async fn write_inbox_max_pending(pool: &PgPool, cap: u64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO agentloop_settings (name, value) VALUES ('inbox_max_pending', $1) \
         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
    )
    .bind(i64::try_from(cap).unwrap_or(i64::MAX))
    .execute(pool)
    .await
    .map(|_| ())
}

/// The `synchronous_commit` Postgres reports on `executor` (inside a transaction, that
/// transaction's).
#[cfg(test)]
pub(crate) async fn synchronous_commit<'c, E: sqlx::PgExecutor<'c>>(executor: E) -> String {
    sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(executor)
        .await
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_statuses_round_trip_through_their_words() {
        for kind in ["user", "followup", "steer", "collect", "interrupt"] {
            assert_eq!(InboxKind::from_str(kind).unwrap().as_str(), kind);
        }
        for status in ["completed", "error", "aborted", "timeout", "max_turns"] {
            assert_eq!(RunStatus::from_str(status).unwrap().as_str(), status);
        }
        assert!(InboxKind::from_str("shout").is_err());
        assert!(RunStatus::from_str("running").is_err());
    }
}
