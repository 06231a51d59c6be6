-- $2: only this agent's; $3: only this key's; $4/$5: the caller's principal and whether it is
-- an admin. The ownership rule is the same in every gateway query: owner = principal, or admin.
SELECT id, key, agent_id, channel, model_override, queue_mode, thinking_level, input_tokens,
       output_tokens, created_at, updated_at, 0::bigint AS cleared_entries, owner
FROM sessions
WHERE ($2::text IS NULL OR agent_id = $2)
  AND ($3::text IS NULL OR key = $3)
  AND (owner IS NOT DISTINCT FROM $4::text OR $5::bool)
ORDER BY updated_at DESC, created_at DESC
LIMIT $1
