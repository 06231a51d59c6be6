-- Inserts the record, or takes over an expired one; returns no row when a live record exists.
INSERT INTO dispatches AS d (session_key, idempotency_key, run_handle, session_id, expires_at)
VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond')
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
