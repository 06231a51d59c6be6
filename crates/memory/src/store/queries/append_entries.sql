-- Fenced append in one statement: the session row is locked FOR SHARE only while its epoch
-- still matches, which blocks a competing claim (an UPDATE of that row) until this insert
-- commits, and makes the insert produce nothing once the epoch moved on.
-- Entries are unnested from arrays (one round trip for any batch) and inserted in request
-- order so their seq follows it; a key already present is absorbed.
WITH lease AS (
    SELECT id
    FROM sessions
    WHERE id = $1 AND lease_epoch = $2 AND lease_owner IS NOT NULL
    FOR SHARE
), inserted AS (
    INSERT INTO transcript_entries
        (session_id, entry_key, role, content, run_id, tool_call_id, tool_name, data)
    SELECT lease.id, e.entry_key, e.role, e.content, e.run_id, e.tool_call_id, e.tool_name, e.data
    FROM lease
    CROSS JOIN UNNEST($3::text[], $4::text[], $5::text[], $6::uuid[], $7::text[], $8::text[], $9::text[])
        WITH ORDINALITY AS e (entry_key, role, content, run_id, tool_call_id, tool_name, data, ord)
    ORDER BY e.ord
    ON CONFLICT (session_id, entry_key) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM lease) AS held, (SELECT count(*) FROM inserted) AS appended
