-- Stores the first answer only: a later completion of the same record changes nothing.
UPDATE dispatches
SET status = $2, text = $3, error = $4, completed_at = now()
WHERE run_handle = $1 AND status = 'accepted'
