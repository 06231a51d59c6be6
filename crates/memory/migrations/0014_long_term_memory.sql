-- Long-term memory per (agent, user) and each session's skills snapshot.

-- Who a session's user is, written once: the gateway principal that owns the session, else the
-- sender on the message's channel, else the session itself. A principal wins over a sender id
-- because a gateway client chooses its sender id freely: naming another user's sender id must
-- not reach that user's memories.
CREATE FUNCTION agentloop_memory_user(p_session uuid, p_sender text, p_channel text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN coalesce(s.owner, '') <> '' THEN 'principal:' || s.owner
        WHEN coalesce(p_sender, '') <> '' THEN 'sender:' || coalesce(p_channel, '') || ':' || p_sender
        ELSE 'session:' || s.key
    END
    FROM sessions AS s
    WHERE s.id = p_session
$$;

-- A query as any of its words (stemmed, stop words left out), so a question finds the fact
-- that shares its topic words with it rather than only one holding every word.
CREATE FUNCTION agentloop_memory_query(p_text text)
RETURNS tsquery
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(
        (SELECT string_agg(quote_literal(lexeme), ' | ')
         FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, p_text))) AS lexeme),
        '')::tsquery
$$;

CREATE TABLE memories (
    id uuid PRIMARY KEY,
    -- '' for memories shared across the user's agents.
    agent_id text NOT NULL,
    user_key text NOT NULL,
    text text NOT NULL CHECK (length(text) BETWEEN 1 AND 4000),
    source text NOT NULL DEFAULT 'tool' CHECK (source IN ('tool', 'learned', 'operator')),
    search tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED,
    session_id uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, user_key, text)
);
CREATE INDEX memories_user ON memories (user_key, agent_id, updated_at DESC);
CREATE INDEX memories_search ON memories USING gin (search);

-- The skills a session's runs see: taken at its first run, a new version after /new or /reset
-- (the old one is retired, kept for the record).
CREATE TABLE skill_snapshots (
    session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    version integer NOT NULL,
    digest text NOT NULL,
    skills jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    PRIMARY KEY (session_id, version)
);

-- The user a memory call is about: derived from the session when one is given (the rule
-- above), else the gateway principal, else the key as given. NULL for an unknown session.
CREATE FUNCTION agentloop_memory_scope(p_session uuid, p_sender text, p_channel text,
                                       p_principal text, p_user_key text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_session IS NOT NULL THEN agentloop_memory_user(p_session, p_sender, p_channel)
        WHEN coalesce(p_principal, '') <> '' THEN 'principal:' || p_principal
        ELSE nullif(p_user_key, '')
    END
$$;
