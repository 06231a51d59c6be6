-- Enqueue and claim in one statement (one commit on the hot path). Safe without a commit in
-- between: the claim locks the session row, so a holder releasing right now either runs its
-- release before this statement's lock (and its lease is free here) or waits for this
-- statement to commit (and its release then sees this input and keeps the lease).
WITH inserted AS (
    INSERT INTO session_inbox (session_id, idempotency_key, kind, payload)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (session_id, idempotency_key) DO NOTHING
    RETURNING seq
), existing AS (
    SELECT seq
    FROM session_inbox
    WHERE session_id = $1 AND idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
), locked AS (
    SELECT id, lease_owner, lease_expires_at, lease_epoch
    FROM sessions
    WHERE id = $1
    FOR NO KEY UPDATE
), claimed AS (
    UPDATE sessions AS s
    SET lease_owner = $5,
        lease_epoch = s.lease_epoch + 1,
        lease_expires_at = now() + $6::bigint * interval '1 millisecond'
    FROM locked
    WHERE s.id = locked.id
      AND (locked.lease_owner IS NULL OR locked.lease_expires_at < now())
    RETURNING s.lease_epoch, s.lease_owner
)
SELECT (SELECT seq FROM inserted) AS new_seq,
       (SELECT seq FROM existing) AS old_seq,
       EXISTS (SELECT 1 FROM claimed) AS claimed,
       coalesce((SELECT lease_epoch FROM claimed), (SELECT lease_epoch FROM locked)) AS epoch,
       coalesce((SELECT lease_owner FROM claimed), (SELECT lease_owner FROM locked)) AS owner
