-- What each run's model received, part by part: the context builder's report (each part's
-- tokens and whether its cap cut it), as `agentloop prompt` prints it. Written by the statement
-- that finishes the run, in the same transaction, so only the call that finishes a run writes
-- it (not a retry, not a fenced-out owner) and it costs no write of its own.
ALTER TABLE runs ADD COLUMN prompt_report jsonb;

-- The run-end functions of 0013 (and agentloop_finish_each of 0006), each with the reports as
-- one more argument (NULL: none) and `prompt_report` set where the run is finished; otherwise
-- unchanged. A parameter list cannot be changed in place, so each is dropped and created again.
DROP FUNCTION agentloop_finish_run(uuid, bigint, uuid, bigint, text, text, text, bigint, bigint,
                                   text, text, text[], text[], text[], uuid[], text[], text[],
                                   text[], boolean);
DROP FUNCTION agentloop_finish_each(uuid[], bigint[], uuid[], bigint[], text[], text[], text[],
                                    bigint[], bigint[], text[], text[], boolean[], int[], text[],
                                    text[], text[], uuid[], text[], text[], text[]);
DROP FUNCTION agentloop_finish_many(uuid[], bigint[], uuid[], bigint[], text[], text[], text[],
                                    bigint[], bigint[], text[], text[], boolean[], int[], text[],
                                    text[], text[], uuid[], text[], text[], text[]);

CREATE FUNCTION agentloop_finish_run(p_session uuid, p_epoch bigint, p_run uuid, p_seq bigint, p_status text, p_error text, p_model text, p_input_tokens bigint, p_output_tokens bigint, p_provider text, p_profile text, p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[], p_release boolean, p_report jsonb DEFAULT NULL) RETURNS TABLE(held boolean, run_found boolean, finished boolean, released boolean)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
BEGIN
    held := false;
    run_found := false;
    finished := false;
    released := false;
    PERFORM 1 FROM sessions
    WHERE id = p_session AND lease_epoch = p_epoch AND lease_owner IS NOT NULL
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    held := true;
    IF cardinality(p_keys) > 0 THEN
        INSERT INTO transcript_entries
            (session_id, entry_key, role, content, run_id, tool_call_id, tool_name, data)
        SELECT p_session, e.entry_key, e.role, e.content, e.run_id, e.tool_call_id,
               e.tool_name, e.data
        FROM unnest(p_keys, p_roles, p_contents, p_run_ids, p_tool_call_ids, p_tool_names,
                    p_data)
            WITH ORDINALITY AS e (entry_key, role, content, run_id, tool_call_id, tool_name,
                                  data, ord)
        ORDER BY e.ord
        ON CONFLICT (session_id, entry_key) DO NOTHING;
    END IF;
    -- The run finished and its input consumed in one statement, each only if not done yet.
    WITH done AS (
        UPDATE runs AS r
        SET status = p_status, finished_at = clock_timestamp(), error = p_error, model = p_model,
            input_tokens = p_input_tokens, output_tokens = p_output_tokens,
            provider = p_provider, profile = p_profile, prompt_report = p_report
        WHERE r.id = p_run AND r.inbox_seq = p_seq AND r.session_id = p_session
          AND r.finished_at IS NULL
        RETURNING r.id
    ), consumed AS (
        UPDATE session_inbox AS i
        SET consumed_at = clock_timestamp(), run_id = p_run
        WHERE i.seq = p_seq AND i.session_id = p_session AND i.consumed_at IS NULL
          AND EXISTS (
              SELECT 1 FROM runs AS r
              WHERE r.id = p_run AND r.inbox_seq = p_seq AND r.session_id = p_session
          )
        RETURNING i.seq
    )
    -- A data-modifying WITH runs to completion whether or not it is read.
    SELECT EXISTS (SELECT 1 FROM done) INTO finished;
    IF finished THEN
        run_found := true;
    ELSE
        -- A retry of a finished run, or a run that is not this session's run of that input.
        PERFORM 1 FROM runs AS r
        WHERE r.id = p_run AND r.inbox_seq = p_seq AND r.session_id = p_session;
        run_found := FOUND;
        IF NOT run_found THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF finished OR p_release THEN
        -- A fresh snapshot: it sees the input consumed above and any input enqueued before
        -- this transaction took the session's lock.
        UPDATE sessions AS s
        SET input_tokens = s.input_tokens + CASE WHEN finished THEN p_input_tokens ELSE 0 END,
            output_tokens = s.output_tokens + CASE WHEN finished THEN p_output_tokens ELSE 0 END,
            updated_at = CASE WHEN finished THEN now() ELSE s.updated_at END,
            lease_owner = CASE WHEN give_back THEN NULL ELSE s.lease_owner END,
            lease_expires_at = CASE WHEN give_back THEN NULL ELSE s.lease_expires_at END
        FROM (
            SELECT p_release AND i.idle AS give_back FROM agentloop_idle(p_session) AS i
        ) AS decision
        WHERE s.id = p_session
        RETURNING decision.give_back INTO released;
    END IF;
    RETURN NEXT;
