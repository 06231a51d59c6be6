//! Dispatch records: a client request recorded by (session key, idempotency key), so that a
//! repeated key returns the first answer on every gateway replica.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Caller;
use crate::MemoryError;
use crate::store::{Store, error::translate};

/// How often one replica sweeps expired dispatch records, unless its last sweep was full.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The rows one sweep deletes at most (`queries/sweep_dispatches.sql`).
const SWEEP_BATCH: u64 = 500;

/// Inserts `begin_dispatch` tries: a second when the live record that refused the first was
/// gone by the time it was read.
const BEGIN_ATTEMPTS: usize = 2;

/// A client request as recorded by the gateway, with the state of the run processing it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Dispatch {
    /// The client's session key.
    pub session_key: String,
    /// The client's idempotency key.
    pub idempotency_key: String,
    /// The run id the gateway gave the client.
    pub run_handle: Uuid,
    /// The session.
    pub session_id: Uuid,
    /// `accepted`, `ok` or `error`.
    pub status: String,
    /// The first answer, once stored.
    pub text: Option<String>,
    /// The error of a failed answer.
    pub error: Option<String>,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// When it is forgotten.
    pub expires_at: DateTime<Utc>,
    /// The run processing it, once one started.
    pub run_id: Option<Uuid>,
    /// That run's status.
    pub run_status: Option<String>,
    /// That run's error.
    pub run_error: Option<String>,
    /// That run's last assistant entry.
    pub run_answer: Option<String>,
}

/// How a dispatch is looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchLookup {
    /// By the gateway's run handle or by the id of its run.
    Run(Uuid),
    /// By (session key, idempotency key).
    Keys {
        /// The session key.
        session_key: String,
        /// The idempotency key.
        idempotency_key: String,
    },
}

