SELECT seq, entry_key, role, content, run_id, tool_call_id, tool_name, data, created_at
FROM (
    SELECT seq, entry_key, role, content, run_id, tool_call_id, tool_name, data, created_at
    FROM transcript_entries
    WHERE session_id = $1
    ORDER BY seq DESC
    LIMIT $2
) AS newest
ORDER BY seq
