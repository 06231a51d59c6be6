-- The take's columns carry agentloop_take's names, so one row type reads both.
-- Committed without waiting for the WAL flush (this transaction only): the runner acks the run
-- command only after a Flush found this row on disk, and a row lost in a crash is delivered
-- again by JetStream (README, Failure and recovery).
SELECT session_found, inserted, seq AS enqueued_seq, claimed, epoch, owner,
       coalesce(claimed, false) AS held, taken_seq AS seq, taken_key AS idempotency_key,
       taken_kind AS kind, taken_payload AS payload, run_id, run_status AS status,
       run_attempts AS attempts, run_started_at AS started_at, run_finished_at AS finished_at,
       h_delta, h_seq, h_key, h_role, h_content, h_run_id, h_tool_call_id, h_tool_name, h_data,
       h_created_at
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit,
     agentloop_enqueue($1, $2, $3, $4, $5, $6, $7, $8)
