UPDATE sessions
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond'
WHERE id = $1 AND lease_epoch = $2 AND lease_owner IS NOT NULL
