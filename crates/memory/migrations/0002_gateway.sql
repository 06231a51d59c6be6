-- Gateway requests ("dispatches"): a client's (session key, idempotency key), the run handle the
-- gateway returned for it and its first answer, so a repeated key gets that answer on every
-- gateway replica and after restarts, until the record expires.

CREATE TABLE dispatches (
    session_key     text NOT NULL,
    idempotency_key text NOT NULL,
    run_handle      uuid NOT NULL UNIQUE,
    session_id      uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    status          text NOT NULL DEFAULT 'accepted' CHECK (status IN ('accepted', 'ok', 'error')),
    text            text,
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (session_key, idempotency_key)
);

-- The expiry sweep reads the oldest expired records only.
CREATE INDEX dispatches_expires ON dispatches (expires_at);

-- A dispatch finds its run through the inbox's idempotency key.
CREATE INDEX runs_session_idempotency ON runs (session_id, idempotency_key);
