-- $1 user, $2 agent, $3 model: every memory of the user, each with its vector when it is of
-- that model, and the version they are at (the same on every row).
SELECT m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
       0::float8 AS score,
       CASE WHEN m.embedding_model = $3 THEN m.embedding END AS embedding,
       v.count AS version_count, v.hash AS version_hash
FROM agentloop_memories_version($1, $2) AS v, memories AS m
WHERE m.user_key = $1 AND m.agent_id = $2
