-- Run ends of a batch as five statements for the whole batch instead of five per run. Postgres
-- pays an executor start, relation locks and a plan-cache check for every statement it runs;
-- at 100 sessions the per-run loop of agentloop_finish_many spent 0.37 ms in Postgres per run.
--
-- Same signature, same answers, item by item, as the loop it replaces (kept below as
-- agentloop_finish_each): fenced by each session's epoch, locked in session order, entries
-- inserted in array order, the run finished and its input consumed only once, usage counted
-- once, the lease given back only when asked and nothing else is pending. The pending check is
-- a statement of its own, so its snapshot is taken after every lock is held and sees any input
-- committed before. A batch carrying one session twice runs through the loop: there an item
-- must see what the one before it wrote.

ALTER FUNCTION agentloop_finish_many(uuid[], bigint[], uuid[], bigint[], text[], text[], text[],
                                     bigint[], bigint[], text[], text[], boolean[], int[],
                                     text[], text[], text[], uuid[], text[], text[], text[])
    RENAME TO agentloop_finish_each;

CREATE FUNCTION agentloop_finish_many(p_sessions uuid[], p_epochs bigint[], p_runs uuid[],
                                      p_seqs bigint[], p_statuses text[], p_errors text[],
                                      p_models text[], p_input_tokens bigint[],
                                      p_output_tokens bigint[], p_providers text[],
                                      p_profiles text[], p_releases boolean[],
                                      p_entry_ends int[], p_keys text[], p_roles text[],
                                      p_contents text[], p_run_ids uuid[],
                                      p_tool_call_ids text[], p_tool_names text[],
                                      p_data text[])
RETURNS TABLE (idx int, held boolean, run_found boolean, finished boolean, released boolean)
LANGUAGE plpgsql
-- Planned once per connection (a custom plan per batch was a tenth of Postgres' time), so the
-- plans must not depend on the statistics of the moment: a plan made while the tables were
-- small kept scanning whole tables and indexes once they had grown (auto_explain: a full scan
-- of sessions per batch after 10 000 sessions). Every statement here finds its rows by key,
-- item by item, whatever the tables hold.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
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
                                            p_tool_names, p_data);
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
            profile = p_profiles[it.i]
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
            SELECT h.i, h.i = ANY (v_finished) AS fin,
                   p_releases[h.i] AND NOT EXISTS (
                       SELECT 1 FROM session_inbox AS q
                       WHERE q.session_id = p_sessions[h.i] AND q.consumed_at IS NULL
                   ) AS give_back
            FROM unnest(v_held) AS h (i)
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

-- The flush's join to the inbox, planned while the inbox was small, scanned all of it on every
-- flush (twenty a second under load) until the table grew past a few tens of thousands of rows.
ALTER FUNCTION agentloop_flush(bigint[], text[]) SET enable_seqscan = off;
ALTER FUNCTION agentloop_flush(bigint[], text[]) SET enable_hashjoin = off;
ALTER FUNCTION agentloop_flush(bigint[], text[]) SET enable_mergejoin = off;
