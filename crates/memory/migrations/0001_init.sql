-- The memory service's schema: sessions with their fenced lease, the append-only transcript,
-- the per-session inbox, runs, auth-profile cooldowns and long-term memory.

CREATE TABLE sessions (
    id               uuid PRIMARY KEY,
    key              text NOT NULL UNIQUE,
    agent_id         text NOT NULL DEFAULT 'main',
    channel          text,
    model_override   text,
    queue_mode       text,
    thinking_level   text,
    input_tokens     bigint NOT NULL DEFAULT 0,
    output_tokens    bigint NOT NULL DEFAULT 0,
    -- The lease: whoever holds lease_epoch may write; every claim bumps the epoch so a
    -- replica that lost its lease is fenced off even if it still believes it owns the session.
    lease_owner      text,
    lease_epoch      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE transcript_entries (
    seq          bigserial PRIMARY KEY,
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    entry_key    text NOT NULL,
    role         text NOT NULL,
    content      text NOT NULL,
    run_id       uuid,
    tool_call_id text,
    tool_name    text,
    data         text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- A retried append carries the same keys and is absorbed.
    UNIQUE (session_id, entry_key)
);

-- GetHistory reads the newest entries of one session.
CREATE INDEX transcript_entries_session_seq ON transcript_entries (session_id, seq);

CREATE TABLE session_inbox (
    seq             bigserial PRIMARY KEY,
    session_id      uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    idempotency_key text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('user', 'followup', 'steer', 'collect', 'interrupt')),
    payload         bytea NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    consumed_at     timestamptz,
    run_id          uuid,
    -- A redelivered RunCommand carries the same key and is absorbed.
    UNIQUE (session_id, idempotency_key)
);

-- Pending inputs are few while consumed ones pile up: TakeNext, ReleaseSession and
-- ListClaimable only ever look at the pending ones.
CREATE INDEX session_inbox_pending ON session_inbox (session_id, seq) WHERE consumed_at IS NULL;

CREATE TABLE runs (
    id              uuid PRIMARY KEY,
    session_id      uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    -- One run per input: a re-take after a lost lease resumes the same run.
    inbox_seq       bigint NOT NULL UNIQUE REFERENCES session_inbox (seq) ON DELETE CASCADE,
    idempotency_key text,
    status          text NOT NULL CHECK (status IN ('running', 'completed', 'error', 'aborted', 'timeout', 'max_turns')),
    attempts        int NOT NULL DEFAULT 1,
    epoch           bigint,
    owner           text,
    started_at      timestamptz NOT NULL,
    resumed_at      timestamptz,
    finished_at     timestamptz,
    error           text,
    model           text,
    input_tokens    bigint NOT NULL DEFAULT 0,
    output_tokens   bigint NOT NULL DEFAULT 0
);

CREATE INDEX runs_session ON runs (session_id);

CREATE TABLE auth_profile_cooldowns (
    provider       text NOT NULL,
    profile        text NOT NULL,
    failures       int NOT NULL DEFAULT 0,
    cooldown_until timestamptz,
    last_error     text,
    PRIMARY KEY (provider, profile)
);

CREATE TABLE long_term_memory (
    id         bigserial PRIMARY KEY,
    agent_id   text NOT NULL,
    session_id uuid REFERENCES sessions (id) ON DELETE SET NULL,
    content    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX long_term_memory_agent ON long_term_memory (agent_id, created_at);
