SELECT seq, false AS inserted
FROM session_inbox
WHERE session_id = $1 AND idempotency_key = $2
