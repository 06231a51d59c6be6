-- Deletes a bounded batch of expired records, oldest first, so no call pays for a backlog.
DELETE FROM dispatches
WHERE ctid IN (
    SELECT ctid FROM dispatches WHERE expires_at < now() ORDER BY expires_at LIMIT 500
)