impl Store {
    /// Records a dispatch under `run_handle` and returns `(created, record)`: `created` is false
    /// when a live record for the same keys exists, and that record is returned instead. A
    /// record created here comes back without run fields: its message is not sent yet.
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`] for an unknown session, [`MemoryError::Aborted`] when
    /// the live record of the keys expired each time between refusing the insert and being
    /// read, or a database error.
    pub async fn begin_dispatch(
        &self,
        session_key: &str,
        idempotency_key: &str,
        run_handle: Uuid,
        session_id: Uuid,
        ttl: Duration,
    ) -> Result<(bool, Dispatch), MemoryError> {
        // Expired records are swept here, a bounded batch at a time, rather than by a timer
        // every memory replica would have to coordinate; at most once a second unless the last
        // sweep found a full batch.
        if self.dispatch_sweep_due() {
            let mut conn = self.conn(session_id).await?;
            let result = sqlx::query(include_str!("../queries/sweep_dispatches.sql"))
                .execute(&mut *conn)
                .await;
            let swept = conn
                .settle(result)
                .map_err(|err| translate(err, session_id))?;
            if swept.rows_affected() >= SWEEP_BATCH {
                self.dispatch_sweep_again();
            }
        }
        let lookup = DispatchLookup::Keys {
            session_key: session_key.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
        };
        // A live record of the keys refuses the insert and is read back by a second statement;
        // it may expire (and be swept) in between, which frees the keys, so the insert is tried
        // again. Only records that expire within a round trip (a TTL of milliseconds) can miss
        // twice in a row: the caller is then told to retry rather than that its request is bad.
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        for _ in 0..BEGIN_ATTEMPTS {
            let inserted = self
                .insert_dispatch(session_key, idempotency_key, run_handle, session_id, ttl_ms)
                .await?;
            if let Some((created_at, expires_at)) = inserted {
                // Answered from what was written, without reading it back; the run fields stay
                // empty (the caller sends the message next and follows the run from there).
                let record = Dispatch {
                    session_key: session_key.to_owned(),
                    idempotency_key: idempotency_key.to_owned(),
                    run_handle,
                    session_id,
                    status: "accepted".to_owned(),
                    text: None,
                    error: None,
                    created_at,
                    expires_at,
                    run_id: None,
                    run_status: None,
                    run_error: None,
                    run_answer: None,
                };
                return Ok((true, record));
            }
            if let Some(live) = self.get_dispatch(&lookup, &Caller::admin()).await? {
                return Ok((false, live));
            }
        }
        Err(MemoryError::Aborted(format!(
            "the live dispatch record of idempotency key {idempotency_key:?} expired while it \
             was read"
        )))
    }

    /// Inserts the record of the keys (or takes over an expired one) and returns when it was
    /// created and expires; `None` when a live record of the keys exists.
    async fn insert_dispatch(
        &self,
        session_key: &str,
        idempotency_key: &str,
        run_handle: Uuid,
        session_id: Uuid,
        ttl_ms: i64,
    ) -> Result<Option<(DateTime<Utc>, DateTime<Utc>)>, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query_as::<_, (DateTime<Utc>, DateTime<Utc>)>(include_str!(
            "../queries/begin_dispatch.sql"
        ))
        .bind(session_key)
        .bind(idempotency_key)
        .bind(run_handle)
        .bind(session_id)
        .bind(ttl_ms as f64)
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, session_id))
    }

    fn dispatch_sweep_due(&self) -> bool {
        let now = std::time::Instant::now();
        let Ok(mut next) = self.next_dispatch_sweep.lock() else {
            return true;
        };
        if next.is_some_and(|at| now < at) {
            return false;
        }
        *next = Some(now + SWEEP_EVERY);
        true
    }

    fn dispatch_sweep_again(&self) {
        if let Ok(mut next) = self.next_dispatch_sweep.lock() {
            *next = None;
        }
    }

    /// Returns a live dispatch record with its run's state, if there is one of a session
    /// `caller` sees.
    ///
    /// # Errors
    /// A database error.
    pub async fn get_dispatch(
        &self,
        lookup: &DispatchLookup,
        caller: &Caller,
    ) -> Result<Option<Dispatch>, MemoryError> {
        let (run, session_key, idempotency_key) = match lookup {
            DispatchLookup::Run(id) => (Some(*id), None, None),
            DispatchLookup::Keys {
                session_key,
                idempotency_key,
            } => (
                None,
                Some(session_key.as_str()),
                Some(idempotency_key.as_str()),
            ),
        };
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Dispatch>(include_str!("../queries/get_dispatch.sql"))
            .bind(run)
            .bind(session_key)
            .bind(idempotency_key)
            .bind(caller.principal.as_deref())
            .bind(caller.admin)
            .fetch_optional(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Stores the outcome of the dispatch `run_handle` unless one is stored already, and returns
    /// the record.
    ///
    /// # Errors
    /// [`MemoryError::InvalidArgument`] when the record does not exist, or a database error.
    pub async fn complete_dispatch(
        &self,
        run_handle: Uuid,
        status: &str,
        text: &str,
        error: Option<&str>,
    ) -> Result<Dispatch, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result =
            sqlx::query_as::<_, Dispatch>(include_str!("../queries/complete_dispatch.sql"))
                .bind(run_handle)
                .bind(status)
                .bind(text)
                .bind(error)
                .fetch_optional(&mut *conn)
                .await;
        let stored = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        if let Some(record) = stored {
            return Ok(record);
        }
        self.get_dispatch(&DispatchLookup::Run(run_handle), &Caller::admin())
            .await?
            .ok_or_else(|| {
                MemoryError::InvalidArgument(format!("no live dispatch with handle {run_handle}"))
            })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::PgPool;
    use uuid::Uuid;

    use crate::store::{Dispatch, Store, synchronous_commit};

    #[sqlx::test(migrations = "./migrations")]
    async fn a_completion_is_stored_once_and_its_async_commit_stays_in_its_transaction(
        pool: PgPool,
    ) {
        let store = Store::new(pool);
        let session = store
            .resolve_session("cli:complete", "main", Some("cli"))
            .await
            .unwrap();
        let handle = Uuid::now_v7();
        let (created, _) = store
            .begin_dispatch(
                "cli:complete",
                "key-1",
                handle,
                session.id,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert!(created);

        let done = store
            .complete_dispatch(handle, "ok", "first", None)
            .await
            .unwrap();
        assert_eq!(
            (done.status.as_str(), done.text.as_deref()),
            ("ok", Some("first"))
        );
        let again = store
            .complete_dispatch(handle, "error", "second", Some("late"))
            .await
            .unwrap();
        assert_eq!(
            (again.status.as_str(), again.text.as_deref()),
            ("ok", Some("first")),
            "a later completion changes nothing"
        );

        // The statement turns synchronous commit off for its own transaction: run inside an
        // explicit one, it leaves the setting off there, and it answers with the record.
        let handle2 = Uuid::now_v7();
        store
            .begin_dispatch(
                "cli:complete",
                "key-2",
                handle2,
                session.id,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        let mut tx = store.pool().begin().await.unwrap();
        let stored =
            sqlx::query_as::<_, Dispatch>(include_str!("../queries/complete_dispatch.sql"))
                .bind(handle2)
                .bind("ok")
                .bind("second key")
                .bind(None::<&str>)
                .fetch_optional(&mut *tx)
                .await
                .unwrap()
                .expect("the completion answers with the record");
        assert_eq!(
            (
                stored.run_handle,
                stored.status.as_str(),
                stored.text.as_deref()
            ),
            (handle2, "ok", Some("second key"))
        );
        let reported = synchronous_commit(&mut *tx).await;
        assert_eq!(reported, "off");
        tx.commit().await.unwrap();

        // The completion ran on the connection the store holds; the next call on it must
        // commit synchronously again.
        let mut conn = store.conn(Uuid::nil()).await.unwrap();
        let setting = synchronous_commit(&mut *conn).await;
        assert_eq!(setting, "on");
    }

    #[sqlx::test(migrations = "./migrations")]
    async fn a_live_record_that_expires_before_it_is_read_back_gives_way_to_the_new_one(
        pool: PgPool,
    ) {
        // Arrange: a record living one second, and every later insert of a record held up for
        // longer, so the record is live when it refuses the insert and gone when read back.
        let store = Store::new(pool);
        let session = store
            .resolve_session("cli:race", "main", Some("cli"))
            .await
            .unwrap();
        let first = Uuid::now_v7();
        let (created, _) = store
            .begin_dispatch("cli:race", "key", first, session.id, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(created);
        sqlx::query(
            "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(1.2); RETURN NULL; END $$",
        )
        .execute(store.pool())
        .await
        .unwrap();
        sqlx::query(
            "CREATE TRIGGER slow_insert BEFORE INSERT ON dispatches \
             FOR EACH STATEMENT EXECUTE FUNCTION slow_insert()",
        )
        .execute(store.pool())
        .await
        .unwrap();

        // Act: the same keys again.
        let second = Uuid::now_v7();
        let (created, record) = store
            .begin_dispatch(
                "cli:race",
                "key",
                second,
                session.id,
                Duration::from_secs(60),
            )
            .await
            .expect("the expired record gives way instead of failing the call");

        // Assert: the retried insert took over the expired record.
        assert!(created);
        assert_eq!(
            (record.run_handle, record.status.as_str()),
            (second, "accepted")
        );
        let stored: Uuid =
            sqlx::query_scalar("SELECT run_handle FROM dispatches WHERE idempotency_key = 'key'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(stored, second);
    }

    #[sqlx::test(migrations = "./migrations")]
    async fn recording_and_sweeping_commit_without_waiting_for_the_disk_in_their_own_transaction(
        pool: PgPool,
    ) {
        let store = Store::new(pool);
        let session = store
            .resolve_session("cli:begin", "main", Some("cli"))
            .await
            .unwrap();
        let mut tx = store.pool().begin().await.unwrap();
        let created = sqlx::query_as::<
            _,
            (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>),
        >(include_str!("../queries/begin_dispatch.sql"))
        .bind("cli:begin")
        .bind("key-1")
        .bind(Uuid::now_v7())
        .bind(session.id)
        .bind(60_000.0_f64)
        .fetch_optional(&mut *tx)
        .await
        .unwrap();
        assert!(created.is_some(), "the record is inserted");
        let reported = synchronous_commit(&mut *tx).await;
        assert_eq!(reported, "off", "recording a dispatch");
        tx.commit().await.unwrap();

        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query("UPDATE dispatches SET expires_at = now() - interval '1 second'")
            .execute(&mut *tx)
            .await
            .unwrap();
        let swept = sqlx::query(include_str!("../queries/sweep_dispatches.sql"))
            .execute(&mut *tx)
            .await
            .unwrap();
        assert_eq!(swept.rows_affected(), 1);
        let reported = synchronous_commit(&mut *tx).await;
        assert_eq!(reported, "off", "sweeping expired records");
        tx.commit().await.unwrap();

        // Each statement's setting ended with its transaction.
        let setting = synchronous_commit(store.pool()).await;
        assert_eq!(setting, "on");
    }
}
