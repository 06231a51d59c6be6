-- Clears the transcript and keeps the session's id, settings and usage.
WITH target AS (
    SELECT id FROM sessions WHERE key = $1
), cleared AS (
    DELETE FROM transcript_entries AS t
    USING target
    WHERE t.session_id = target.id
    RETURNING t.seq
)
UPDATE sessions AS s
SET updated_at = now()
FROM target
WHERE s.id = target.id
RETURNING s.id, s.key, s.agent_id, s.channel, s.model_override, s.queue_mode, s.thinking_level,
          s.input_tokens, s.output_tokens, s.created_at, s.updated_at,
          (SELECT count(*) FROM cleared) AS cleared_entries
