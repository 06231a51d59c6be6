//! The append-only transcript of a session.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use uuid::Uuid;

use super::{Entry, NewEntry, Store, error::translate};
use crate::MemoryError;

#[derive(sqlx::FromRow)]
pub(crate) struct Appended {
    pub(crate) held: bool,
    pub(crate) appended: i64,
}

/// Binds entries as the seven parallel arrays the run-path functions unnest, in request order.
pub(crate) fn bind_entries<'q, O>(
    query: QueryAs<'q, Postgres, O, PgArguments>,
    entries: impl Iterator<Item = &'q NewEntry> + Clone,
) -> QueryAs<'q, Postgres, O, PgArguments> {
    let column =
        |f: fn(&'q NewEntry) -> Option<&'q str>| entries.clone().map(f).collect::<Vec<_>>();
    query
        .bind(column(|e| Some(e.key.as_str())))
        .bind(column(|e| Some(e.role.as_str())))
        .bind(column(|e| Some(e.content.as_str())))
        .bind(entries.clone().map(|e| e.run_id).collect::<Vec<_>>())
        .bind(column(|e| e.tool_call_id.as_deref()))
        .bind(column(|e| e.tool_name.as_deref()))
        .bind(column(|e| e.data.as_deref()))
}

/// Runs the fenced multi-row append on any executor.
pub(crate) async fn append_on<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    session_id: Uuid,
    epoch: i64,
    entries: &[NewEntry],
) -> Result<Appended, sqlx::Error> {
    let query = sqlx::query_as::<_, Appended>(include_str!("queries/append_entries.sql"))
        .bind(session_id)
        .bind(epoch);
    bind_entries(query, entries.iter())
        .fetch_one(executor)
        .await
}

impl Store {
    /// Returns the newest `limit` entries of a session, oldest first (none for an unknown
    /// session: telling the two apart would cost a second lookup on every read).
    ///
    /// # Errors
    /// A database error.
    pub async fn get_history(
        &self,
        session_id: Uuid,
        limit: u32,
    ) -> Result<Vec<Entry>, MemoryError> {
        let ask = super::HistoryAsk {
            limit,
            after_seq: 0,
        };
        Ok(self.history_window(session_id, ask).await?.1)
    }

    /// Returns the newest `ask.limit` entries, oldest first, or only those after
    /// `ask.after_seq` when that entry still exists; says which it did.
    ///
    /// # Errors
    /// A database error.
    pub async fn history_window(
        &self,
        session_id: Uuid,
        ask: super::HistoryAsk,
    ) -> Result<(bool, Vec<Entry>), MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query_as::<_, super::inbox::HistoryWindow>(include_str!(
            "queries/history_window.sql"
        ))
        .bind(session_id)
        .bind(i64::from(ask.limit))
        .bind(ask.after_seq)
        .fetch_one(&mut *conn)
        .await;
        conn.settle(result)
            .map(super::inbox::HistoryWindow::into_entries)
            .map_err(|err| translate(err, session_id))
    }

    /// Appends entries for the lease holder `epoch`, skipping those whose key exists; returns
    /// how many were new.
    ///
    /// # Errors
    /// [`MemoryError::LeaseLost`] when `epoch` no longer holds the lease,
    /// [`MemoryError::SessionNotFound`], or a database error.
    pub async fn append_entries(
        &self,
        session_id: Uuid,
        epoch: i64,
        entries: &[NewEntry],
    ) -> Result<u32, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let appended = append_on(&mut *conn, session_id, epoch, entries).await;
        let result = conn
            .settle(appended)
            .map_err(|err| translate(err, session_id))?;
        if !result.held {
            return Err(self.lease_failure(session_id, epoch).await);
        }
        // At most entries.len() rows, which came in one gRPC message.
        Ok(u32::try_from(result.appended).unwrap_or(u32::MAX))
    }
}
