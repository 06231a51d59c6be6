//! Long-term memory per (agent, user) and each session's skills snapshot. The user a call is
//! about is resolved in SQL (`agentloop_memory_scope`), in the statement that uses it.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Store, error::translate};
use crate::MemoryError;

mod hybrid;
mod vectors;

pub use hybrid::Embedding;
pub use vectors::DEFAULT_BUDGET_BYTES as DEFAULT_VECTOR_CACHE_BYTES;
pub(crate) use vectors::VectorCache;

/// Whose memories a call touches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryScope {
    /// The agent; empty for memories shared by all of the user's agents.
    pub agent_id: String,
    /// The user derived from this session (its principal, else the sender, else its key).
    pub session_id: Option<Uuid>,
    /// The message's sender, with `session_id`.
    pub sender_id: String,
    /// The message's channel, with `session_id`.
    pub channel: String,
    /// A gateway principal, without `session_id`.
    pub principal: String,
    /// A user key as stored, without either of the above.
    pub user_key: String,
}

/// A stored memory.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct Memory {
    /// Its id.
    pub id: Uuid,
    /// The agent ('' when shared across agents).
    pub agent_id: String,
    /// The user it belongs to.
    pub user_key: String,
    /// What is remembered.
    pub text: String,
    /// `tool`, `learned` or `operator`.
    pub source: String,
    /// When it was first stored.
    pub created_at: DateTime<Utc>,
    /// When it was last stored again.
    pub updated_at: DateTime<Utc>,
    /// Relevance to the query, 0..1 (0 outside a search).
    pub score: f64,
}

/// Most memories of one user a hybrid search scores by vector: the newest by `updated_at`.
/// Without a bound one search would read every memory and vector of the user into memory (and
/// keep them in the vector cache), however many a user piles up: 5000 vectors of 1536
/// dimensions are about 30 MiB, read in one statement and scored in milliseconds. A
/// memory older than the newest 5000 is still found by full-text search, but not by a hybrid
/// one; a user past this many memories should have the old ones forgotten or consolidated.
const MAX_VECTOR_CANDIDATES: i64 = 5000;

/// The first answer of a hybrid search: whose memories, at which version, and the text matches.
#[derive(sqlx::FromRow)]
struct HybridHead {
    user_key: Option<String>,
    version: i64,
    hit_ids: Vec<Uuid>,
    hit_scores: Vec<f64>,
}

/// A memory with its stored vector and the version of its user's memories.
#[derive(sqlx::FromRow)]
struct WithVector {
    #[sqlx(flatten)]
    memory: Memory,
    embedding: Option<Vec<u8>>,
    version: i64,
}

/// A session's skills snapshot.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SkillSnapshot {
    /// 1 for the session's first.
    pub version: i32,
    /// The digest the runner computed over the skills.
    pub digest: String,
    /// The skills, as the runner stored them.
    pub skills: String,
    /// When it was taken.
    pub created_at: DateTime<Utc>,
}

/// The longest memory stored (the column's check says the same).
pub const MAX_MEMORY_CHARS: usize = 4000;

impl Store {
    /// Stores `text` for the scope's user; the same text again only refreshes the stored one.
    ///
    /// # Errors
    /// [`MemoryError::InvalidArgument`] for an empty or too long text or a scope naming no user,
    /// [`MemoryError::SessionNotFound`] for an unknown session, or a database error.
    pub async fn save_memory(
        &self,
        scope: &MemoryScope,
        text: &str,
        source: &str,
    ) -> Result<Memory, MemoryError> {
        self.save_or_replace_memory(scope, None, text, source, None)
            .await
    }

