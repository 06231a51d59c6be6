-- $1..$5: the scope (agentloop_memory_scope); $6 id, $7 agent, $8 text, $9 source. No row: the
-- scope names no user (an unknown session). The same text again refreshes the stored one.
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key)
INSERT INTO memories AS m (id, agent_id, user_key, text, source, session_id)
SELECT $6, $7, who.user_key, $8, $9, $1 FROM who WHERE who.user_key IS NOT NULL
ON CONFLICT (agent_id, user_key, text) DO UPDATE SET updated_at = now()
RETURNING m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
          0::float8 AS score
