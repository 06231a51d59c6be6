//! Connections held from one call to the next. A connection given back to a sqlx pool is pinged
//! (a Sync and its answer, in a task of its own) on every return: one more round trip to
//! Postgres, and one more Postgres wakeup, per call, that a held one is spared.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgDatabaseError, PgSeverity};
use sqlx::{PgConnection, PgPool, Postgres};

/// A connection idle in [`Held`] longer than this goes back to the pool at its next turn, where
/// it is pinged and the pool's own lifetime limits apply to it.
const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// A pool and the connections taken from it that are kept idle between calls.
#[derive(Debug)]
pub(crate) struct Held {
    pool: PgPool,
    /// At most this many are kept idle; more at once go back to the pool. A pool that is also
    /// used directly needs this below its size, so those callers always find room in it.
    keep: usize,
    idle: Mutex<Idle>,
    /// Calls waiting for a connection from the pool. While any wait, a connection whose call
    /// ends goes to the pool, which serves them in turn, rather than to newer calls.
    waiting: AtomicUsize,
}

#[derive(Debug, Default)]
struct Idle {
    /// Connections and when each was last given back, most recent last.
    conns: Vec<(Instant, PoolConnection<Postgres>)>,
    closed: bool,
}

impl Held {
    /// Holds up to `keep` idle connections of `pool`.
    pub(crate) fn new(pool: PgPool, keep: usize) -> Self {
        Self {
            pool,
            keep,
            idle: Mutex::default(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The pool the connections come from.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A held connection, or one from the pool when none is idle. It goes back to the pool
    /// (pinged there, closed if broken) unless [`HeldConn::keep_if`] says it is sound.
    pub(crate) async fn acquire(&self) -> Result<HeldConn<'_>, sqlx::Error> {
        let idle = self.idle.lock().ok().and_then(|mut idle| {
            // The most recently used is the warmest; those idle too long go back to the pool.
            let fresh = idle
                .conns
                .iter()
                .position(|(since, _)| since.elapsed() < IDLE_LIMIT)
                .unwrap_or(idle.conns.len());
            drop(idle.conns.drain(..fresh));
            idle.conns.pop().map(|(_, conn)| conn)
        });
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let _waiting = Waiting::new(&self.waiting);
                self.pool.acquire().await?
            }
        };
        Ok(HeldConn {
            conn: Some(conn),
            home: self,
            sound: false,
        })
    }

    /// Stops holding: idle connections go back to the pool now, those in use when their call
    /// ends, so the pool's `close` finds them all.
    pub(crate) fn release(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.closed = true;
            idle.conns.clear();
        }
    }
}

/// A connection taken from [`Held`] for one call.
pub(crate) struct HeldConn<'a> {
    conn: Option<PoolConnection<Postgres>>,
    home: &'a Held,
    sound: bool,
}

impl HeldConn<'_> {
    /// Marks the connection fit to keep when `sound`: its call ended in a known protocol
    /// state (answered, or refused by Postgres). An I/O error, or an answer that could not be
    /// read, sends it back to the pool, whose ping closes it if it is broken.
    pub(crate) fn keep_if(&mut self, sound: bool) {
        self.sound = sound;
    }

    /// [`Self::keep_if`] from the result of a statement run on it: sound when answered, or
    /// refused by Postgres short of ending the session (a FATAL error, such as an
    /// administrator's termination, closes the connection on the server's side).
    pub(crate) fn keep_after<T>(&mut self, result: &Result<T, sqlx::Error>) {
        self.keep_if(match result {
            Ok(_) | Err(sqlx::Error::RowNotFound) => true,
            Err(sqlx::Error::Database(err)) => err
                .try_downcast_ref::<PgDatabaseError>()
                .is_some_and(|err| {
                    !matches!(err.severity(), PgSeverity::Fatal | PgSeverity::Panic)
                }),
            Err(_) => false,
        });
    }

    /// Gives the connection back, held or to the pool as [`Self::keep_after`] judges
    /// `result`, and returns `result`.
    pub(crate) fn settle<T>(mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        self.keep_after(&result);
        result
    }
}

impl Deref for HeldConn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_deref().expect("held until dropped")
    }
}

