//! Auth-profile cooldowns, shared by every runner replica: a profile that failed (auth, rate
//! limit, timeout) is skipped until its cooldown ends; each consecutive failure doubles it.

use chrono::{DateTime, Utc};

use super::{Store, error::translate};
use crate::MemoryError;

/// A profile cooling down.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Cooldown {
    /// Provider name.
    pub provider: String,
    /// Profile name.
    pub profile: String,
    /// Consecutive failures.
    pub failures: i32,
    /// When the profile may be used again.
    pub cooldown_until: Option<DateTime<Utc>>,
    /// The last failure's message.
    pub last_error: Option<String>,
}

impl Store {
    /// Returns the provider's profiles whose cooldown has not ended.
    ///
    /// # Errors
    /// A database error.
    pub async fn active_cooldowns(&self, provider: &str) -> Result<Vec<Cooldown>, MemoryError> {
        let mut conn = self.conn(uuid::Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Cooldown>(
            "SELECT provider, profile, failures, cooldown_until, last_error FROM auth_profile_cooldowns \
             WHERE provider = $1 AND cooldown_until > now() ORDER BY profile",
        )
        .bind(provider)
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, uuid::Uuid::nil()))
    }

    /// Counts a failure and starts a cooldown of `base_ms * 2^(failures - 1)`, at most `max_ms`.
    ///
    /// # Errors
    /// A database error.
    pub async fn report_profile_failure(
        &self,
        provider: &str,
        profile: &str,
        error: &str,
        base_ms: i64,
        max_ms: i64,
    ) -> Result<Cooldown, MemoryError> {
        let mut conn = self.conn(uuid::Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Cooldown>(
            "INSERT INTO auth_profile_cooldowns AS c (provider, profile, failures, cooldown_until, last_error) \
             VALUES ($1, $2, 1, now() + make_interval(secs => $4::float8 / 1000), $3) \
             ON CONFLICT (provider, profile) DO UPDATE SET \
               failures = c.failures + 1, \
               last_error = EXCLUDED.last_error, \
               cooldown_until = now() + make_interval(secs => least($5::float8, $4::float8 * power(2, c.failures)) / 1000) \
             RETURNING provider, profile, failures, cooldown_until, last_error",
        )
        .bind(provider)
        .bind(profile)
        .bind(error)
        .bind(base_ms.max(1))
        .bind(max_ms.max(1))
        .fetch_one(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, uuid::Uuid::nil()))
    }

    /// Forgets a profile's failures after a successful call.
    ///
    /// # Errors
    /// A database error.
    pub async fn report_profile_success(
        &self,
        provider: &str,
        profile: &str,
    ) -> Result<(), MemoryError> {
        let mut conn = self.conn(uuid::Uuid::nil()).await?;
        let result =
            sqlx::query("DELETE FROM auth_profile_cooldowns WHERE provider = $1 AND profile = $2")
                .bind(provider)
                .bind(profile)
                .execute(&mut *conn)
                .await;
        conn.settle(result)
            .map_err(|err| translate(err, uuid::Uuid::nil()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sqlx::PgPool;

    use crate::store::Store;

    #[sqlx::test(migrations = "./migrations")]
    async fn cooldowns_double_with_each_failure_and_clear_on_success(pool: PgPool) {
        let store = Store::new(pool);
        let first = store
            .report_profile_failure("openai", "a", "429", 1_000, 60_000)
            .await
            .unwrap();
        let second = store
            .report_profile_failure("openai", "a", "429", 1_000, 60_000)
            .await
            .unwrap();
        assert_eq!((first.failures, second.failures), (1, 2));
        let (t1, t2) = (
            first.cooldown_until.unwrap(),
            second.cooldown_until.unwrap(),
        );
        assert!(
            t2 - t1 >= chrono::Duration::milliseconds(900),
            "the second cooldown is about twice as long"
        );
        let active = store.active_cooldowns("openai").await.unwrap();
        assert_eq!(active.len(), 1);
        assert!(
            store
                .active_cooldowns("anthropic")
                .await
                .unwrap()
                .is_empty()
        );
        store.report_profile_success("openai", "a").await.unwrap();
        assert!(store.active_cooldowns("openai").await.unwrap().is_empty());
    }
}
