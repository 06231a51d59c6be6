-- $1..$5: the scope; $6 agent, $7 query text, $8 least score, $9 most rows.
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key),
q AS (SELECT agentloop_memory_query($7) AS query)
SELECT * FROM (
    SELECT m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
           ts_rank_cd(m.search, q.query, 32)::float8 AS score
    FROM memories AS m, who, q
    WHERE m.user_key = who.user_key AND m.agent_id = $6 AND m.search @@ q.query
) AS m
WHERE m.score >= $8
ORDER BY m.score DESC, m.updated_at DESC
LIMIT $9
