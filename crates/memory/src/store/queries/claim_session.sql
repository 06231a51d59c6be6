-- Takes the lease when it is free or expired; the bumped epoch fences every later write of
-- the previous holder. When it is held, reports the holder.
--
-- The row is locked first and the decision made on what the lock returns: a plain
-- `UPDATE ... WHERE lease_owner IS NULL` would judge the row by this statement's snapshot and
-- skip it without waiting while a holder's release is in flight, so an input enqueued just
-- then would be left without an owner until the sweeper came by.
WITH locked AS (
    SELECT id, lease_owner, lease_expires_at, lease_epoch
    FROM sessions
    WHERE id = $1
    FOR NO KEY UPDATE
), claimed AS (
    UPDATE sessions AS s
    SET lease_owner = $2,
        lease_epoch = s.lease_epoch + 1,
        lease_expires_at = now() + $3::bigint * interval '1 millisecond'
    FROM locked
    WHERE s.id = locked.id
      AND (locked.lease_owner IS NULL OR locked.lease_expires_at < now())
    RETURNING s.lease_epoch, s.lease_owner
)
SELECT true AS claimed, lease_epoch AS epoch, lease_owner AS owner
FROM claimed
UNION ALL
SELECT false AS claimed, lease_epoch AS epoch, lease_owner AS owner
FROM locked
WHERE NOT EXISTS (SELECT 1 FROM claimed)
