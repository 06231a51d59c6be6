-- Stores the first answer only and returns the record as get_dispatch.sql does, in the same
-- round trip. No row when nothing was stored (the record was completed before, or is not live):
-- the caller then reads the record as it stands.
-- Committed without waiting for the WAL flush (for this transaction only): the answer is a
-- copy of what the run already made durable, and a repeat that finds no stored answer after a
-- Postgres crash answers from the run itself.
WITH done AS (
    UPDATE dispatches AS d
    SET status = $2, text = $3, error = $4, completed_at = now()
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
    WHERE d.run_handle = $1 AND d.status = 'accepted'
    RETURNING d.session_key, d.idempotency_key, d.run_handle, d.session_id, d.status, d.text,
              d.error, d.created_at, d.expires_at
)
SELECT d.session_key, d.idempotency_key, d.run_handle, d.session_id, d.status, d.text, d.error,
       d.created_at, d.expires_at,
       r.id AS run_id, r.status AS run_status, r.error AS run_error,
       agentloop_run_answer(r.session_id, r.id) AS run_answer
FROM done AS d
LEFT JOIN runs AS r ON r.id = agentloop_run_id(d.session_id, d.idempotency_key)
WHERE d.expires_at >= now()
