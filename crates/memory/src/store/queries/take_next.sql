SELECT held, seq, idempotency_key, kind, payload, run_id, status, attempts, started_at, finished_at
FROM agentloop_take($1, $2, $3)
