-- Takes the lease when it is free or expired; the bumped epoch fences every later write of
-- the previous holder. When it is held, reports the holder as of this statement's snapshot.
WITH claimed AS (
    UPDATE sessions
    SET lease_owner = $2,
        lease_epoch = lease_epoch + 1,
        lease_expires_at = now() + $3::bigint * interval '1 millisecond'
    WHERE id = $1 AND (lease_owner IS NULL OR lease_expires_at < now())
    RETURNING lease_epoch, lease_owner
)
SELECT true AS claimed, lease_epoch AS epoch, lease_owner AS owner
FROM claimed
UNION ALL
SELECT false AS claimed, lease_epoch AS epoch, lease_owner AS owner
FROM sessions
WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM claimed)
