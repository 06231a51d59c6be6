-- The run path as functions: each RPC of a run is one round trip to Postgres and one implicit
-- transaction, however many statements it needs (before: BEGIN, three statements, COMMIT).
--
-- Commits are synchronous. Committing the run path asynchronously was measured (p50 -0.3 ms,
-- +5 % runs/s) and dropped: after a crash Postgres may hand a lost row's sequence value to a
-- new row, and the chaos test then lost inputs. What stays from that work is cheap and still
-- right: the runner acknowledges a RunCommand only after agentloop_flush() found its inbox row
-- on disk (a guard for servers run with synchronous_commit = off), run ids derive from the
-- input, and epochs never repeat.

-- Every writer of these rows is fenced by the session's lease row, which it locks; the foreign
-- keys only added a lock and a lookup per inserted row (sessions are never deleted).
ALTER TABLE session_inbox DROP CONSTRAINT IF EXISTS session_inbox_session_id_fkey;
ALTER TABLE transcript_entries DROP CONSTRAINT IF EXISTS transcript_entries_session_id_fkey;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_session_id_fkey;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_inbox_seq_fkey;

-- Every read of the transcript is by session, so (session_id, seq) is the key; an index on seq
-- alone only cost each entry one more insertion.
ALTER TABLE transcript_entries DROP CONSTRAINT transcript_entries_pkey;
DROP INDEX transcript_entries_session_seq;
ALTER TABLE transcript_entries ADD PRIMARY KEY (session_id, seq);

-- A run's id derives from its input (agentloop_run_id), so the gateway finds a request's run by
-- id; these indexes only cost every run two more insertions.
DROP INDEX IF EXISTS runs_session;
DROP INDEX IF EXISTS runs_session_idempotency;

