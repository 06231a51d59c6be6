-- Auto-learn: after a run, its exchange is queued here and a runner asks the learn model for
-- durable facts. A job is leased like a session (a runner that dies mid-job leaves it to the next
-- claim once the lease runs out) and ends once; its saves are idempotent by the memory's text.
CREATE TABLE learn_jobs (
    id uuid PRIMARY KEY,
    run_id uuid NOT NULL UNIQUE,
    session_id uuid NOT NULL,
    agent_id text NOT NULL,
    shared boolean NOT NULL DEFAULT false,
    sender_id text NOT NULL DEFAULT '',
    channel text NOT NULL DEFAULT '',
    exchange text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX learn_jobs_pending ON learn_jobs (created_at) WHERE status = 'pending';
