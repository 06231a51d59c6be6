-- A run's answer as a dispatch record reports it: the text of its last assistant entry, or NULL
-- before the run has written one. Both statements that return a record (get_dispatch.sql and
-- complete_dispatch.sql) read it from here.
CREATE FUNCTION agentloop_run_answer(p_session uuid, p_run uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT t.content
    FROM transcript_entries AS t
    WHERE t.session_id = p_session AND t.run_id = p_run AND t.role = 'assistant'
    ORDER BY t.seq DESC
    LIMIT 1
$$;
