-- Each read rule of the run path written once, as a plain SQL function that Postgres inlines
-- into the statement calling it (no call at run time): whether a lease is live, which input a
-- session's next run takes, whether a session is idle (nothing pending) and the history window
-- a taken run reads. The functions that spelled them out (the one-item path, the set-based
-- batch path, claim, take, release and the inbox cap) now use them; what they do is unchanged.
-- crates/memory/schema.sql shows every function as it now stands.

-- A lease is live while it has an owner and has not expired; a claim takes only one that is not.
CREATE FUNCTION agentloop_lease_live(p_owner text, p_expires_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p_owner IS NOT NULL AND p_expires_at >= now(), false)
$$;

-- The input a session's next run takes: its oldest pending input, an interrupt before any
-- other. No row when nothing is pending.
CREATE FUNCTION agentloop_next_input(p_session uuid)
RETURNS TABLE (seq bigint, idempotency_key text)
LANGUAGE sql STABLE AS $$
    SELECT q.seq, q.idempotency_key
    FROM session_inbox AS q
    WHERE q.session_id = p_session AND q.consumed_at IS NULL
    ORDER BY (q.kind = 'interrupt') DESC, q.seq
    LIMIT 1
$$;

-- Whether a session has no pending input: a holder gives its lease back only then, and the
-- inbox cap counts nothing then.
CREATE FUNCTION agentloop_idle(p_session uuid) RETURNS TABLE (idle boolean)
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM session_inbox AS i
        WHERE i.session_id = p_session AND i.consumed_at IS NULL
    )
$$;

-- The newest p_limit entries of a session in order, as arrays (NULL when there are none); with
-- the caller's last entry p_after still there, only the entries after it (delta). A reset
-- deletes the transcript, and the caller then gets the window afresh.
CREATE FUNCTION agentloop_history(p_session uuid, p_limit bigint, p_after bigint)
RETURNS TABLE (delta boolean, h_seq bigint[], h_key text[], h_role text[], h_content text[],
               h_run_id uuid[], h_tool_call_id text[], h_tool_name text[], h_data text[],
               h_created_at timestamptz[])
LANGUAGE sql STABLE AS $$
    SELECT x.delta,
           array_agg(e.seq ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.entry_key ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.role ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.content ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.run_id ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.tool_call_id ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.tool_name ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.data ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL),
           array_agg(e.created_at ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL)
    FROM (
        SELECT p_after > 0 AND EXISTS (
            SELECT 1 FROM transcript_entries AS t
            WHERE t.session_id = p_session AND t.seq = p_after
        ) AS delta
    ) AS x
    LEFT JOIN LATERAL (
        SELECT t.seq, t.entry_key, t.role, t.content, t.run_id, t.tool_call_id, t.tool_name,
               t.data, t.created_at
        FROM transcript_entries AS t
        -- A plain range on (session_id, seq): the scan stops at the first entry not wanted.
        WHERE t.session_id = p_session AND t.seq > CASE WHEN x.delta THEN p_after ELSE 0 END
        ORDER BY t.seq DESC
        LIMIT p_limit
    ) AS e ON true
    GROUP BY x.delta
$$;

CREATE OR REPLACE FUNCTION agentloop_history_window(p_session uuid, p_limit bigint, p_after bigint, OUT delta boolean, OUT h_seq bigint[], OUT h_key text[], OUT h_role text[], OUT h_content text[], OUT h_run_id uuid[], OUT h_tool_call_id text[], OUT h_tool_name text[], OUT h_data text[], OUT h_created_at timestamp with time zone[]) RETURNS record
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    SELECT w.delta, w.h_seq, w.h_key, w.h_role, w.h_content, w.h_run_id, w.h_tool_call_id,
           w.h_tool_name, w.h_data, w.h_created_at
    INTO delta, h_seq, h_key, h_role, h_content, h_run_id, h_tool_call_id, h_tool_name, h_data,
         h_created_at
    FROM agentloop_history(p_session, p_limit, p_after) AS w;
END
$$;