impl DerefMut for HeldConn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_deref_mut().expect("held until dropped")
    }
}

impl Drop for HeldConn<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !self.sound {
            return;
        }
        if self.home.waiting.load(Ordering::Acquire) > 0 {
            return;
        }
        if let Ok(mut idle) = self.home.idle.lock()
            && !idle.closed
            && idle.conns.len() < self.home.keep
        {
            idle.conns.push((Instant::now(), conn));
        }
    }
}

/// Counts a call as waiting for the pool until dropped (also when its wait is cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{PgConnection, PgPool};

    use super::Held;

    async fn backend(conn: &mut PgConnection) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .expect("Postgres answers")
    }

    fn held_idle(held: &Held) -> usize {
        held.idle.lock().expect("not poisoned").conns.len()
    }

    #[sqlx::test(migrations = false)]
    async fn sound_connections_are_held_up_to_the_limit_and_suspect_ones_go_back(pool: PgPool) {
        let held = Held::new(pool.clone(), 1);
        let (mut a, mut b) = (held.acquire().await.unwrap(), held.acquire().await.unwrap());
        let (pid_a, pid_b) = (backend(&mut a).await, backend(&mut b).await);
        assert_ne!(pid_a, pid_b, "two calls at once use two connections");
        a.keep_if(true);
        b.keep_if(true);
        drop(a);
        drop(b);
        assert_eq!(held_idle(&held), 1, "only `keep` connections are held idle");

        let mut again = held.acquire().await.unwrap();
        assert_eq!(
            backend(&mut again).await,
            pid_a,
            "the next call gets the held connection"
        );
        let failed: Result<i32, sqlx::Error> = sqlx::query_scalar("SELECT 1 / 0")
            .fetch_one(&mut *again)
            .await;
        again.keep_after(&failed);
        drop(again);
        assert_eq!(
            held_idle(&held),
            1,
            "a statement Postgres refused leaves the connection fit to keep"
        );

        let mut suspect = held.acquire().await.unwrap();
        suspect.keep_after::<()>(&Err(sqlx::Error::Io(std::io::Error::other("cut off"))));
        drop(suspect);
        assert_eq!(held_idle(&held), 0, "a suspect connection is not held");

        let mut last = held.acquire().await.unwrap();
        last.keep_if(true);
        held.release();
        drop(last);
        assert_eq!(held_idle(&held), 0, "nothing is held once released");
        tokio::time::timeout(std::time::Duration::from_secs(10), pool.close())
            .await
            .expect("every connection went back to the pool, so it closes");
    }

    #[sqlx::test(migrations = false)]
    async fn a_connection_the_server_ended_is_not_held(pool: PgPool) {
        let held = Held::new(pool, 1);
        let mut conn = held.acquire().await.unwrap();
        let ended: Result<bool, sqlx::Error> =
            sqlx::query_scalar("SELECT pg_terminate_backend(pg_backend_pid())")
                .fetch_one(&mut *conn)
                .await;
        assert!(ended.is_err(), "the server ends the session: {ended:?}");
        conn.keep_after(&ended);
        drop(conn);
        assert_eq!(held_idle(&held), 0);
    }

    #[sqlx::test(migrations = false)]
    async fn a_caller_waiting_for_the_pool_gets_the_next_connection_given_back(pool: PgPool) {
        let one = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap();
        let held = std::sync::Arc::new(Held::new(one, 1));
        let mut first = held.acquire().await.unwrap();
        backend(&mut first).await;
        let waiter = tokio::spawn({
            let held = held.clone();
            async move {
                let started = std::time::Instant::now();
                let mut conn = held.acquire().await.expect("a connection");
                backend(&mut conn).await;
                started.elapsed()
            }
        });
        // Let the second caller reach the pool's queue, then end the first call soundly.
        while held.waiting.load(std::sync::atomic::Ordering::Acquire) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        first.keep_if(true);
        drop(first);
        let waited = waiter.await.unwrap();
        assert!(
            waited < std::time::Duration::from_secs(4),
            "the waiting caller was served, not left to time out ({waited:?})"
        );
        assert_eq!(
            held_idle(&held),
            0,
            "nothing was held while a caller waited"
        );
    }
}
