-- Deletes a bounded batch of expired records, oldest first, so no call pays for a backlog.
-- Committed without waiting for the WAL flush: a delete lost with a crash is swept again.
DELETE FROM dispatches
USING (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE ctid IN (
    SELECT ctid FROM dispatches WHERE expires_at < now() ORDER BY expires_at LIMIT 500
)
