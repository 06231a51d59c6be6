//! Connections held from one call to the next. A connection given back to a sqlx pool is pinged
//! (a Sync and its answer, in a task of its own) on every return: one more round trip to
//! Postgres, and one more Postgres wakeup, per call, that a held one is spared.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

/// A pool and the connections taken from it that are kept idle between calls.
#[derive(Debug)]
pub(crate) struct Held {
    pool: PgPool,
    /// At most this many are kept idle; more at once go back to the pool. A pool that is also
    /// used directly needs this below its size, so those callers always find room in it.
    keep: usize,
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    conns: Vec<PoolConnection<Postgres>>,
    closed: bool,
}

impl Held {
    /// Holds up to `keep` idle connections of `pool`.
    pub(crate) fn new(pool: PgPool, keep: usize) -> Self {
        Self {
            pool,
            keep,
            idle: Mutex::default(),
        }
    }

    /// The pool the connections come from.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A held connection, or one from the pool when none is idle. It goes back to the pool
    /// (pinged there, closed if broken) unless [`HeldConn::keep_if`] says it is sound.
    pub(crate) async fn acquire(&self) -> Result<HeldConn<'_>, sqlx::Error> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.conns.pop());
        let conn = match idle {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
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

    /// [`Self::keep_if`] from the result of a statement run on it.
    pub(crate) fn keep_after<T>(&mut self, result: &Result<T, sqlx::Error>) {
        self.keep_if(matches!(
            result,
            Ok(_) | Err(sqlx::Error::Database(_) | sqlx::Error::RowNotFound)
        ));
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
        if let Ok(mut idle) = self.home.idle.lock()
            && !idle.closed
            && idle.conns.len() < self.home.keep
        {
            idle.conns.push(conn);
        }
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
}
