-- $1..$5: the scope; $6 agent, $7 one id, or else every memory query $8 matches with a score
-- of at least $9.
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key),
q AS (SELECT agentloop_memory_query($8) AS query)
DELETE FROM memories AS m USING who, q
WHERE m.user_key = who.user_key AND m.agent_id = $6
  AND CASE WHEN $7::uuid IS NOT NULL THEN m.id = $7
           ELSE m.search @@ q.query AND ts_rank_cd(m.search, q.query, 32) >= $9 END
RETURNING m.id