END
$$;


CREATE FUNCTION agentloop_finish_each(p_sessions uuid[], p_epochs bigint[], p_runs uuid[], p_seqs bigint[], p_statuses text[], p_errors text[], p_models text[], p_input_tokens bigint[], p_output_tokens bigint[], p_providers text[], p_profiles text[], p_releases boolean[], p_entry_ends integer[], p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[], p_reports jsonb[] DEFAULT NULL) RETURNS TABLE(idx integer, held boolean, run_found boolean, finished boolean, released boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    first int := 1;
    last int;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_sessions), 0) LOOP
        last := p_entry_ends[i];
        RETURN QUERY
        SELECT i, f.*
        FROM agentloop_finish_run(p_sessions[i], p_epochs[i], p_runs[i], p_seqs[i],
                                  p_statuses[i], p_errors[i], p_models[i], p_input_tokens[i],
                                  p_output_tokens[i], p_providers[i], p_profiles[i],
                                  coalesce(p_keys[first:last], '{}'),
                                  coalesce(p_roles[first:last], '{}'),
                                  coalesce(p_contents[first:last], '{}'),
                                  coalesce(p_run_ids[first:last], '{}'),
                                  coalesce(p_tool_call_ids[first:last], '{}'),
                                  coalesce(p_tool_names[first:last], '{}'),
                                  coalesce(p_data[first:last], '{}'),
                                  p_releases[i], p_reports[i]) AS f;
        first := last + 1;
    END LOOP;
END
$$;