-- Makes every transaction committed before the call durable, and returns those of the given
-- inbox rows (seq and idempotency key) that exist: such a row was committed before this call,
-- so this commit's flush covers it. A row lost in a crash is not returned (its seq may have
-- gone to another input since, hence the key), and its source must deliver it again.
CREATE FUNCTION agentloop_flush(p_seqs bigint[], p_keys text[])
RETURNS TABLE (seq bigint, idempotency_key text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    -- A WAL record in a transaction with an id: its commit waits for the disk.
    PERFORM pg_logical_emit_message(true, 'agentloop.flush', '');
    RETURN QUERY
    SELECT i.seq, i.idempotency_key
    FROM unnest(p_seqs, p_keys) AS r (seq, idempotency_key)
    JOIN session_inbox AS i ON i.seq = r.seq AND i.idempotency_key = r.idempotency_key;
END
$$;

-- The next lease epoch: above the last one and above the clock in microseconds, so an epoch
-- lost with an unflushed commit is not handed out again after a crash.
CREATE FUNCTION agentloop_next_epoch(p_last bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT greatest(p_last + 1, (date_part('epoch', clock_timestamp()) * 1000000)::bigint)
$$;

-- A run's id, derived from its input so a run repeated after a crash keeps it.
CREATE FUNCTION agentloop_run_id(p_session uuid, p_key text) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(p_session::text || '/' || p_key)::uuid
$$;

-- The newest p_limit entries of a session, oldest first, as parallel arrays. With p_after > 0
-- and that entry still there (a reset deletes the transcript), only the entries after it:
-- the caller holds the rest, and delta says so.
CREATE FUNCTION agentloop_history_window(p_session uuid, p_limit bigint, p_after bigint,
    OUT delta boolean, OUT h_seq bigint[], OUT h_key text[], OUT h_role text[],
    OUT h_content text[], OUT h_run_id uuid[], OUT h_tool_call_id text[],
    OUT h_tool_name text[], OUT h_data text[], OUT h_created_at timestamptz[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    delta := p_after > 0 AND EXISTS (
        SELECT 1 FROM transcript_entries AS e WHERE e.session_id = p_session AND e.seq = p_after
    );
    SELECT array_agg(h.seq ORDER BY h.seq), array_agg(h.entry_key ORDER BY h.seq),
           array_agg(h.role ORDER BY h.seq), array_agg(h.content ORDER BY h.seq),
           array_agg(h.run_id ORDER BY h.seq), array_agg(h.tool_call_id ORDER BY h.seq),
           array_agg(h.tool_name ORDER BY h.seq), array_agg(h.data ORDER BY h.seq),
           array_agg(h.created_at ORDER BY h.seq)
    INTO h_seq, h_key, h_role, h_content, h_run_id, h_tool_call_id, h_tool_name, h_data,
         h_created_at
    FROM (
        SELECT e.seq, e.entry_key, e.role, e.content, e.run_id, e.tool_call_id, e.tool_name,
               e.data, e.created_at
        FROM transcript_entries AS e
        -- A plain range on (session_id, seq): the scan stops at the first entry not wanted.
        WHERE e.session_id = p_session AND e.seq > CASE WHEN delta THEN p_after ELSE 0 END
        ORDER BY e.seq DESC
        LIMIT p_limit
    ) AS h;
END
$$;

-- Takes the lease when it is free or expired; when it is held, reports the holder. No row for
-- an unknown session. The row is locked before the lease is judged: judging it on a snapshot
-- could skip a release in flight and leave a new input without an owner.
CREATE FUNCTION agentloop_claim(p_session uuid, p_owner text, p_ttl_ms bigint)
RETURNS TABLE (claimed boolean, epoch bigint, owner text)
LANGUAGE plpgsql AS $$
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
    IF s.lease_owner IS NOT NULL AND s.lease_expires_at >= now() THEN
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

-- Fenced by the epoch: takes the oldest pending input (an interrupt first) and starts its run,
-- or resumes it (attempts + 1, new epoch and owner) when a previous holder took it before
-- losing the lease. Always one row; the item and run columns are NULL when nothing is pending.
CREATE FUNCTION agentloop_take(p_session uuid, p_epoch bigint, p_owner text)
RETURNS TABLE (held boolean, seq bigint, idempotency_key text, kind text, payload bytea,
               run_id uuid, status text, attempts int, started_at timestamptz,
               finished_at timestamptz)
LANGUAGE plpgsql AS $$
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
    FROM (
        SELECT q.seq, q.idempotency_key
        FROM session_inbox AS q
        WHERE q.session_id = p_session AND q.consumed_at IS NULL
        ORDER BY (q.kind = 'interrupt') DESC, q.seq
        LIMIT 1
    ) AS i
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

-- Puts an input in the inbox (a repeated idempotency key is absorbed and answered with the
-- existing row's seq). With p_owner, also tries to claim the session; when that succeeds and
-- p_history_limit is set, takes the next input and reads that much history, all in one
-- transaction.
CREATE FUNCTION agentloop_enqueue(p_session uuid, p_key text, p_kind text, p_payload bytea,
                                  p_owner text, p_ttl_ms bigint, p_history_limit bigint,
                                  p_history_after bigint)
RETURNS TABLE (session_found boolean, inserted boolean, seq bigint, claimed boolean,
               epoch bigint, owner text, taken_seq bigint, taken_key text, taken_kind text,
               taken_payload bytea, run_id uuid, run_status text, run_attempts int,
               run_started_at timestamptz, run_finished_at timestamptz,
               h_seq bigint[], h_key text[], h_role text[], h_content text[], h_run_id uuid[],
               h_tool_call_id text[], h_tool_name text[], h_data text[],
               h_created_at timestamptz[], h_delta boolean)
LANGUAGE plpgsql AS $$
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
    IF c.lease_owner IS NOT NULL AND c.lease_expires_at >= now() THEN
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
    -- The oldest pending input (an interrupt first) and its run, in one statement.
    INSERT INTO runs AS r
        (id, session_id, inbox_seq, idempotency_key, status, attempts, epoch, owner, started_at)
    SELECT agentloop_run_id(p_session, i.idempotency_key), p_session, i.seq, i.idempotency_key,
           'running', 1, agentloop_enqueue.epoch, p_owner, clock_timestamp()
    FROM (
        SELECT q.seq, q.idempotency_key
        FROM session_inbox AS q
        WHERE q.session_id = p_session AND q.consumed_at IS NULL
        ORDER BY (q.kind = 'interrupt') DESC, q.seq
        LIMIT 1
    ) AS i
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
        FROM agentloop_history_window(p_session, p_history_limit, p_history_after) AS w;
    END IF;
    RETURN NEXT;
END
$$;

-- Fenced append: nothing is written once the epoch moved on. Entries are inserted in request
-- order so their seq follows it; a key already present is absorbed.
CREATE FUNCTION agentloop_append(p_session uuid, p_epoch bigint, p_keys text[], p_roles text[],
                                 p_contents text[], p_run_ids uuid[], p_tool_call_ids text[],
                                 p_tool_names text[], p_data text[])
RETURNS TABLE (held boolean, appended bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n bigint;
BEGIN
    PERFORM 1 FROM sessions
    WHERE id = p_session AND lease_epoch = p_epoch AND lease_owner IS NOT NULL
    FOR SHARE;
    IF NOT FOUND THEN
        held := false;
        appended := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO transcript_entries
        (session_id, entry_key, role, content, run_id, tool_call_id, tool_name, data)
    SELECT p_session, e.entry_key, e.role, e.content, e.run_id, e.tool_call_id, e.tool_name,
           e.data
    FROM unnest(p_keys, p_roles, p_contents, p_run_ids, p_tool_call_ids, p_tool_names, p_data)
        WITH ORDINALITY AS e (entry_key, role, content, run_id, tool_call_id, tool_name, data, ord)
    ORDER BY e.ord
    ON CONFLICT (session_id, entry_key) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    held := true;
    appended := n;
    RETURN NEXT;
END
$$;

-- Gives the lease back unless inputs are pending; returns whether it did.
CREATE FUNCTION agentloop_release(p_session uuid, p_epoch bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sessions
    SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = p_session
      AND lease_epoch = p_epoch
      AND NOT EXISTS (
          SELECT 1 FROM session_inbox WHERE session_id = p_session AND consumed_at IS NULL
      );
    RETURN FOUND;
END
$$;

-- The end of a run, fenced by the epoch and in one transaction: its last entries, the run
-- finished, its input consumed and the session's usage bumped (each only if not done yet, so a
-- retry changes nothing and counts no token twice), and the lease given back when asked and
-- nothing else is pending. Written out rather than calling agentloop_append and
-- agentloop_release: five statements instead of ten (see agentloop_enqueue).
CREATE FUNCTION agentloop_finish_run(p_session uuid, p_epoch bigint, p_run uuid, p_seq bigint,
                                     p_status text, p_error text, p_model text,
                                     p_input_tokens bigint, p_output_tokens bigint,
                                     p_provider text, p_profile text, p_keys text[],
                                     p_roles text[], p_contents text[], p_run_ids uuid[],
                                     p_tool_call_ids text[], p_tool_names text[],
                                     p_data text[], p_release boolean)
RETURNS TABLE (held boolean, run_found boolean, finished boolean, released boolean)
LANGUAGE plpgsql AS $$
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
            SELECT p_release AND NOT EXISTS (
                SELECT 1 FROM session_inbox AS i
                WHERE i.session_id = p_session AND i.consumed_at IS NULL
            ) AS give_back
        ) AS decision
        WHERE s.id = p_session
        RETURNING decision.give_back INTO released;
    END IF;
    RETURN NEXT;
END
$$;
