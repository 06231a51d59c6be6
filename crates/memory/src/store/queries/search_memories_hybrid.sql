-- $1..$5: the scope; $6 agent, $7 query text, $8 the query vector's model, $9 how many text
-- matches get a rank. Every memory of the user with a vector of that model, and the best text
-- matches, each with its full-text score (0 without a match) and its vector (NULL when it has
-- none of that model); the memory service scores and orders them (hybrid.rs).
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key),
q AS MATERIALIZED (SELECT agentloop_memory_query($7) AS query),
text_hits AS (
    SELECT c.id, ts_rank_cd(c.search, q.query, 32)::float8 AS text_score
    FROM (
        SELECT m.id, m.search
        FROM memories AS m, who, q
        WHERE m.user_key = who.user_key AND m.agent_id = $6 AND m.search @@ q.query
        ORDER BY ts_rank(m.search, q.query) DESC
        LIMIT $9
    ) AS c, q
)
SELECT m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
       coalesce(t.text_score, 0) AS score,
       CASE WHEN m.embedding_model = $8 THEN m.embedding END AS embedding
FROM memories AS m
JOIN who ON m.user_key = who.user_key
LEFT JOIN text_hits AS t ON t.id = m.id
WHERE m.agent_id = $6 AND (t.id IS NOT NULL OR m.embedding_model = $8)
