-- Run ends and enqueues that wait for Postgres at the same time go in one statement and one
-- transaction: one round trip and one commit where there were two. Run ends go first, so an
-- input enqueued in the same batch can claim a lease a run end gave back.
--
-- Each half locks its sessions in session order, but one half after the other could meet
-- another transaction's locks crosswise (a deadlock), so every session of both halves is locked
-- first, in one pass in session order; the halves then find their locks already held.
--
-- One row per item of either half: `is_finish` says which, `idx` is the item's position in its
-- half, and the other half's columns are null.

CREATE FUNCTION agentloop_run_path(f_sessions uuid[], f_epochs bigint[], f_runs uuid[],
                                   f_seqs bigint[], f_statuses text[], f_errors text[],
                                   f_models text[], f_input_tokens bigint[],
                                   f_output_tokens bigint[], f_providers text[],
                                   f_profiles text[], f_releases boolean[],
                                   f_entry_ends int[], f_keys text[], f_roles text[],
                                   f_contents text[], f_run_ids uuid[], f_tool_call_ids text[],
                                   f_tool_names text[], f_data text[],
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
-- Its one statement of its own finds sessions by key whatever the table holds (see 0006); the
-- halves carry their own settings.
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
    FROM agentloop_finish_many(f_sessions, f_epochs, f_runs, f_seqs, f_statuses, f_errors,
                               f_models, f_input_tokens, f_output_tokens, f_providers,
                               f_profiles, f_releases, f_entry_ends, f_keys, f_roles,
                               f_contents, f_run_ids, f_tool_call_ids, f_tool_names, f_data)
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
