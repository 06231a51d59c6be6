SELECT id, key, agent_id, channel, model_override, queue_mode, created_at, false AS created
FROM sessions
WHERE key = $1
