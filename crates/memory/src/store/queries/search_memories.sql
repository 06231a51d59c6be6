-- $1..$5: the scope; $6 agent, $7 query text, $8 least score, $9 most rows, $10 how many text
-- matches get a rank (memories.rs, `ranked_text_matches`).
-- The matches are narrowed by ts_rank first (about 1 µs a row) and only the best few get the
-- cover-density score that is reported and compared (ts_rank_cd, about 5 µs a row): ranking all
-- of a user's 700 matching memories with ts_rank_cd took 3.8 ms, this 0.7 ms.
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key),
q AS MATERIALIZED (SELECT agentloop_memory_query($7) AS query),
candidates AS (
    SELECT m.*
    FROM memories AS m, who, q
    WHERE m.user_key = who.user_key AND m.agent_id = $6 AND m.search @@ q.query
    ORDER BY ts_rank(m.search, q.query) DESC
    LIMIT $10
)
SELECT * FROM (
    SELECT c.id, c.agent_id, c.user_key, c.text, c.source, c.created_at, c.updated_at,
           ts_rank_cd(c.search, q.query, 32)::float8 AS score
    FROM candidates AS c, q
) AS m
WHERE m.score >= $8
ORDER BY m.score DESC, m.updated_at DESC
LIMIT $9
