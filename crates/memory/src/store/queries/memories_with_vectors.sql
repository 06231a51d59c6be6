-- $1 user, $2 agent, $3 model, $4 most rows: the user's newest $4 memories, each with its
-- vector when it is of that model, and the version of the user's memories (memory_versions; 0
-- before the first) in the same snapshot, on every row. The limit bounds what one search reads
-- and keeps for a user with very many memories (memories.rs, MAX_VECTOR_CANDIDATES); the index
-- memories_user gives the order without a sort.
SELECT m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
       0::float8 AS score,
       CASE WHEN m.embedding_model = $3 THEN m.embedding END AS embedding,
       coalesce((SELECT v.version FROM memory_versions AS v
                 WHERE v.user_key = $1 AND v.agent_id = $2), 0) AS version
FROM memories AS m
WHERE m.user_key = $1 AND m.agent_id = $2
ORDER BY m.updated_at DESC
LIMIT $4
