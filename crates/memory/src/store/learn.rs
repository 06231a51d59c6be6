//! Learn jobs: a run's exchange queued for the learn model, leased by one runner at a time.

use std::time::Duration;

use uuid::Uuid;

use super::{MemoryScope, Store, error::translate};
use crate::MemoryError;

/// A queued exchange.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct LearnJob {
    /// Its id.
    pub id: Uuid,
    /// The session it came from.
    pub session_id: Uuid,
    /// The run it came from (one job per run).
    pub run_id: Uuid,
    /// The agent ('' when its memory is shared across agents).
    pub agent_id: String,
    /// Whether the agent's memory is shared across agents.
    pub shared: bool,
    /// The message's sender.
    pub sender_id: String,
    /// The message's channel.
    pub channel: String,
    /// What was said.
    pub exchange: String,
    /// Claims so far, this one included.
    pub attempts: i32,
}

impl LearnJob {
    /// Whose memories the job writes.
    pub fn scope(&self) -> MemoryScope {
        MemoryScope {
            agent_id: if self.shared {
                String::new()
            } else {
                self.agent_id.clone()
            },
            session_id: Some(self.session_id),
            sender_id: self.sender_id.clone(),
            channel: self.channel.clone(),
            ..Default::default()
        }
    }
}

impl Store {
    /// Queues `job` unless its run's job exists; returns whether it was queued now.
    ///
    /// # Errors
    /// A database error.
    pub async fn enqueue_learn_job(&self, job: &LearnJob) -> Result<bool, MemoryError> {
        let mut conn = self.conn(job.session_id).await?;
        let result = sqlx::query(
            "INSERT INTO learn_jobs (id, run_id, session_id, agent_id, shared, sender_id, channel, exchange) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(job.id)
        .bind(job.run_id)
        .bind(job.session_id)
        .bind(&job.agent_id)
        .bind(job.shared)
        .bind(&job.sender_id)
        .bind(&job.channel)
        .bind(&job.exchange)
        .execute(&mut *conn)
        .await;
        let done = conn
            .settle(result)
            .map_err(|err| translate(err, job.session_id))?;
        Ok(done.rows_affected() == 1)
    }

    /// Leases the oldest pending job that no live lease holds, for `owner` and `ttl`.
    ///
    /// # Errors
    /// A database error.
    pub async fn claim_learn_job(
        &self,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<LearnJob>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, LearnJob>(
            "UPDATE learn_jobs AS j SET lease_owner = $1, \
               lease_expires_at = now() + make_interval(secs => $2::float8 / 1000), \
               attempts = j.attempts + 1 \
             WHERE j.id = (SELECT id FROM learn_jobs \
                           WHERE status = 'pending' \
                             AND (lease_expires_at IS NULL OR lease_expires_at < now()) \
                           ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING j.id, j.session_id, j.run_id, j.agent_id, j.shared, j.sender_id, \
                       j.channel, j.exchange, j.attempts",
        )
        .bind(owner)
        .bind(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Ends a job `owner` still leases: done when `ok`, else pending again (another claim
    /// retries it once the lease is given back) or failed for good past `max_attempts`.
    /// Returns whether `owner` held it.
    ///
    /// # Errors
    /// A database error.
    pub async fn finish_learn_job(
        &self,
        id: Uuid,
        owner: &str,
        ok: bool,
        error: &str,
        max_attempts: i32,
    ) -> Result<bool, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query(
            "UPDATE learn_jobs SET \
               status = CASE WHEN $3 THEN 'done' WHEN attempts >= $5 THEN 'failed' ELSE 'pending' END, \
               finished_at = CASE WHEN $3 OR attempts >= $5 THEN now() END, \
               error = nullif($4, ''), lease_owner = NULL, lease_expires_at = NULL \
             WHERE id = $1 AND lease_owner = $2 AND status = 'pending'",
        )
        .bind(id)
        .bind(owner)
        .bind(ok)
        .bind(error)
        .bind(max_attempts.max(1))
        .execute(&mut *conn)
        .await;
        let done = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        Ok(done.rows_affected() == 1)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::PgPool;

    use super::*;

    fn job(run: Uuid, session: Uuid) -> LearnJob {
        LearnJob {
            id: Uuid::now_v7(),
            session_id: session,
            run_id: run,
            agent_id: "main".into(),
            shared: false,
            sender_id: "u".into(),
            channel: "cli".into(),
            exchange: "user: hi".into(),
            attempts: 0,
        }
    }

    #[sqlx::test(migrations = "./migrations")]
    async fn a_job_is_queued_once_leased_by_one_and_taken_over_when_its_lease_ends(pool: PgPool) {
        let store = Store::new(pool);
        let (run, session) = (Uuid::now_v7(), Uuid::now_v7());
        assert!(store.enqueue_learn_job(&job(run, session)).await.unwrap());
        assert!(
            !store.enqueue_learn_job(&job(run, session)).await.unwrap(),
            "once per run"
        );

        let short = Duration::from_millis(50);
        let first = store.claim_learn_job("a", short).await.unwrap().unwrap();
        assert_eq!((first.run_id, first.attempts), (run, 1));
        assert!(
            store.claim_learn_job("b", short).await.unwrap().is_none(),
            "leased by a"
        );
        tokio::time::sleep(Duration::from_millis(80)).await;
        let taken = store.claim_learn_job("b", short).await.unwrap().unwrap();
        assert_eq!(
            (taken.id, taken.attempts),
            (first.id, 2),
            "a died: b takes it over"
        );

        assert!(
            !store
                .finish_learn_job(first.id, "a", true, "", 3)
                .await
                .unwrap(),
            "a lost it"
        );
        assert!(
            store
                .finish_learn_job(first.id, "b", true, "", 3)
                .await
                .unwrap()
        );
        assert!(
            store.claim_learn_job("c", short).await.unwrap().is_none(),
            "done is done"
        );
    }

    #[sqlx::test(migrations = "./migrations")]
    async fn a_failing_job_is_retried_then_given_up(pool: PgPool) {
        let store = Store::new(pool);
        store
            .enqueue_learn_job(&job(Uuid::now_v7(), Uuid::now_v7()))
            .await
            .unwrap();
        let ttl = Duration::from_secs(30);
        for attempt in 1..=2 {
            let held = store.claim_learn_job("a", ttl).await.unwrap().unwrap();
            assert_eq!(held.attempts, attempt);
            store
                .finish_learn_job(held.id, "a", false, "model down", 2)
                .await
                .unwrap();
        }
        assert!(
            store.claim_learn_job("a", ttl).await.unwrap().is_none(),
            "given up"
        );
    }
}
