-- Starts from the pending inputs (a small partial index) rather than every session, and lists
-- the sessions that waited longest first.
SELECT s.id
FROM (
    SELECT session_id, min(seq) AS first_seq
    FROM session_inbox
    WHERE consumed_at IS NULL
    GROUP BY session_id
) AS pending
JOIN sessions AS s ON s.id = pending.session_id
WHERE s.lease_owner IS NULL OR s.lease_expires_at < now()
ORDER BY pending.first_seq
LIMIT $1
