-- Finds the record by run handle, by the id of its run, or (when $1 is NULL) by its keys, and
-- joins the run that processes it and the run's last assistant entry. $4/$5: the caller's
-- principal and whether it is an admin; a record of a session it does not see is not returned.
WITH target AS (
    (SELECT session_key, idempotency_key FROM dispatches WHERE run_handle = $1)
    UNION ALL
    (SELECT d.session_key, d.idempotency_key
     FROM runs AS r
     JOIN dispatches AS d
       ON d.session_id = r.session_id AND d.idempotency_key = r.idempotency_key
     WHERE r.id = $1)
    UNION ALL
    (SELECT $2::text, $3::text WHERE $1::uuid IS NULL)
    LIMIT 1
)
SELECT d.session_key, d.idempotency_key, d.run_handle, d.session_id, d.status, d.text, d.error,
       d.created_at, d.expires_at,
       r.id AS run_id, r.status AS run_status, r.error AS run_error,
       agentloop_run_answer(r.session_id, r.id) AS run_answer
FROM target
JOIN dispatches AS d USING (session_key, idempotency_key)
JOIN sessions AS s ON s.id = d.session_id
LEFT JOIN runs AS r ON r.id = agentloop_run_id(d.session_id, d.idempotency_key)
WHERE d.expires_at >= now()
  AND (s.owner IS NOT DISTINCT FROM $4::text OR $5::bool)