CREATE FUNCTION agentloop_finish_many(p_sessions uuid[], p_epochs bigint[], p_runs uuid[], p_seqs bigint[], p_statuses text[], p_errors text[], p_models text[], p_input_tokens bigint[], p_output_tokens bigint[], p_providers text[], p_profiles text[], p_releases boolean[], p_entry_ends integer[], p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[], p_reports jsonb[] DEFAULT NULL) RETURNS TABLE(idx integer, held boolean, run_found boolean, finished boolean, released boolean)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    n int := coalesce(cardinality(p_sessions), 0);
    v_held int[];
    v_finished int[];
    v_found int[];
    v_released int[];
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF (SELECT count(DISTINCT s) FROM unnest(p_sessions) AS s) < n THEN
        RETURN QUERY
        SELECT * FROM agentloop_finish_each(p_sessions, p_epochs, p_runs, p_seqs, p_statuses,
                                            p_errors, p_models, p_input_tokens,
                                            p_output_tokens, p_providers, p_profiles,
                                            p_releases, p_entry_ends, p_keys, p_roles,
                                            p_contents, p_run_ids, p_tool_call_ids,
                                            p_tool_names, p_data, p_reports);
        RETURN;
    END IF;

    -- The items whose epoch still holds its session's lease, each session locked, in session
    -- order (the sort comes before the locks).
    SELECT coalesce(array_agg(h.i), '{}') INTO v_held
    FROM (
        SELECT i.i::int AS i
        FROM sessions AS s
        JOIN unnest(p_sessions, p_epochs) WITH ORDINALITY AS i (session, epoch, i)
            ON s.id = i.session AND s.lease_epoch = i.epoch
        WHERE s.lease_owner IS NOT NULL
        ORDER BY s.id
        FOR NO KEY UPDATE OF s
    ) AS h;

    -- Item i's entries are those after the previous item's end, up to its own.
    INSERT INTO transcript_entries
        (session_id, entry_key, role, content, run_id, tool_call_id, tool_name, data)
    SELECT p_sessions[h.i], e.entry_key, e.role, e.content, e.run_id, e.tool_call_id,
           e.tool_name, e.data
    FROM unnest(p_keys, p_roles, p_contents, p_run_ids, p_tool_call_ids, p_tool_names, p_data)
        WITH ORDINALITY AS e (entry_key, role, content, run_id, tool_call_id, tool_name, data,
                              ord)
    JOIN unnest(v_held) AS h (i)
        ON e.ord > coalesce(p_entry_ends[h.i - 1], 0) AND e.ord <= p_entry_ends[h.i]
    ORDER BY e.ord
    ON CONFLICT (session_id, entry_key) DO NOTHING;

    -- Each run finished and its input consumed, each only if not done yet.
    WITH it AS (
        SELECT h.i, p_sessions[h.i] AS session, p_runs[h.i] AS run, p_seqs[h.i] AS seq
        FROM unnest(v_held) AS h (i)
    ), done AS (
        UPDATE runs AS r
        SET status = p_statuses[it.i], finished_at = clock_timestamp(), error = p_errors[it.i],
            model = p_models[it.i], input_tokens = p_input_tokens[it.i],
            output_tokens = p_output_tokens[it.i], provider = p_providers[it.i],
            profile = p_profiles[it.i], prompt_report = p_reports[it.i]
        FROM it
        WHERE r.id = it.run AND r.inbox_seq = it.seq AND r.session_id = it.session
          AND r.finished_at IS NULL
        RETURNING it.i
    ), consumed AS (
        -- Found by key: a `consumed_at IS NULL` condition here let the planner read the whole
        -- partial index of pending inputs per batch instead, so an input consumed already
        -- keeps its values through coalesce (only a retry meets one).
        UPDATE session_inbox AS q
        SET consumed_at = coalesce(q.consumed_at, clock_timestamp()),
            run_id = coalesce(q.run_id, it.run)
        FROM it
        WHERE q.seq = it.seq AND q.session_id = it.session
          AND EXISTS (
              SELECT 1 FROM runs AS r
              WHERE r.id = it.run AND r.inbox_seq = it.seq AND r.session_id = it.session
          )
        RETURNING q.seq
    )
    -- A data-modifying WITH runs to completion whether or not it is read.
    SELECT coalesce(array_agg(done.i), '{}') INTO v_finished FROM done;

    -- Not finished now: a retry of a finished run, or a run that is not this session's run of
    -- that input (found false; nothing more is done for it).
    SELECT coalesce(array_agg(h.i), '{}') INTO v_found
    FROM unnest(v_held) AS h (i)
    WHERE h.i <> ALL (v_finished)
      AND EXISTS (
          SELECT 1 FROM runs AS r
          WHERE r.id = p_runs[h.i] AND r.inbox_seq = p_seqs[h.i] AND r.session_id = p_sessions[h.i]
      );

    -- Usage counted for the runs finished now; the lease given back when asked and no input is
    -- pending (a statement of its own: a fresh snapshot, see above).
    WITH ended AS (
        UPDATE sessions AS s
        SET input_tokens = s.input_tokens + CASE WHEN d.fin THEN p_input_tokens[d.i] ELSE 0 END,
            output_tokens = s.output_tokens
                + CASE WHEN d.fin THEN p_output_tokens[d.i] ELSE 0 END,
            updated_at = CASE WHEN d.fin THEN now() ELSE s.updated_at END,
            lease_owner = CASE WHEN d.give_back THEN NULL ELSE s.lease_owner END,
            lease_expires_at = CASE WHEN d.give_back THEN NULL ELSE s.lease_expires_at END
        FROM (
            SELECT h.i, h.i = ANY (v_finished) AS fin, p_releases[h.i] AND q.idle AS give_back
            FROM unnest(v_held) AS h (i)
            CROSS JOIN LATERAL agentloop_idle(p_sessions[h.i]) AS q
            WHERE h.i = ANY (v_finished) OR (h.i = ANY (v_found) AND p_releases[h.i])
        ) AS d
        WHERE s.id = p_sessions[d.i]
        RETURNING d.i, d.give_back
    )
    SELECT coalesce(array_agg(ended.i) FILTER (WHERE ended.give_back), '{}') INTO v_released
    FROM ended;

    RETURN QUERY
    SELECT g.i, g.i = ANY (v_held), g.i = ANY (v_finished) OR g.i = ANY (v_found),
           g.i = ANY (v_finished), g.i = ANY (v_released)
    FROM generate_series(1, n) AS g (i);
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
    FROM agentloop_finish_many(f_sessions, f_epochs, f_runs, f_seqs, f_statuses, f_errors,
                               f_models, f_input_tokens, f_output_tokens, f_providers,
                               f_profiles, f_releases, f_entry_ends, f_keys, f_roles,
                               f_contents, f_run_ids, f_tool_call_ids, f_tool_names, f_data,
                               f_reports)
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
