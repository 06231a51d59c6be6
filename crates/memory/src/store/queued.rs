//! Inputs taken into a live run: steering at a safe point, collected messages merged into one turn.

use uuid::Uuid;

use super::{InboxItem, Store, error::translate};
use crate::MemoryError;

#[derive(sqlx::FromRow)]
struct QueuedRow {
    held: bool,
    seq: Option<i64>,
    idempotency_key: Option<String>,
    kind: Option<String>,
    payload: Option<Vec<u8>>,
}

impl Store {
    /// Marks every pending input of `kinds` consumed by `run_id` and returns them oldest first,
    /// while `epoch` holds the lease.
    ///
    /// # Errors
    /// [`MemoryError::LeaseLost`], [`MemoryError::SessionNotFound`], or a database error.
    pub async fn take_queued(
        &self,
        session_id: Uuid,
        epoch: i64,
        run_id: Uuid,
        kinds: &[String],
    ) -> Result<Vec<InboxItem>, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query_as::<_, QueuedRow>(include_str!("queries/take_queued.sql"))
            .bind(session_id)
            .bind(epoch)
            .bind(run_id)
            .bind(kinds)
            .fetch_all(&mut *conn)
            .await;
        let rows = conn
            .settle(result)
            .map_err(|err| translate(err, session_id))?;
        if !rows.first().is_some_and(|row| row.held) {
            return Err(self.lease_failure(session_id, epoch).await);
        }
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                Some(InboxItem {
                    seq: row.seq?,
                    idempotency_key: row.idempotency_key?,
                    kind: row.kind?,
                    payload: row.payload?,
                })
            })
            .collect())
    }
}

impl Store {
    /// Puts an input in the inbox and tries to claim the session for `owner`; when the claim
    /// succeeds and `take_with_history` is set, also takes the next input (as
    /// [`Store::take_next`]) and reads that much history, all in one transaction.
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`], or a database error.
    #[allow(clippy::too_many_arguments)] // one statement's parameters, plus what to take along
    pub async fn enqueue_claim_take(
        &self,
        session_id: Uuid,
        idempotency_key: &str,
        kind: super::InboxKind,
        payload: &[u8],
        owner: &str,
        ttl: std::time::Duration,
        take_with_history: Option<super::HistoryAsk>,
    ) -> Result<
        (
            super::Enqueued,
            super::Claim,
            Option<(Option<super::Taken>, (bool, Vec<super::Entry>))>,
        ),
        MemoryError,
    > {
        let claim = super::inbox::ClaimAlong {
            owner,
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            take_with_history,
        };
        let row = super::inbox::enqueue_call(
            self,
            session_id,
            idempotency_key,
            kind,
            payload,
            Some(claim),
        )
        .await?;
        let enqueued = row.enqueued();
        let claim = super::Claim {
            claimed: row.claimed.unwrap_or(false),
            epoch: row.epoch.unwrap_or_default(),
            owner: row.owner.clone(),
        };
        let taken = (take_with_history.is_some() && claim.claimed).then(|| row.taken(session_id));
        Ok((enqueued, claim, taken))
    }
}

#[cfg(test)]
mod tests {
    use sqlx::PgPool;

    use crate::store::{InboxKind, Store};

    #[sqlx::test(migrations = "./migrations")]
    async fn take_queued_consumes_only_the_asked_kinds_for_the_lease_holder(pool: PgPool) {
        let store = Store::new(pool);
        let session = store.resolve_session("k", "main", None).await.unwrap();
        let id = session.id;
        store.enqueue(id, "a", InboxKind::User, b"a").await.unwrap();
        store
            .enqueue(id, "s1", InboxKind::Steer, b"s1")
            .await
            .unwrap();
        store
            .enqueue(id, "s2", InboxKind::Steer, b"s2")
            .await
            .unwrap();
        let claim = store
            .claim_session(id, "me", std::time::Duration::from_secs(30))
            .await
            .unwrap();
        let taken = store
            .take_next(id, claim.epoch, "me")
            .await
            .unwrap()
            .unwrap();

        let steer = store
            .take_queued(id, claim.epoch, taken.run.id, &["steer".to_owned()])
            .await
            .unwrap();

        let keys: Vec<_> = steer.iter().map(|i| i.idempotency_key.as_str()).collect();
        assert_eq!(keys, vec!["s1", "s2"]);
        let again = store
            .take_queued(id, claim.epoch, taken.run.id, &["steer".to_owned()])
            .await
            .unwrap();
        assert!(again.is_empty());
        let stale = store
            .take_queued(id, claim.epoch + 1, taken.run.id, &["steer".to_owned()])
            .await;
        assert!(stale.is_err(), "a stale epoch must be refused");
    }
}
