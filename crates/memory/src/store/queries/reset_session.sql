-- Clears the transcript into transcript_archive and keeps the session's id, settings and usage. $2/$3: the caller's
-- principal and whether it is an admin; a session it does not see is left alone (no row).
WITH target AS (
    SELECT id FROM sessions
    WHERE key = $1 AND (owner IS NOT DISTINCT FROM $2::text OR $3::bool)
), cleared AS (
    DELETE FROM transcript_entries AS t
    USING target
    WHERE t.session_id = target.id
    RETURNING t.*
), archived AS (
    INSERT INTO transcript_archive (session_id, seq, entry_key, role, content, run_id,
                                    tool_call_id, tool_name, data, created_at)
    SELECT session_id, seq, entry_key, role, content, run_id, tool_call_id, tool_name, data,
           created_at
    FROM cleared
    RETURNING seq
), retired AS (
    -- The next run takes a new skills snapshot.
    UPDATE skill_snapshots AS k
    SET retired_at = now()
    FROM target
    WHERE k.session_id = target.id AND k.retired_at IS NULL
    RETURNING k.version
)
UPDATE sessions AS s
SET updated_at = now()
FROM target
WHERE s.id = target.id
RETURNING s.id, s.key, s.agent_id, s.channel, s.model_override, s.queue_mode, s.thinking_level,
          s.input_tokens, s.output_tokens, s.created_at, s.updated_at,
          (SELECT count(*) FROM cleared) AS cleared_entries, s.owner
