-- Enqueues of a batch as a few set-based statements instead of eight per input (see 0006 for
-- run ends). Same signature, same answers, item by item, as the loop it replaces (kept as
-- agentloop_enqueue_each, and used for a batch carrying one session twice): each session locked
-- in session order before anything is judged, the input stored once per idempotency key (in
-- item order, so seqs follow it), the lease claimed when free or expired, the oldest pending
-- input (an interrupt first) taken and its run started or resumed, and the history window
-- read last (as agentloop_history_window does). Per-item state lives in arrays indexed by
-- item.

ALTER FUNCTION agentloop_enqueue_many(uuid[], text[], text[], bytea[], text[], bigint[], bigint[],
                                      bigint[])
    RENAME TO agentloop_enqueue_each;

CREATE FUNCTION agentloop_enqueue_many(p_sessions uuid[], p_keys text[], p_kinds text[],
                                       p_payloads bytea[], p_owners text[], p_ttl_ms bigint[],
                                       p_history_limits bigint[], p_history_after bigint[])
RETURNS TABLE (idx int, session_found boolean, inserted boolean, seq bigint, claimed boolean,
               epoch bigint, owner text, taken_seq bigint, taken_key text, taken_kind text,
               taken_payload bytea, run_id uuid, run_status text, run_attempts int,
               run_started_at timestamptz, run_finished_at timestamptz,
               h_seq bigint[], h_key text[], h_role text[], h_content text[], h_run_id uuid[],
               h_tool_call_id text[], h_tool_name text[], h_data text[],
               h_created_at timestamptz[], h_delta boolean)
LANGUAGE plpgsql
-- Planned once per connection, rows found by key whatever the tables hold: see 0006.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
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
               NOT coalesce(s.lease_owner IS NOT NULL AND s.lease_expires_at >= now(), false)
                   AS free
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

    -- For claims asked to take: the oldest pending input (an interrupt first) and its run,
    -- started or resumed.
    FOR r IN
        INSERT INTO runs AS u
            (id, session_id, inbox_seq, idempotency_key, status, attempts, epoch, owner,
             started_at)
        SELECT agentloop_run_id(p_sessions[t.i], q.idempotency_key), p_sessions[t.i], q.seq,
               q.idempotency_key, 'running', 1, v_epoch[t.i], p_owners[t.i], clock_timestamp()
        FROM generate_series(1, n) AS t (i)
        CROSS JOIN LATERAL (
            SELECT p.seq, p.idempotency_key
            FROM session_inbox AS p
            WHERE p.session_id = p_sessions[t.i] AND p.consumed_at IS NULL
            ORDER BY (p.kind = 'interrupt') DESC, p.seq
            LIMIT 1
        ) AS q
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

    -- One row per item; the history window of each run taken with a limit, read last, as
    -- agentloop_history_window reads it (written out here: a function call per item was two
    -- statements and their executor starts each).
    RETURN QUERY
    SELECT g.i, v_found[g.i], v_inserted[g.i], v_seq[g.i], v_claimed[g.i], v_epoch[g.i],
           v_owner[g.i], v_taken_seq[g.i], v_taken_key[g.i], v_taken_kind[g.i],
           v_taken_payload[g.i], v_run_id[g.i], v_run_status[g.i], v_run_attempts[g.i],
           v_run_started[g.i], v_run_finished[g.i], w.h_seq, w.h_key, w.h_role, w.h_content,
           w.h_run_id, w.h_tool_call_id, w.h_tool_name, w.h_data, w.h_created_at, w.delta
    FROM generate_series(1, n) AS g (i)
    LEFT JOIN LATERAL (
        SELECT x.delta,
               array_agg(e.seq ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL) AS h_seq,
               array_agg(e.entry_key ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL) AS h_key,
               array_agg(e.role ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL) AS h_role,
               array_agg(e.content ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL)
                   AS h_content,
               array_agg(e.run_id ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL) AS h_run_id,
               array_agg(e.tool_call_id ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL)
                   AS h_tool_call_id,
               array_agg(e.tool_name ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL)
                   AS h_tool_name,
               array_agg(e.data ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL) AS h_data,
               array_agg(e.created_at ORDER BY e.seq) FILTER (WHERE e.seq IS NOT NULL)
                   AS h_created_at
        FROM (
            -- With the caller's last entry still there (a reset deletes the transcript), only
            -- the entries after it.
            SELECT p_history_after[g.i] > 0 AND EXISTS (
                SELECT 1 FROM transcript_entries AS t
                WHERE t.session_id = p_sessions[g.i] AND t.seq = p_history_after[g.i]
            ) AS delta
        ) AS x
        LEFT JOIN LATERAL (
            SELECT t.seq, t.entry_key, t.role, t.content, t.run_id, t.tool_call_id, t.tool_name,
                   t.data, t.created_at
            FROM transcript_entries AS t
            WHERE t.session_id = p_sessions[g.i]
              AND t.seq > CASE WHEN x.delta THEN p_history_after[g.i] ELSE 0 END
            ORDER BY t.seq DESC
            LIMIT p_history_limits[g.i]
        ) AS e ON true
        WHERE g.i = ANY (v_history)
        GROUP BY x.delta
    ) AS w ON true;
END
$$;
