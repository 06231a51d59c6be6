-- Every listed lease its epoch still holds, extended; the ids renewed. A lease already run out
-- is not revived: its session may be claimed elsewhere any moment, and an owner that handed it
-- back (expiry now + 1 ms) must not get it back from a renewal that was already on its way.
-- The caller lists the sessions in id order, the order the run path's batches lock them in;
-- should a deadlock end the statement anyway, only this renewal fails, and the next one comes a
-- third of a lease on.
UPDATE sessions AS s
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond'
FROM unnest($1::uuid[], $2::bigint[]) AS l (id, epoch)
WHERE s.id = l.id AND s.lease_epoch = l.epoch AND s.lease_owner IS NOT NULL
  AND s.lease_expires_at > now()
RETURNING s.id
