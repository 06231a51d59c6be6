-- Inserts the record, or takes over an expired one; returns no row when a live record exists.
-- Committed without waiting for the WAL flush (for this transaction only): the message the
-- record stands for is made durable by its stream, and a record lost with a Postgres crash
-- costs a repeat of the key only its stored copy of the answer (the repeat's own record then
-- answers from the run, and the stream and the inbox drop the repeated message). A flush per
-- request would put the disk's sync time on every gateway request.
INSERT INTO dispatches AS d (session_key, idempotency_key, run_handle, session_id, expires_at)
SELECT $1, $2, $3, $4, now() + $5 * interval '1 millisecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (session_key, idempotency_key) DO UPDATE
SET run_handle = EXCLUDED.run_handle,
    session_id = EXCLUDED.session_id,
    status = 'accepted',
    text = NULL,
    error = NULL,
    created_at = now(),
    completed_at = NULL,
    expires_at = EXCLUDED.expires_at
WHERE d.expires_at < now()
RETURNING d.created_at, d.expires_at
