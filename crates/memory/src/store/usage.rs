//! Token usage per session and model, for the sessions a gateway caller sees.

use uuid::Uuid;

use super::{Caller, Store, error::translate};
use crate::MemoryError;

/// One session's runs by one model.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct UsageRow {
    /// The session's key.
    pub session_key: String,
    /// Its agent.
    pub agent_id: String,
    /// `provider/model`, empty for runs no model answered.
    pub model: String,
    /// Input tokens of those runs.
    pub input_tokens: i64,
    /// Output tokens of those runs.
    pub output_tokens: i64,
    /// How many runs.
    pub runs: i64,
}

impl Store {
    /// The usage of at most `limit` sessions `caller` sees (of `agent_id` when not empty).
    ///
    /// # Errors
    /// A database error.
    pub async fn usage(
        &self,
        caller: &Caller,
        agent_id: &str,
        limit: u32,
    ) -> Result<Vec<UsageRow>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, UsageRow>(include_str!("queries/usage.sql"))
            .bind(caller.principal.as_deref())
            .bind(caller.admin)
            .bind(agent_id)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }
}
