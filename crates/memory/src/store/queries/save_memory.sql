-- $1..$5: the scope (agentloop_memory_scope); $6 id, $7 agent, $8 text, $9 source, $10 the
-- text's embedding and $11 its model (both NULL without one). No row: the scope names no user
-- (an unknown session). The same text again refreshes the stored one, and its vector when given.
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key)
INSERT INTO memories AS m (id, agent_id, user_key, text, source, session_id, embedding,
                           embedding_model)
SELECT $6, $7, who.user_key, $8, $9, $1, $10, $11 FROM who WHERE who.user_key IS NOT NULL
ON CONFLICT (agent_id, user_key, text) DO UPDATE
SET updated_at = now(),
    embedding = coalesce(excluded.embedding, m.embedding),
    embedding_model = CASE WHEN excluded.embedding IS NULL THEN m.embedding_model
                           ELSE excluded.embedding_model END
RETURNING m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
          0::float8 AS score
