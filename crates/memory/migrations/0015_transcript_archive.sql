-- `/new` and `/reset` start a session over without losing what was said: the entries they
-- clear move here (reset_session.sql), out of the run path's tables and indexes.
CREATE TABLE transcript_archive (
    session_id uuid NOT NULL,
    seq bigint NOT NULL,
    entry_key text NOT NULL,
    role text NOT NULL,
    content text NOT NULL,
    run_id uuid,
    tool_call_id text,
    tool_name text,
    data text,
    created_at timestamptz NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);
