-- Refuses while inputs are pending: the replica that enqueued them tries to claim only after
-- its insert committed, so if this release went through, that claim finds the lease free and
-- no input is left without an owner.
UPDATE sessions
SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1
  AND lease_epoch = $2
  AND NOT EXISTS (
      SELECT 1 FROM session_inbox WHERE session_id = $1 AND consumed_at IS NULL
  )
