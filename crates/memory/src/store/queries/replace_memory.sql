-- $1..$5: the scope; $6 the memory's id, $7 agent, $8 its new text, $9 source, $10 and $11 the
-- new text's embedding and model (NULL drops the old text's vector, which no longer fits). No
-- row: no such memory of the scope's user. A text the user already has elsewhere keeps that one.
WITH who AS (SELECT agentloop_memory_scope($1, $2, $3, $4, $5) AS user_key)
UPDATE memories AS m
SET text = $8, source = $9, updated_at = now(), embedding = $10, embedding_model = $11
FROM who
WHERE m.id = $6 AND m.user_key = who.user_key AND m.agent_id = $7
  AND NOT EXISTS (SELECT 1 FROM memories AS o
                  WHERE o.agent_id = $7 AND o.user_key = who.user_key AND o.text = $8
                    AND o.id <> $6)
RETURNING m.id, m.agent_id, m.user_key, m.text, m.source, m.created_at, m.updated_at,
          0::float8 AS score
