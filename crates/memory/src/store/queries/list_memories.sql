-- $1 user key, $2 agent, $3 most rows; newest first.
SELECT m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
       0::float8 AS score
FROM memories AS m
WHERE m.user_key = $1 AND m.agent_id = $2
ORDER BY m.updated_at DESC
LIMIT $3
