-- resolve_session.sql for a gateway caller: a new session belongs to its principal ($5); an
-- existing one comes back with `visible` false when the caller ($5, admin $6) may not see it.
-- A lost first-sight race returns no row, as in resolve_session.sql; the caller runs it again.
WITH found AS (
    SELECT id, key, agent_id, channel, model_override, queue_mode, created_at, owner
    FROM sessions
    WHERE key = $1
), inserted AS (
    INSERT INTO sessions (id, key, agent_id, channel, owner)
    SELECT $2::uuid, $1::text, $3::text, $4::text, $5::text
    WHERE NOT EXISTS (SELECT 1 FROM found)
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, agent_id, channel, model_override, queue_mode, created_at, owner
)
SELECT id, key, agent_id, channel, model_override, queue_mode, created_at, false AS created,
       (owner IS NOT DISTINCT FROM $5::text OR $6::bool) AS visible
FROM found
UNION ALL
SELECT id, key, agent_id, channel, model_override, queue_mode, created_at, true AS created,
       true AS visible
FROM inserted
