-- Reads the session and inserts it only when missing: a known key (every message but the
-- first) costs no write, no dead tuple and no WAL, yet it is still one round trip.
-- Two first sights racing: the loser's insert does nothing and its snapshot cannot see the
-- winner's row, so it returns no row and the caller reads again.
WITH found AS (
    SELECT id, key, agent_id, channel, model_override, queue_mode, created_at
    FROM sessions
    WHERE key = $1
), inserted AS (
    INSERT INTO sessions (id, key, agent_id, channel)
    SELECT $2::uuid, $1::text, $3::text, $4::text
    WHERE NOT EXISTS (SELECT 1 FROM found)
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, agent_id, channel, model_override, queue_mode, created_at
)
SELECT id, key, agent_id, channel, model_override, queue_mode, created_at, false AS created
FROM found
UNION ALL
SELECT id, key, agent_id, channel, model_override, queue_mode, created_at, true AS created
FROM inserted
