-- agentloop_run_path's rows, each named as finish_many.sql or enqueue_many.sql names it.
SELECT is_finish, idx,
       CASE WHEN is_finish THEN f_held ELSE coalesce(claimed, false) END AS held,
       f_found AS found, f_finished AS finished, f_released AS released,
       session_found, inserted, seq AS enqueued_seq, claimed, epoch, owner,
       taken_seq AS seq, taken_key AS idempotency_key, taken_kind AS kind,
       taken_payload AS payload, run_id, run_status AS status, run_attempts AS attempts,
       run_started_at AS started_at, run_finished_at AS finished_at, h_delta, h_seq, h_key,
       h_role, h_content, h_run_id, h_tool_call_id, h_tool_name, h_data, h_created_at
FROM agentloop_run_path($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                        $17, $18, $19, $20, $21::jsonb[], $22, $23, $24, $25, $26, $27, $28,
                        $29)
