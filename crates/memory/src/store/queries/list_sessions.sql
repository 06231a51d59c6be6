SELECT id, key, agent_id, channel, model_override, queue_mode, thinking_level, input_tokens,
       output_tokens, created_at, updated_at, 0::bigint AS cleared_entries
FROM sessions
WHERE $2::text IS NULL OR agent_id = $2
ORDER BY updated_at DESC, created_at DESC
LIMIT $1
