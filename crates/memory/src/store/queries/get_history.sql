SELECT seq, entry_key, role, content, run_id, tool_call_id, tool_name, data, created_at
FROM agentloop_history($1, $2)
