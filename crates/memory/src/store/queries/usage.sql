-- Token usage of the (at most $4) most recently updated sessions caller $1/$2 sees (the same
-- visibility rule as list_sessions.sql), of agent $3 when it is not empty, per model.
WITH visible AS (
    SELECT id, key, agent_id
    FROM sessions
    WHERE (owner IS NOT DISTINCT FROM $1::text OR $2::bool)
      AND ($3::text = '' OR agent_id = $3)
    ORDER BY updated_at DESC
    LIMIT $4
)
SELECT v.key AS session_key, v.agent_id, coalesce(r.model, '') AS model,
       sum(r.input_tokens)::bigint AS input_tokens, sum(r.output_tokens)::bigint AS output_tokens,
       count(*)::bigint AS runs
FROM visible AS v
JOIN runs AS r ON r.session_id = v.id
GROUP BY v.key, v.agent_id, coalesce(r.model, '')
ORDER BY v.key, model
