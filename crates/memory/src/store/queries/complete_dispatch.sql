-- Stores the first answer only: a later completion of the same record changes nothing.
-- Committed without waiting for the WAL flush (for this transaction only): the answer is a
-- copy of what the run already made durable, and a repeat that finds no stored answer after a
-- Postgres crash answers from the run itself.
UPDATE dispatches
SET status = $2, text = $3, error = $4, completed_at = now()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE run_handle = $1 AND status = 'accepted'
