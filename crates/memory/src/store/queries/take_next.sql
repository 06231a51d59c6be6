-- Fenced like append_entries: takes the oldest pending input and starts its run, or resumes
-- it (attempts + 1, new epoch and owner) when a previous holder took it before losing the
-- lease. Always returns one row; the item and run columns are NULL when nothing is pending.
WITH lease AS (
    SELECT id
    FROM sessions
    WHERE id = $1 AND lease_epoch = $2 AND lease_owner IS NOT NULL
    FOR SHARE
), item AS (
    SELECT i.seq, i.idempotency_key, i.kind, i.payload
    FROM session_inbox AS i
    JOIN lease ON i.session_id = lease.id
    WHERE i.consumed_at IS NULL
    -- An interrupt jumps the queue: it exists to be answered next.
    ORDER BY (i.kind = 'interrupt') DESC, i.seq
    LIMIT 1
), run AS (
    INSERT INTO runs AS r
        (id, session_id, inbox_seq, idempotency_key, status, attempts, epoch, owner, started_at)
    SELECT $4, $1, item.seq, item.idempotency_key, 'running', 1, $2, $3, clock_timestamp()
    FROM item
    ON CONFLICT (inbox_seq) DO UPDATE
    SET attempts = r.attempts + 1,
        epoch = EXCLUDED.epoch,
        owner = EXCLUDED.owner,
        resumed_at = clock_timestamp(),
        status = 'running'
    RETURNING r.id, r.status, r.attempts, r.started_at, r.finished_at
)
SELECT EXISTS (SELECT 1 FROM lease) AS held,
       item.seq, item.idempotency_key, item.kind, item.payload,
       run.id AS run_id, run.status, run.attempts, run.started_at, run.finished_at
FROM (SELECT 1) AS one
LEFT JOIN item ON true
LEFT JOIN run ON true
