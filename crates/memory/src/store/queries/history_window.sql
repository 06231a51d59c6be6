SELECT delta AS h_delta, h_seq, h_key, h_role, h_content, h_run_id, h_tool_call_id, h_tool_name,
       h_data, h_created_at
FROM agentloop_history_window($1, $2, $3)