CREATE OR REPLACE FUNCTION agentloop_claim(p_session uuid, p_owner text, p_ttl_ms bigint) RETURNS TABLE(claimed boolean, epoch bigint, owner text)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    SELECT lease_owner, lease_epoch, lease_expires_at INTO s
    FROM sessions WHERE id = p_session
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF agentloop_lease_live(s.lease_owner, s.lease_expires_at) THEN
        claimed := false;
        epoch := s.lease_epoch;
        owner := s.lease_owner;
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE sessions
    SET lease_owner = p_owner,
        lease_epoch = agentloop_next_epoch(lease_epoch),
        lease_expires_at = now() + p_ttl_ms * interval '1 millisecond'
    WHERE id = p_session
    RETURNING true, lease_epoch, lease_owner INTO claimed, epoch, owner;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION agentloop_take(p_session uuid, p_epoch bigint, p_owner text) RETURNS TABLE(held boolean, seq bigint, idempotency_key text, kind text, payload bytea, run_id uuid, status text, attempts integer, started_at timestamp with time zone, finished_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM sessions
    WHERE id = p_session AND lease_epoch = p_epoch AND lease_owner IS NOT NULL
    FOR SHARE;
    held := FOUND;
    IF NOT held THEN
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO runs AS r
        (id, session_id, inbox_seq, idempotency_key, status, attempts, epoch, owner, started_at)
    SELECT agentloop_run_id(p_session, i.idempotency_key), p_session, i.seq, i.idempotency_key,
           'running', 1, p_epoch, p_owner, clock_timestamp()
    FROM agentloop_next_input(p_session) AS i
    ON CONFLICT (inbox_seq) DO UPDATE
    SET attempts = r.attempts + 1,
        epoch = EXCLUDED.epoch,
        owner = EXCLUDED.owner,
        resumed_at = clock_timestamp(),
        status = 'running'
    RETURNING r.inbox_seq, r.idempotency_key, r.id, r.status, r.attempts, r.started_at,
              r.finished_at
    INTO seq, idempotency_key, run_id, status, attempts, started_at, finished_at;
    IF FOUND THEN
        SELECT i.kind, i.payload INTO kind, payload
        FROM session_inbox AS i
        WHERE i.seq = agentloop_take.seq;
    END IF;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION agentloop_release(p_session uuid, p_epoch bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE sessions
    SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = p_session
      AND lease_epoch = p_epoch
      AND (SELECT i.idle FROM agentloop_idle(p_session) AS i);
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION agentloop_inbox_cap() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    cap bigint;
BEGIN
    -- The common case, a session with nothing pending (a conversation in turn), passes after
    -- one probe of the partial index session_inbox_pending, without reading the setting or
    -- counting: reading and counting for every input cost about 5 % of the stack's CPU per run
    -- (bench/HISTORY.md, eleventh session).
    IF NEW.consumed_at IS NOT NULL OR (SELECT i.idle FROM agentloop_idle(NEW.session_id) AS i)
    THEN
        RETURN NEW;
    END IF;
    SELECT s.value INTO cap FROM agentloop_settings AS s WHERE s.name = 'inbox_max_pending';
    IF cap IS NULL OR cap <= 0 THEN
        RETURN NEW;
    END IF;
    -- Counted on the partial index, and never past the cap.
    IF (SELECT count(*) FROM (
            SELECT 1 FROM session_inbox AS i
            WHERE i.session_id = NEW.session_id AND i.consumed_at IS NULL
            LIMIT cap
        ) AS pending) >= cap THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION agentloop_enqueue(p_session uuid, p_key text, p_kind text, p_payload bytea, p_owner text, p_ttl_ms bigint, p_history_limit bigint, p_history_after bigint) RETURNS TABLE(session_found boolean, inserted boolean, seq bigint, claimed boolean, epoch bigint, owner text, taken_seq bigint, taken_key text, taken_kind text, taken_payload bytea, run_id uuid, run_status text, run_attempts integer, run_started_at timestamp with time zone, run_finished_at timestamp with time zone, h_seq bigint[], h_key text[], h_role text[], h_content text[], h_run_id uuid[], h_tool_call_id text[], h_tool_name text[], h_data text[], h_created_at timestamp with time zone[], h_delta boolean)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    c record;
BEGIN
    -- Locked before the insert: a holder releasing now either released before this lock (and
    -- the claim below finds the lease free) or runs its release after this commit, and its
    -- release then sees this input and keeps the lease.
    SELECT lease_epoch, lease_owner, lease_expires_at INTO c
    FROM sessions WHERE id = p_session
    FOR NO KEY UPDATE;
    session_found := FOUND;
    IF NOT session_found THEN
        RETURN NEXT;
        RETURN;
    END IF;
    epoch := c.lease_epoch;
    owner := c.lease_owner;
    claimed := false;
    INSERT INTO session_inbox (session_id, idempotency_key, kind, payload)
    VALUES (p_session, p_key, p_kind, p_payload)
    ON CONFLICT (session_id, idempotency_key) DO NOTHING
    RETURNING session_inbox.seq INTO seq;
    inserted := FOUND;
    IF NOT inserted THEN
        -- A fresh snapshot: it sees a concurrent duplicate the insert waited for.
        SELECT i.seq INTO seq
        FROM session_inbox AS i
        WHERE i.session_id = p_session AND i.idempotency_key = p_key;
    END IF;
    IF p_owner IS NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- The claim and take below are agentloop_claim and agentloop_take written out, and
    -- agentloop_finish_run writes out agentloop_append and agentloop_release: calling them
    -- measured 0.72 instead of 0.65 Postgres CPU-ms per run (each call is an executor start,
    -- a fence check and a statement more). Change them together.
    IF agentloop_lease_live(c.lease_owner, c.lease_expires_at) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE sessions AS s
    SET lease_owner = p_owner,
        lease_epoch = agentloop_next_epoch(s.lease_epoch),
        lease_expires_at = now() + p_ttl_ms * interval '1 millisecond'
    WHERE s.id = p_session
    RETURNING s.lease_epoch, s.lease_owner INTO epoch, owner;
    claimed := true;
    IF p_history_limit IS NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- The session's next input and its run, in one statement.
    INSERT INTO runs AS r
        (id, session_id, inbox_seq, idempotency_key, status, attempts, epoch, owner, started_at)
    SELECT agentloop_run_id(p_session, i.idempotency_key), p_session, i.seq, i.idempotency_key,
           'running', 1, agentloop_enqueue.epoch, p_owner, clock_timestamp()
    FROM agentloop_next_input(p_session) AS i
    ON CONFLICT (inbox_seq) DO UPDATE
    SET attempts = r.attempts + 1,
        epoch = EXCLUDED.epoch,
        owner = EXCLUDED.owner,
        resumed_at = clock_timestamp(),
        status = 'running'
    RETURNING r.inbox_seq, r.idempotency_key, r.id, r.status, r.attempts, r.started_at,
              r.finished_at
    INTO taken_seq, taken_key, run_id, run_status, run_attempts, run_started_at,
         run_finished_at;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF inserted AND taken_seq = seq THEN
        -- Usually the input just stored: no need to read it back.
        taken_kind := p_kind;
        taken_payload := p_payload;
    ELSE
        SELECT i.kind, i.payload INTO taken_kind, taken_payload
        FROM session_inbox AS i
        WHERE i.seq = taken_seq;
    END IF;
    IF p_history_limit > 0 THEN
        SELECT w.delta, w.h_seq, w.h_key, w.h_role, w.h_content, w.h_run_id, w.h_tool_call_id,
               w.h_tool_name, w.h_data, w.h_created_at
        INTO h_delta, h_seq, h_key, h_role, h_content, h_run_id, h_tool_call_id, h_tool_name,
             h_data, h_created_at
        FROM agentloop_history(p_session, p_history_limit, p_history_after) AS w;
    END IF;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION agentloop_enqueue_many(p_sessions uuid[], p_keys text[], p_kinds text[], p_payloads bytea[], p_owners text[], p_ttl_ms bigint[], p_history_limits bigint[], p_history_after bigint[]) RETURNS TABLE(idx integer, session_found boolean, inserted boolean, seq bigint, claimed boolean, epoch bigint, owner text, taken_seq bigint, taken_key text, taken_kind text, taken_payload bytea, run_id uuid, run_status text, run_attempts integer, run_started_at timestamp with time zone, run_finished_at timestamp with time zone, h_seq bigint[], h_key text[], h_role text[], h_content text[], h_run_id uuid[], h_tool_call_id text[], h_tool_name text[], h_data text[], h_created_at timestamp with time zone[], h_delta boolean)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    n int := coalesce(cardinality(p_sessions), 0);
    r record;
    k int;
    v_found boolean[];
    v_inserted boolean[];
    v_seq bigint[];
    v_claimed boolean[];
    v_epoch bigint[];
    v_owner text[];
    v_free boolean[];
    v_taken_seq bigint[];
    v_taken_key text[];
    v_taken_kind text[];
    v_taken_payload bytea[];
    v_run_id uuid[];
    v_run_status text[];
    v_run_attempts int[];
    v_run_started timestamptz[];
    v_run_finished timestamptz[];
    v_history int[] := '{}';
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF (SELECT count(DISTINCT s) FROM unnest(p_sessions) AS s) < n THEN
        RETURN QUERY
        SELECT * FROM agentloop_enqueue_each(p_sessions, p_keys, p_kinds, p_payloads, p_owners,
                                             p_ttl_ms, p_history_limits, p_history_after);
        RETURN;
    END IF;
    v_found := array_fill(false, ARRAY[n]);
    v_inserted := array_fill(NULL::boolean, ARRAY[n]);
    v_claimed := array_fill(NULL::boolean, ARRAY[n]);

    -- Every session locked (in session order: the sort comes before the locks) and its lease
    -- judged while locked, as agentloop_enqueue does before its insert.
    FOR r IN
        SELECT i.i::int AS i, s.lease_epoch, s.lease_owner,
               NOT agentloop_lease_live(s.lease_owner, s.lease_expires_at) AS free
        FROM sessions AS s
        JOIN unnest(p_sessions) WITH ORDINALITY AS i (session, i) ON s.id = i.session
        ORDER BY s.id
        FOR NO KEY UPDATE OF s
    LOOP
        v_found[r.i] := true;
        v_epoch[r.i] := r.lease_epoch;
        v_owner[r.i] := r.lease_owner;
        v_free[r.i] := r.free;
        v_claimed[r.i] := false;
        v_inserted[r.i] := false;
    END LOOP;

    -- The inputs, in item order; a key already stored is absorbed.
    FOR r IN
        INSERT INTO session_inbox AS q (session_id, idempotency_key, kind, payload)
        SELECT p_sessions[f.i], p_keys[f.i], p_kinds[f.i], p_payloads[f.i]
        FROM generate_series(1, n) AS f (i)
        WHERE v_found[f.i]
        ORDER BY f.i
        ON CONFLICT (session_id, idempotency_key) DO NOTHING
        RETURNING q.session_id, q.seq
    LOOP
        k := array_position(p_sessions, r.session_id);
        v_inserted[k] := true;
        v_seq[k] := r.seq;
    END LOOP;
    -- A fresh snapshot: it sees a concurrent duplicate the insert waited for.
    FOR r IN
        SELECT f.i, q.seq
        FROM generate_series(1, n) AS f (i)
        JOIN session_inbox AS q
            ON q.session_id = p_sessions[f.i] AND q.idempotency_key = p_keys[f.i]
        WHERE v_found[f.i] AND NOT v_inserted[f.i]
    LOOP
        v_seq[r.i] := r.seq;
    END LOOP;

    -- Claims where an owner asks and the lease is free or expired.
    FOR r IN
        UPDATE sessions AS s
        SET lease_owner = p_owners[c.i],
            lease_epoch = agentloop_next_epoch(s.lease_epoch),
            lease_expires_at = now() + p_ttl_ms[c.i] * interval '1 millisecond'
        FROM generate_series(1, n) AS c (i)
        WHERE s.id = p_sessions[c.i] AND v_found[c.i] AND v_free[c.i]
          AND p_owners[c.i] IS NOT NULL
        RETURNING c.i, s.lease_epoch, s.lease_owner
    LOOP
        v_claimed[r.i] := true;
        v_epoch[r.i] := r.lease_epoch;
        v_owner[r.i] := r.lease_owner;
    END LOOP;

    -- For claims asked to take: the session's next input and its run, started or resumed.
    FOR r IN
        INSERT INTO runs AS u
            (id, session_id, inbox_seq, idempotency_key, status, attempts, epoch, owner,
             started_at)
        SELECT agentloop_run_id(p_sessions[t.i], q.idempotency_key), p_sessions[t.i], q.seq,
               q.idempotency_key, 'running', 1, v_epoch[t.i], p_owners[t.i], clock_timestamp()
        FROM generate_series(1, n) AS t (i)
        CROSS JOIN LATERAL agentloop_next_input(p_sessions[t.i]) AS q
        WHERE v_claimed[t.i] AND p_history_limits[t.i] IS NOT NULL
        ORDER BY t.i
        ON CONFLICT (inbox_seq) DO UPDATE
        SET attempts = u.attempts + 1,
            epoch = EXCLUDED.epoch,
            owner = EXCLUDED.owner,
            resumed_at = clock_timestamp(),
            status = 'running'
        RETURNING u.session_id, u.inbox_seq, u.idempotency_key, u.id, u.status, u.attempts,
                  u.started_at, u.finished_at
    LOOP
        k := array_position(p_sessions, r.session_id);
        v_taken_seq[k] := r.inbox_seq;
        v_taken_key[k] := r.idempotency_key;
        v_run_id[k] := r.id;
        v_run_status[k] := r.status;
        v_run_attempts[k] := r.attempts;
        v_run_started[k] := r.started_at;
        v_run_finished[k] := r.finished_at;
        IF v_inserted[k] AND r.inbox_seq = v_seq[k] THEN
            -- Usually the input just stored: no need to read it back.
            v_taken_kind[k] := p_kinds[k];
            v_taken_payload[k] := p_payloads[k];
        END IF;
        IF p_history_limits[k] > 0 THEN
            v_history := v_history || k;
        END IF;
    END LOOP;
    FOR r IN
        SELECT t.i, q.kind, q.payload
        FROM generate_series(1, n) AS t (i)
        JOIN session_inbox AS q ON q.seq = v_taken_seq[t.i]
        WHERE v_taken_seq[t.i] IS NOT NULL AND v_taken_kind[t.i] IS NULL
    LOOP
        v_taken_kind[r.i] := r.kind;
        v_taken_payload[r.i] := r.payload;
    END LOOP;

    -- One row per item; the history window of each run taken with a limit, read last.
    RETURN QUERY
    SELECT g.i, v_found[g.i], v_inserted[g.i], v_seq[g.i], v_claimed[g.i], v_epoch[g.i],
           v_owner[g.i], v_taken_seq[g.i], v_taken_key[g.i], v_taken_kind[g.i],
           v_taken_payload[g.i], v_run_id[g.i], v_run_status[g.i], v_run_attempts[g.i],
           v_run_started[g.i], v_run_finished[g.i], w.h_seq, w.h_key, w.h_role, w.h_content,
           w.h_run_id, w.h_tool_call_id, w.h_tool_name, w.h_data, w.h_created_at, w.delta
    FROM generate_series(1, n) AS g (i)
    -- Items without a window pass a limit of 0 and no last entry: the join's condition is
    -- checked after the inlined window is read, and reads nothing for them then.
    LEFT JOIN LATERAL agentloop_history(
        p_sessions[g.i],
        CASE WHEN g.i = ANY (v_history) THEN p_history_limits[g.i] ELSE 0 END,
        CASE WHEN g.i = ANY (v_history) THEN p_history_after[g.i] ELSE 0 END
    ) AS w ON g.i = ANY (v_history);
END
$$;

CREATE OR REPLACE FUNCTION agentloop_finish_run(p_session uuid, p_epoch bigint, p_run uuid, p_seq bigint, p_status text, p_error text, p_model text, p_input_tokens bigint, p_output_tokens bigint, p_provider text, p_profile text, p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[], p_release boolean) RETURNS TABLE(held boolean, run_found boolean, finished boolean, released boolean)
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
            provider = p_provider, profile = p_profile
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

CREATE OR REPLACE FUNCTION agentloop_finish_many(p_sessions uuid[], p_epochs bigint[], p_runs uuid[], p_seqs bigint[], p_statuses text[], p_errors text[], p_models text[], p_input_tokens bigint[], p_output_tokens bigint[], p_providers text[], p_profiles text[], p_releases boolean[], p_entry_ends integer[], p_keys text[], p_roles text[], p_contents text[], p_run_ids uuid[], p_tool_call_ids text[], p_tool_names text[], p_data text[]) RETURNS TABLE(idx integer, held boolean, run_found boolean, finished boolean, released boolean)
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