    /// Like [`Self::save_memory`]; with `replace` that memory of the user gets the text instead
    /// (a learned fact that updates one already stored). Replacing with a text the user has in
    /// another memory, or a memory not found, stores nothing new and returns the existing text's
    /// memory through a plain save. `embedding`, the text's vector, is kept beside it for
    /// hybrid search; a replaced text without one loses the old text's vector.
    ///
    /// # Errors
    /// As [`Self::save_memory`].
    pub async fn save_or_replace_memory(
        &self,
        scope: &MemoryScope,
        replace: Option<Uuid>,
        text: &str,
        source: &str,
        embedding: Option<&Embedding>,
    ) -> Result<Memory, MemoryError> {
        let vector = embedding.map(Embedding::to_bytes);
        let model = embedding.map(Embedding::model);
        let text = text.trim();
        if text.is_empty() || text.chars().count() > MAX_MEMORY_CHARS {
            return Err(MemoryError::InvalidArgument(format!(
                "a memory holds 1 to {MAX_MEMORY_CHARS} characters"
            )));
        }
        if let Some(id) = replace {
            let mut conn = self.conn(Uuid::nil()).await?;
            let result = bind_scope(
                sqlx::query_as::<_, Memory>(include_str!("queries/replace_memory.sql")),
                scope,
            )
            .bind(id)
            .bind(&scope.agent_id)
            .bind(text)
            .bind(source)
            .bind(vector.as_deref())
            .bind(model)
            .fetch_optional(&mut *conn)
            .await;
            if let Some(replaced) = conn
                .settle(result)
                .map_err(|err| translate(err, Uuid::nil()))?
            {
                return Ok(replaced);
            }
        }
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = bind_scope(
            sqlx::query_as::<_, Memory>(include_str!("queries/save_memory.sql")),
            scope,
        )
        .bind(Uuid::now_v7())
        .bind(&scope.agent_id)
        .bind(text)
        .bind(source)
        .bind(vector.as_deref())
        .bind(model)
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?
            .ok_or_else(|| no_user(scope))
    }

    /// Returns the scope's memories matching `query` best, at most `limit`, scoring at least
    /// `min_score`, and whether the user has no memories at all (asked only when none match).
    /// With `embedding`, the query's vector, the search is hybrid: vector similarity with
    /// memories embedded by the same model plus full-text rank ([`hybrid_score`]); without
    /// it, full text alone.
    ///
    /// # Errors
    /// A database error.
    pub async fn search_memories(
        &self,
        scope: &MemoryScope,
        query: &str,
        embedding: Option<&Embedding>,
        limit: u32,
        min_score: f64,
    ) -> Result<(Vec<Memory>, bool), MemoryError> {
        let limit = limit.clamp(1, 100);
        let found = match embedding {
            Some(embedding) => {
                self.search_hybrid(scope, query, embedding, limit, min_score)
                    .await?
            }
            None => self.search_text(scope, query, limit, min_score).await?,
        };
        if !found.is_empty() {
            return Ok((found, false));
        }
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = bind_scope(
            sqlx::query_scalar::<_, bool>(
                "SELECT NOT EXISTS (SELECT 1 FROM memories \
                 WHERE user_key = agentloop_memory_scope($1, $2, $3, $4, $5) AND agent_id = $6)",
            ),
            scope,
        )
        .bind(&scope.agent_id)
        .fetch_one(&mut *conn)
        .await;
        let none = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        Ok((found, none))
    }

