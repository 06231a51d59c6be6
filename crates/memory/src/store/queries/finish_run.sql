-- Fenced and atomic: the session row is locked while its epoch matches, then the input is
-- marked consumed, the run finished and the session's usage bumped, each only if not done yet,
-- so a retried FinishRun changes nothing and counts no token twice.
-- FOR NO KEY UPDATE still blocks a competing claim, but not the foreign-key checks of
-- concurrent Enqueue calls on the same session.
WITH lease AS (
    SELECT id
    FROM sessions
    WHERE id = $1 AND lease_epoch = $2 AND lease_owner IS NOT NULL
    FOR NO KEY UPDATE
), target AS (
    SELECT r.id
    FROM runs AS r
    JOIN lease ON r.session_id = lease.id
    WHERE r.id = $3 AND r.inbox_seq = $4
), consumed AS (
    UPDATE session_inbox AS i
    SET consumed_at = clock_timestamp(), run_id = target.id
    FROM target
    WHERE i.seq = $4 AND i.session_id = $1 AND i.consumed_at IS NULL
    RETURNING i.seq
), finished AS (
    UPDATE runs AS r
    SET status = $5, finished_at = clock_timestamp(), error = $6, model = $7,
        input_tokens = $8, output_tokens = $9, provider = $10, profile = $11
    FROM target
    WHERE r.id = target.id AND r.finished_at IS NULL
    RETURNING r.id
), usage AS (
    UPDATE sessions AS s
    SET input_tokens = s.input_tokens + $8,
        output_tokens = s.output_tokens + $9,
        updated_at = now()
    FROM finished
    WHERE s.id = $1
    RETURNING s.id
)
SELECT EXISTS (SELECT 1 FROM lease) AS held,
       EXISTS (SELECT 1 FROM target) AS found,
       EXISTS (SELECT 1 FROM finished) AS finished
