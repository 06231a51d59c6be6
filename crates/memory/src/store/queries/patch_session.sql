-- $2/$4/$6 say whether a setting is patched; an empty value clears it. $8/$9: the caller's
-- principal and whether it is an admin; a session it does not see is left alone (no row).
UPDATE sessions
SET model_override = CASE WHEN $2 THEN NULLIF($3, '') ELSE model_override END,
    queue_mode = CASE WHEN $4 THEN NULLIF($5, '') ELSE queue_mode END,
    thinking_level = CASE WHEN $6 THEN NULLIF($7, '') ELSE thinking_level END,
    updated_at = now()
WHERE key = $1 AND (owner IS NOT DISTINCT FROM $8::text OR $9::bool)
RETURNING id, key, agent_id, channel, model_override, queue_mode, thinking_level, input_tokens,
          output_tokens, created_at, updated_at, 0::bigint AS cleared_entries, owner