    async fn search_text(
        &self,
        scope: &MemoryScope,
        query: &str,
        limit: u32,
        min_score: f64,
    ) -> Result<Vec<Memory>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = bind_scope(
            sqlx::query_as::<_, Memory>(include_str!("queries/search_memories.sql")),
            scope,
        )
        .bind(&scope.agent_id)
        .bind(query)
        .bind(min_score)
        .bind(i64::from(limit))
        .bind(ranked_text_matches(limit))
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    async fn search_hybrid(
        &self,
        scope: &MemoryScope,
        query: &str,
        embedding: &Embedding,
        limit: u32,
        min_score: f64,
    ) -> Result<Vec<Memory>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = bind_scope(
            sqlx::query_as::<_, HybridHead>(include_str!("queries/search_memories_hybrid.sql")),
            scope,
        )
        .bind(&scope.agent_id)
        .bind(query)
        .bind(ranked_text_matches(limit))
        .fetch_one(&mut *conn)
        .await;
        let head = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        let Some(user_key) = head.user_key else {
            return Ok(Vec::new());
        };
        let key = vectors::Key {
            user_key,
            agent_id: scope.agent_id.clone(),
            model: embedding.model().to_owned(),
        };
        let entry = match self.vectors.get(&key, head.version) {
            Some(entry) => entry,
            None => self.read_vectors(key, head.version).await?,
        };
        let text_scores = head.hit_ids.into_iter().zip(head.hit_scores).collect();
        Ok(hybrid::rank(
            &entry,
            &text_scores,
            embedding,
            limit as usize,
            min_score,
        ))
    }

    /// Reads the newest [`MAX_VECTOR_CANDIDATES`] memories of `key`'s user with their vectors,
    /// and keeps them for later searches at the version read with them (`seen`, the one the
    /// search saw, when the user has none).
    async fn read_vectors(
        &self,
        key: vectors::Key,
        seen: i64,
    ) -> Result<std::sync::Arc<vectors::Entry>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result =
            sqlx::query_as::<_, WithVector>(include_str!("queries/memories_with_vectors.sql"))
                .bind(&key.user_key)
                .bind(&key.agent_id)
                .bind(&key.model)
                .bind(MAX_VECTOR_CANDIDATES)
                .fetch_all(&mut *conn)
                .await;
        let rows = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        let version = rows.first().map_or(seen, |r| r.version);
        let memories = rows
            .into_iter()
            .map(|r| (r.memory, r.embedding.as_deref().and_then(hybrid::unpacked)))
            .collect();
        let entry = std::sync::Arc::new(vectors::Entry::new(version, memories));
        self.vectors.put(key, entry.clone());
        Ok(entry)
    }

    /// Deletes the scope's memory `id`, or with `id` empty every one `query` matches with at
    /// least `min_score`; returns the ids deleted.
    ///
    /// # Errors
    /// [`MemoryError::InvalidArgument`] when neither is given, or a database error.
    pub async fn forget_memories(
        &self,
        scope: &MemoryScope,
        id: Option<Uuid>,
        query: &str,
        min_score: f64,
    ) -> Result<Vec<Uuid>, MemoryError> {
        if id.is_none() && query.trim().is_empty() {
            return Err(MemoryError::InvalidArgument(
                "forget needs an id or a query".to_owned(),
            ));
        }
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = bind_scope(
            sqlx::query_scalar::<_, Uuid>(include_str!("queries/forget_memories.sql")),
            scope,
        )
        .bind(&scope.agent_id)
        .bind(id)
        .bind(query)
        .bind(min_score)
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Returns the user the scope resolves to and that user's memories, newest first.
    ///
    /// # Errors
    /// [`MemoryError::InvalidArgument`] for a scope naming no user, or a database error.
    pub async fn list_memories(
        &self,
        scope: &MemoryScope,
        limit: u32,
    ) -> Result<(String, Vec<Memory>), MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let who = bind_scope(
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT agentloop_memory_scope($1, $2, $3, $4, $5)",
            ),
            scope,
        )
        .fetch_one(&mut *conn)
        .await;
        let who = conn
            .settle(who)
            .map_err(|err| translate(err, Uuid::nil()))?
            .ok_or_else(|| no_user(scope))?;
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Memory>(include_str!("queries/list_memories.sql"))
            .bind(&who)
            .bind(&scope.agent_id)
            .bind(i64::from(limit.clamp(1, 1000)))
            .fetch_all(&mut *conn)
            .await;
        let memories = conn
            .settle(result)
            .map_err(|err| translate(err, Uuid::nil()))?;
        Ok((who, memories))
    }

    /// Memories of every user holding no vector of `model`, in id order after `after`, at most
    /// `limit`: what a backfill embeds after `memory.embeddings_model` is set.
    ///
    /// # Errors
    /// A database error.
    pub async fn memories_to_embed(
        &self,
        model: &str,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<Memory>, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query_as::<_, Memory>(
            "SELECT id, agent_id, user_key, text, source, created_at, updated_at, \
                    0::float8 AS score \
             FROM memories \
             WHERE embedding_model IS DISTINCT FROM $1 AND ($2::uuid IS NULL OR id > $2) \
             ORDER BY id LIMIT $3",
        )
        .bind(model)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Gives memory `id` the vector of `text`, only while it still holds that text (a memory
    /// replaced since keeps its new text and waits for the next backfill); false when not.
    ///
    /// # Errors
    /// A database error.
    pub async fn set_memory_embedding(
        &self,
        id: Uuid,
        text: &str,
        embedding: &Embedding,
    ) -> Result<bool, MemoryError> {
        let mut conn = self.conn(Uuid::nil()).await?;
        let result = sqlx::query(
            "UPDATE memories SET embedding = $3, embedding_model = $4 WHERE id = $1 AND text = $2",
        )
        .bind(id)
        .bind(text)
        .bind(embedding.to_bytes())
        .bind(embedding.model())
        .execute(&mut *conn)
        .await;
        conn.settle(result)
            .map(|done| done.rows_affected() == 1)
            .map_err(|err| translate(err, Uuid::nil()))
    }

    /// Returns the session's current skills snapshot, if it has one.
    ///
    /// # Errors
    /// A database error.
    pub async fn skill_snapshot(
        &self,
        session_id: Uuid,
    ) -> Result<Option<SkillSnapshot>, MemoryError> {
        let mut conn = self.conn(session_id).await?;
        let result = sqlx::query_as::<_, SkillSnapshot>(
            "SELECT version, digest, skills::text AS skills, created_at FROM skill_snapshots \
             WHERE session_id = $1 AND retired_at IS NULL ORDER BY version DESC LIMIT 1",
        )
        .bind(session_id)
        .fetch_optional(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, session_id))
    }

    /// Takes `skills` as the session's snapshot unless it has a current one already, and
    /// returns the current one (a snapshot holds until `/new` or `/reset` retires it).
    ///
    /// # Errors
    /// [`MemoryError::InvalidArgument`] for skills that are not JSON,
    /// [`MemoryError::SessionNotFound`] for an unknown session, or a database error.
    pub async fn save_skill_snapshot(
        &self,
        session_id: Uuid,
        digest: &str,
        skills: &str,
    ) -> Result<SkillSnapshot, MemoryError> {
        if serde_json::from_str::<serde_json::Value>(skills).is_err() {
            return Err(MemoryError::InvalidArgument(
                "skills_json is not JSON".to_owned(),
            ));
        }
        let mut conn = self.conn(session_id).await?;
        // Only the session's lease owner takes snapshots, so two inserts of one version do not
        // race in practice; one that does finds the other's row and keeps it.
        let result = sqlx::query(
            "INSERT INTO skill_snapshots (session_id, version, digest, skills) \
             SELECT $1, coalesce(max(version), 0) + 1, $2, $3::jsonb FROM skill_snapshots \
             WHERE session_id = $1 \
             HAVING count(*) FILTER (WHERE retired_at IS NULL) = 0 \
             ON CONFLICT DO NOTHING",
        )
        .bind(session_id)
        .bind(digest)
        .bind(skills)
        .execute(&mut *conn)
        .await;
        conn.settle(result)
            .map_err(|err| translate(err, session_id))?;
        self.skill_snapshot(session_id)
            .await?
            .ok_or(MemoryError::SessionNotFound(session_id))
    }
}

