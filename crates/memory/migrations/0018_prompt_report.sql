-- What each run's model received, part by part: the context builder's report (each part's
-- tokens and whether its cap cut it), as `agentloop prompt` prints it. Written with the run's
-- end, in the same transaction, only by the call that finishes the run (not by a retry, not by
-- a fenced-out owner).
ALTER TABLE runs ADD COLUMN prompt_report jsonb;

-- agentloop_finish_run, then the report of the run it finished. A statement of its own after
-- the finish, so it updates the row version the finish wrote (one statement updating a row a
-- function called by it updated already would skip it).
CREATE FUNCTION agentloop_finish_run_reported(p_session uuid, p_epoch bigint, p_run uuid, p_seq bigint, p_status text, p_error text, p_model text, p_input_tokens bigint, p_output_tokens bigint, p_provider text, p_profile text, p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[], p_release boolean, p_report jsonb)
RETURNS TABLE(held boolean, run_found boolean, finished boolean, released boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v record;
BEGIN
    SELECT * INTO v
    FROM agentloop_finish_run(p_session, p_epoch, p_run, p_seq, p_status, p_error, p_model,
                              p_input_tokens, p_output_tokens, p_provider, p_profile, p_keys,
                              p_roles, p_contents, p_run_ids, p_tool_call_ids, p_tool_names,
                              p_data, p_release);
    IF v.finished AND p_report IS NOT NULL THEN
        UPDATE runs AS r SET prompt_report = p_report WHERE r.id = p_run;
    END IF;
    held := v.held;
    run_found := v.run_found;
    finished := v.finished;
    released := v.released;
    RETURN NEXT;
END
$$;

-- agentloop_finish_many, then the reports of the runs it finished. The inner function returns
-- its rows only once all of its writes are done, so the update below sees them.
CREATE FUNCTION agentloop_finish_many_reported(p_sessions uuid[], p_epochs bigint[], p_runs uuid[], p_seqs bigint[], p_statuses text[], p_errors text[], p_models text[], p_input_tokens bigint[], p_output_tokens bigint[], p_providers text[], p_profiles text[], p_releases boolean[], p_entry_ends integer[], p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[], p_reports jsonb[])
RETURNS TABLE(idx integer, held boolean, run_found boolean, finished boolean, released boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v record;
    v_reported int[] := '{}';
BEGIN
    FOR v IN
        SELECT * FROM agentloop_finish_many(p_sessions, p_epochs, p_runs, p_seqs, p_statuses,
                                            p_errors, p_models, p_input_tokens,
                                            p_output_tokens, p_providers, p_profiles,
                                            p_releases, p_entry_ends, p_keys, p_roles,
                                            p_contents, p_run_ids, p_tool_call_ids,
                                            p_tool_names, p_data)
    LOOP
        idx := v.idx;
        held := v.held;
        run_found := v.run_found;
        finished := v.finished;
        released := v.released;
        RETURN NEXT;
        IF v.finished AND p_reports[v.idx] IS NOT NULL THEN
            v_reported := v_reported || v.idx;
        END IF;
    END LOOP;
    IF cardinality(v_reported) > 0 THEN
        UPDATE runs AS r SET prompt_report = p_reports[d.i]
        FROM unnest(v_reported) AS d (i)
        WHERE r.id = p_runs[d.i];
    END IF;
END
$$;

-- The run path's batches of both kinds (0008) take the run ends' reports as well, right after
-- the run ends' arguments.
DROP FUNCTION agentloop_run_path(uuid[], bigint[], uuid[], bigint[], text[], text[], text[],
                                 bigint[], bigint[], text[], text[], boolean[], int[], text[],
                                 text[], text[], uuid[], text[], text[], text[], uuid[], text[],
                                 text[], bytea[], text[], bigint[], bigint[], bigint[]);

CREATE FUNCTION agentloop_run_path(f_sessions uuid[], f_epochs bigint[], f_runs uuid[],
                                   f_seqs bigint[], f_statuses text[], f_errors text[],
                                   f_models text[], f_input_tokens bigint[],
                                   f_output_tokens bigint[], f_providers text[],
                                   f_profiles text[], f_releases boolean[],
                                   f_entry_ends int[], f_keys text[], f_roles text[],
                                   f_contents text[], f_run_ids uuid[], f_tool_call_ids text[],
                                   f_tool_names text[], f_data text[], f_reports jsonb[],
                                   e_sessions uuid[], e_keys text[], e_kinds text[],
                                   e_payloads bytea[], e_owners text[], e_ttl_ms bigint[],
                                   e_history_limits bigint[], e_history_after bigint[])
RETURNS TABLE (is_finish boolean, idx int, f_held boolean, f_found boolean, f_finished boolean,
               f_released boolean, session_found boolean, inserted boolean, seq bigint,
               claimed boolean, epoch bigint, owner text, taken_seq bigint, taken_key text,
               taken_kind text, taken_payload bytea, run_id uuid, run_status text,
               run_attempts int, run_started_at timestamptz, run_finished_at timestamptz,
               h_seq bigint[], h_key text[], h_role text[], h_content text[], h_run_id uuid[],
               h_tool_call_id text[], h_tool_name text[], h_data text[],
               h_created_at timestamptz[], h_delta boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1
    FROM sessions AS s
    WHERE s.id = ANY (f_sessions || e_sessions)
    ORDER BY s.id
    FOR NO KEY UPDATE OF s;

    RETURN QUERY
    SELECT true, f.idx, f.held, f.run_found, f.finished, f.released, NULL::boolean,
           NULL::boolean, NULL::bigint, NULL::boolean, NULL::bigint, NULL::text, NULL::bigint,
           NULL::text, NULL::text, NULL::bytea, NULL::uuid, NULL::text, NULL::int,
           NULL::timestamptz, NULL::timestamptz, NULL::bigint[], NULL::text[], NULL::text[],
           NULL::text[], NULL::uuid[], NULL::text[], NULL::text[], NULL::text[],
           NULL::timestamptz[], NULL::boolean
    FROM agentloop_finish_many_reported(f_sessions, f_epochs, f_runs, f_seqs, f_statuses,
                                        f_errors, f_models, f_input_tokens, f_output_tokens,
                                        f_providers, f_profiles, f_releases, f_entry_ends,
                                        f_keys, f_roles, f_contents, f_run_ids,
                                        f_tool_call_ids, f_tool_names, f_data, f_reports)
        AS f;

    RETURN QUERY
    SELECT false, e.idx, NULL::boolean, NULL::boolean, NULL::boolean, NULL::boolean,
           e.session_found, e.inserted, e.seq, e.claimed, e.epoch, e.owner, e.taken_seq,
           e.taken_key, e.taken_kind, e.taken_payload, e.run_id, e.run_status, e.run_attempts,
           e.run_started_at, e.run_finished_at, e.h_seq, e.h_key, e.h_role, e.h_content,
           e.h_run_id, e.h_tool_call_id, e.h_tool_name, e.h_data, e.h_created_at, e.h_delta
    FROM agentloop_enqueue_many(e_sessions, e_keys, e_kinds, e_payloads, e_owners, e_ttl_ms,
                                e_history_limits, e_history_after) AS e;
END
$$;
