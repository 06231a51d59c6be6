-- A repeated idempotency key is absorbed and answered with the existing row's seq.
-- When the existing row was committed after this statement's snapshot was taken (a
-- concurrent duplicate), neither branch returns a row and the caller reads it again.
WITH inserted AS (
    INSERT INTO session_inbox (session_id, idempotency_key, kind, payload)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (session_id, idempotency_key) DO NOTHING
    RETURNING seq
)
SELECT seq, true AS inserted
FROM inserted
UNION ALL
SELECT seq, false AS inserted
FROM session_inbox
WHERE session_id = $1 AND idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
