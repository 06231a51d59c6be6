//! What the gateway needs: session management (list, reset, patch) and dispatch records, which
//! make a repeated idempotency key return the first answer on every gateway replica.
//!
//! Every call acts for a [`Caller`], and every query applies the same ownership rule: a session
//! is visible when its `owner` is the caller's principal (`IS NOT DISTINCT FROM`, so a caller
//! without principal sees the unowned ones) or the caller is an admin. A session the caller may
//! not see is answered exactly like a missing one, so its existence is not disclosed either.

mod dispatch;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Session, Store, error::translate};
use crate::MemoryError;

pub use dispatch::{Dispatch, DispatchLookup};

/// A session with its settings and usage.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionInfo {
    /// The id the memory service assigned.
    pub id: Uuid,
    /// The client's session key.
    pub key: String,
    /// The agent serving the session.
    pub agent_id: String,
    /// The channel the session was first seen on.
    pub channel: Option<String>,
    /// A model chosen for this session.
    pub model_override: Option<String>,
    /// The session's queue mode.
    pub queue_mode: Option<String>,
    /// The session's thinking level.
    pub thinking_level: Option<String>,
    /// Prompt tokens used so far.
    pub input_tokens: i64,
    /// Completion tokens used so far.
    pub output_tokens: i64,
    /// When the session was first seen.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Transcript entries removed by a reset (0 otherwise).
    pub cleared_entries: i64,
    /// The gateway principal it belongs to, if any.
    pub owner: Option<String>,
}

/// Whom a gateway call acts for: the sessions it sees and the owner of those it creates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// Owns the sessions created for the caller; without `admin`, the only owner whose
    /// sessions it sees (`None`: it sees the unowned ones).
    pub principal: Option<String>,
    /// Sees every session.
    pub admin: bool,
}

impl Caller {
    /// Returns an admin without principal: memory's own lookups, which a checked call precedes.
    pub fn admin() -> Self {
        Self {
            principal: None,
            admin: true,
        }
    }
}

/// A session resolved for a caller, and whether that caller may see it.
#[derive(sqlx::FromRow)]
struct OwnedSession {
    #[sqlx(flatten)]
    session: Session,
    visible: bool,
}

/// A session's settings to change: `None` keeps a setting, `Some("")` clears it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionPatch {
    /// The model override.
    pub model_override: Option<String>,
    /// The queue mode.
    pub queue_mode: Option<String>,
    /// The thinking level.
    pub thinking_level: Option<String>,
}

impl Store {
    /// Returns up to `limit` sessions `caller` sees, most recently updated first, only
    /// `agent_id`'s and `key`'s when set. Creates nothing.
    ///
    /// # Errors
    /// A database error.
    pub async fn list_sessions(
        &self,
        limit: u32,
        agent_id: Option<&str>,
        key: Option<&str>,
        caller: &Caller,
    ) -> Result<Vec<SessionInfo>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, SessionInfo>(include_str!("queries/list_sessions.sql"))
            .bind(i64::from(limit))
            .bind(agent_id)
            .bind(key)
            .bind(caller.principal.as_deref())
            .bind(caller.admin)
            .fetch_all(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Clears the transcript of the session keyed `key`; its id and settings stay.
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`] when `caller` sees no session with that key, or a
    /// database error.
    pub async fn reset_session(
        &self,
        key: &str,
        caller: &Caller,
    ) -> Result<SessionInfo, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, SessionInfo>(include_str!("queries/reset_session.sql"))
            .bind(key)
            .bind(caller.principal.as_deref())
            .bind(caller.admin)
            .fetch_optional(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?
            .ok_or_else(unknown_key)
    }

    /// Changes the settings of the session keyed `key`.
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`] when `caller` sees no session with that key, or a
    /// database error.
    pub async fn patch_session(
        &self,
        key: &str,
        patch: &SessionPatch,
        caller: &Caller,
    ) -> Result<SessionInfo, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, SessionInfo>(include_str!("queries/patch_session.sql"))
            .bind(key)
            .bind(patch.model_override.is_some())
            .bind(patch.model_override.as_deref().unwrap_or_default())
            .bind(patch.queue_mode.is_some())
            .bind(patch.queue_mode.as_deref().unwrap_or_default())
            .bind(patch.thinking_level.is_some())
            .bind(patch.thinking_level.as_deref().unwrap_or_default())
            .bind(caller.principal.as_deref())
            .bind(caller.admin)
            .fetch_optional(&mut *conn)
            .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?
            .ok_or_else(unknown_key)
    }

    /// Returns the session for `key` as [`Store::resolve_session`] does, except that a session
    /// created here belongs to `caller`'s principal and that one `caller` may not see is not
    /// found.
    ///
    /// # Errors
    /// [`MemoryError::SessionNotFound`] for a session of another owner, or a database error.
    pub async fn resolve_owned_session(
        &self,
        key: &str,
        agent_id: &str,
        channel: Option<&str>,
        caller: &Caller,
    ) -> Result<Session, MemoryError> {
        // A lost first-sight race returns no row; the second try finds the winner's session.
        for _ in 0..2 {
            let mut conn = self.conn(Uuid::nil()).await?;
            let result = sqlx::query_as::<_, OwnedSession>(include_str!(
                "queries/resolve_owned_session.sql"
            ))
            .bind(key)
            .bind(Uuid::now_v7())
            .bind(agent_id)
            .bind(channel)
            .bind(caller.principal.as_deref())
            .bind(caller.admin)
            .fetch_optional(&mut *conn)
            .await;
            let found = conn
                .settle(result)
                .map_err(|err| translate(err, Uuid::nil()))?;
            match found {
                Some(owned) if owned.visible => return Ok(owned.session),
                Some(_) => return Err(unknown_key()),
                None => {}
            }
        }
        Err(MemoryError::Internal(format!(
            "session {key:?} neither found nor created"
        )))
    }
}

/// A session key the caller does not see. `MemoryError` has no variant for a key (and the
/// status mapping lives elsewhere), so it is the not-found of a session without id; the gateway
/// words its own message.
fn unknown_key() -> MemoryError {
    MemoryError::SessionNotFound(Uuid::nil())
}
