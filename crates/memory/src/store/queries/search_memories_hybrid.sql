-- $1..$5: the scope; $6 agent, $7 query text, $8 how many text matches get a rank. One row: the
-- user the scope names (NULL: an unknown session), the version of the user's memories, and the
-- best text matches with their full-text scores (ids and scores in the same order). The memory
-- service scores every memory of the user from the vectors it keeps at that version
-- (memories/vectors.rs), reading them (memories_with_vectors.sql) when it has none.
WITH who AS MATERIALIZED (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key),
q AS MATERIALIZED (SELECT agentloop_memory_query($7) AS query),
hits AS (
    SELECT c.id, ts_rank_cd(c.search, q.query, 32)::float8 AS score
    FROM (
        SELECT m.id, m.search
        FROM memories AS m, who, q
        WHERE m.user_key = who.user_key AND m.agent_id = $6 AND m.search @@ q.query
        ORDER BY ts_rank(m.search, q.query) DESC
        LIMIT $8
    ) AS c, q
)
SELECT who.user_key,
       coalesce((SELECT v.version FROM memory_versions AS v
                 WHERE v.user_key = who.user_key AND v.agent_id = $6), 0) AS version,
       coalesce((SELECT array_agg(h.id ORDER BY h.id) FROM hits AS h), '{}') AS hit_ids,
       coalesce((SELECT array_agg(h.score ORDER BY h.id) FROM hits AS h), '{}') AS hit_scores
FROM who
