-- Fenced: while the caller holds the lease, marks every pending input of the given kinds as
-- consumed by its live run and returns them oldest first.
WITH lease AS (
    SELECT id
    FROM sessions
    WHERE id = $1 AND lease_epoch = $2 AND lease_owner IS NOT NULL
    FOR SHARE
), taken AS (
    UPDATE session_inbox AS i
    SET consumed_at = now(), run_id = $3
    FROM lease
    WHERE i.session_id = lease.id AND i.consumed_at IS NULL AND i.kind = ANY($4)
    RETURNING i.seq, i.idempotency_key, i.kind, i.payload
)
SELECT EXISTS (SELECT 1 FROM lease) AS held,
       taken.seq, taken.idempotency_key, taken.kind, taken.payload
FROM (SELECT 1) AS one
LEFT JOIN taken ON true
ORDER BY taken.seq
