SELECT session_found, inserted, seq, claimed, epoch, owner, taken_seq, taken_key, taken_kind,
       taken_payload, run_id, run_status, run_attempts, run_started_at, run_finished_at,
       h_delta, h_seq, h_key, h_role, h_content, h_run_id, h_tool_call_id, h_tool_name, h_data,
       h_created_at
FROM agentloop_enqueue($1, $2, $3, $4, $5, $6, $7, $8)
