//! Sessions and their lease: resolve, claim, renew, release, list the claimable ones.

use std::time::Duration;

use uuid::Uuid;

use super::{Session, Store, error::translate};
use crate::MemoryError;

/// The result of a claim attempt.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Claim {
    /// Whether the caller now holds the lease.
    pub claimed: bool,
    /// The fencing epoch: the caller's when claimed, the holder's otherwise.
    pub epoch: i64,
    /// The holder: the caller when claimed, the current one (if any) otherwise.
    pub owner: Option<String>,
}

impl Store {
    /// Returns the session for `key`, creating it (with `agent_id` and `channel`) on first sight.
    ///
    /// # Errors
    /// [`MemoryError::Unavailable`] when Postgres is unreachable, [`MemoryError::Database`]
    /// otherwise.
    pub async fn resolve_session(
        &self,
        key: &str,
        agent_id: &str,
        channel: Option<&str>,
    ) -> Result<Session, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Session>(include_str!("queries/resolve_session.sql"))
            .bind(key)
            .bind(Uuid::now_v7())
            .bind(agent_id)
            .bind(channel)
            .fetch_optional(&mut *conn)
            .await;
        let found = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        if let Some(session) = found {
            return Ok(session);
        }
        // Lost a first-sight race: the winner's row is committed by now.
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Session>(include_str!("queries/session_by_key.sql"))
            .bind(key)
            .fetch_one(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Takes the session's lease for `owner` when it is free or expired.
    ///
    /// A holder that claims again gets `claimed: false`: claiming is for taking over, renewing
    /// is [`Store::renew_lease`].
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`], or a database error.
    pub async fn claim_session(
        &self,
        session_id: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<Claim, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query_as::<_, Claim>(include_str!("queries/claim_session.sql"))
            .bind(session_id)
            .bind(owner)
            .bind(millis(ttl))
            .fetch_optional(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, session_id))?
            .ok_or(MemoryError::SessionNotFound(session_id))
    }

    /// Extends the lease held with `epoch` by `ttl` from now; returns false when it is not held.
    ///
    /// # Errors
    /// A database error.
    pub async fn renew_lease(
        &self,
        session_id: Uuid,
        epoch: i64,
        ttl: Duration,
    ) -> Result<bool, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query(include_str!("queries/renew_lease.sql"))
            .bind(session_id)
            .bind(epoch)
            .bind(millis(ttl))
            .execute(&mut *conn)
            .await;
        let done = conn
            .settle(result)
            .map_err(|err| translate(err, session_id))?;
        Ok(done.rows_affected() == 1)
    }

    /// Extends each lease of `leases` (session, epoch) its epoch still holds by `ttl` from now,
    /// in one statement; returns the sessions renewed.
    ///
    /// # Errors
    /// A database error (nothing is renewed then).
    pub async fn renew_leases(
        &self,
        leases: &[(Uuid, i64)],
        ttl: Duration,
    ) -> Result<Vec<Uuid>, MemoryError> {
        let mut sorted = leases.to_vec();
        sorted.sort_unstable();
        let (ids, epochs): (Vec<Uuid>, Vec<i64>) = sorted.into_iter().unzip();
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_scalar::<_, Uuid>(include_str!("queries/renew_leases.sql"))
            .bind(ids)
            .bind(epochs)
            .bind(millis(ttl))
            .fetch_all(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Gives the lease held with `epoch` back; returns false (keep running) while inputs are
    /// pending or when `epoch` no longer holds it.
    ///
    /// # Errors
    /// A database error.
    pub async fn release_session(&self, session_id: Uuid, epoch: i64) -> Result<bool, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query_scalar::<_, bool>(include_str!("queries/release_session.sql"))
            .bind(session_id)
            .bind(epoch)
            .fetch_one(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, session_id))
    }

    /// Returns up to `limit` sessions with pending inputs whose lease is free or expired,
    /// longest waiting first.
    ///
    /// # Errors
    /// A database error.
    pub async fn list_claimable(&self, limit: u32) -> Result<Vec<Uuid>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_scalar::<_, Uuid>(include_str!("queries/list_claimable.sql"))
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }
}

/// Returns a TTL in whole milliseconds, capped at the wire's `u32` (49 days) so the interval
/// arithmetic in SQL cannot overflow.
fn millis(ttl: Duration) -> i64 {
    let capped = ttl.as_millis().min(u128::from(u32::MAX));
    i64::try_from(capped).unwrap_or(i64::from(u32::MAX))
}