/// How many of the memories matching a query's words a search ranks (cheap `ts_rank` first),
/// before the best of them get the reported cover-density score: four times the results asked
/// for, at least 80.
fn ranked_text_matches(limit: u32) -> i64 {
    i64::from(limit.max(20)) * 4
}

/// Binds `$1..$5`, the arguments of `agentloop_memory_scope`.
fn bind_scope<'q, Q: BindScope<'q>>(query: Q, scope: &'q MemoryScope) -> Q {
    query
        .bind_uuid(scope.session_id)
        .bind_str(&scope.sender_id)
        .bind_str(&scope.channel)
        .bind_str(&scope.principal)
        .bind_str(&scope.user_key)
}

/// The two query kinds the scope is bound to.
trait BindScope<'q>: Sized {
    fn bind_uuid(self, value: Option<Uuid>) -> Self;
    fn bind_str(self, value: &'q str) -> Self;
}

type Args = sqlx::postgres::PgArguments;

impl<'q, O> BindScope<'q> for sqlx::query::QueryAs<'q, sqlx::Postgres, O, Args> {
    fn bind_uuid(self, value: Option<Uuid>) -> Self {
        self.bind(value)
    }
    fn bind_str(self, value: &'q str) -> Self {
        self.bind(value)
    }
}

impl<'q, O> BindScope<'q> for sqlx::query::QueryScalar<'q, sqlx::Postgres, O, Args> {
    fn bind_uuid(self, value: Option<Uuid>) -> Self {
        self.bind(value)
    }
    fn bind_str(self, value: &'q str) -> Self {
        self.bind(value)
    }
}

fn no_user(scope: &MemoryScope) -> MemoryError {
    match scope.session_id {
        Some(session) => MemoryError::SessionNotFound(session),
        None => MemoryError::InvalidArgument(
            "a memory scope needs a session, a principal or a user key".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests;
