-- The guard's durable state: who may write to an assistant on a direct-message channel
-- (pairing), tool calls waiting for an operator (approvals), and the append-only audit of every
-- security decision. Each decision is written by the function that makes it, in its transaction.

CREATE TABLE security_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    source text NOT NULL CHECK (source IN ('scanner', 'guardian', 'pairing', 'approval', 'policy')),
    decision text NOT NULL,
    level text NOT NULL DEFAULT '',
    -- What the decision was about: `channel:sender`, a tool, an inbound message.
    subject text NOT NULL DEFAULT '',
    session_id text NOT NULL DEFAULT '',
    run_id text NOT NULL DEFAULT '',
    -- Who decided: a rule, a model, an operator.
    actor text NOT NULL DEFAULT '',
    reason text NOT NULL DEFAULT '',
    -- A redelivered message's decision is one row.
    dedupe_key text UNIQUE
);
CREATE INDEX security_audit_at ON security_audit (id DESC);

CREATE FUNCTION agentloop_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'security_audit is append-only';
END $$;
CREATE TRIGGER security_audit_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON security_audit
    FOR EACH STATEMENT EXECUTE FUNCTION agentloop_audit_append_only();

CREATE FUNCTION agentloop_audit(p_source text, p_decision text, p_level text, p_subject text,
                                p_session_id text, p_run_id text, p_actor text, p_reason text,
                                p_dedupe_key text DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO security_audit (source, decision, level, subject, session_id, run_id, actor, reason, dedupe_key)
    VALUES (p_source, p_decision, p_level, p_subject, p_session_id, p_run_id, p_actor, p_reason,
            nullif(p_dedupe_key, ''))
    ON CONFLICT (dedupe_key) DO NOTHING
$$;

-- Pairing: an unknown sender gets a code; an operator approves the code; the sender is paired.
CREATE TABLE pairing_requests (
    code text PRIMARY KEY,
    channel text NOT NULL,
    sender_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    UNIQUE (channel, sender_id)
);
CREATE TABLE paired_senders (
    channel text NOT NULL,
    sender_id text NOT NULL,
    approved_at timestamptz NOT NULL DEFAULT now(),
    approved_by text NOT NULL DEFAULT '',
    PRIMARY KEY (channel, sender_id)
);

-- May `p_sender` write on `p_channel`? 'allowed' when paired; otherwise, when the channel pairs
-- (`p_may_pair`), its pending code ('pending'; a new one from `p_code` when it has none and the
-- channel has fewer than `p_max_pending` live codes), else 'full'; 'refused' when it does not pair.
CREATE FUNCTION agentloop_check_sender(p_channel text, p_sender text, p_may_pair boolean,
                                       p_code text, p_max_pending integer, p_ttl_ms bigint)
RETURNS TABLE (outcome text, code text, created boolean, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    req pairing_requests;
BEGIN
    IF EXISTS (SELECT 1 FROM paired_senders s WHERE s.channel = p_channel AND s.sender_id = p_sender) THEN
        RETURN QUERY SELECT 'allowed'::text, ''::text, false, NULL::timestamptz;
        RETURN;
    END IF;
    IF NOT p_may_pair THEN
        PERFORM agentloop_audit('pairing', 'refused', '', p_channel || ':' || p_sender, '', '',
                                'dm_policy', 'sender not on the allowlist');
        RETURN QUERY SELECT 'refused'::text, ''::text, false, NULL::timestamptz;
        RETURN;
    END IF;
    -- One channel's codes are counted and issued one caller at a time.
    PERFORM pg_advisory_xact_lock(hashtext('agentloop_pairing:' || p_channel));
    DELETE FROM pairing_requests r WHERE r.channel = p_channel AND r.expires_at <= now();
    SELECT * INTO req FROM pairing_requests r WHERE r.channel = p_channel AND r.sender_id = p_sender;
    IF FOUND THEN
        RETURN QUERY SELECT 'pending'::text, req.code, false, req.expires_at;
        RETURN;
    END IF;
    IF (SELECT count(*) FROM pairing_requests r WHERE r.channel = p_channel) >= p_max_pending THEN
        PERFORM agentloop_audit('pairing', 'full', '', p_channel || ':' || p_sender, '', '',
                                'dm_policy', 'too many pending pairing codes on the channel');
        RETURN QUERY SELECT 'full'::text, ''::text, false, NULL::timestamptz;
        RETURN;
    END IF;
    INSERT INTO pairing_requests (code, channel, sender_id, expires_at)
    VALUES (p_code, p_channel, p_sender, now() + make_interval(secs => p_ttl_ms / 1000.0))
    RETURNING * INTO req;
    PERFORM agentloop_audit('pairing', 'requested', '', p_channel || ':' || p_sender, '', '',
                            'dm_policy', 'pairing code issued');
    RETURN QUERY SELECT 'pending'::text, req.code, true, req.expires_at;
END $$;

-- Approves a live pairing code: its sender is paired. No row when the code is unknown or expired.
CREATE FUNCTION agentloop_approve_pairing(p_code text, p_by text)
RETURNS TABLE (channel text, sender_id text, approved_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    req pairing_requests;
BEGIN
    DELETE FROM pairing_requests r WHERE r.code = upper(p_code) AND r.expires_at > now()
    RETURNING * INTO req;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO paired_senders AS s (channel, sender_id, approved_by)
    VALUES (req.channel, req.sender_id, p_by)
    ON CONFLICT ON CONSTRAINT paired_senders_pkey DO UPDATE SET approved_at = now(), approved_by = p_by;
    PERFORM agentloop_audit('pairing', 'approved', '', req.channel || ':' || req.sender_id,
                            '', '', p_by, 'code ' || req.code);
    RETURN QUERY SELECT req.channel, req.sender_id, now();
END $$;

-- Unpairs a sender (and drops its pending code); whether anything was removed.
CREATE FUNCTION agentloop_revoke_pairing(p_channel text, p_sender text, p_by text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    removed integer;
BEGIN
    DELETE FROM paired_senders s WHERE s.channel = p_channel AND s.sender_id = p_sender;
    GET DIAGNOSTICS removed = ROW_COUNT;
    DELETE FROM pairing_requests r WHERE r.channel = p_channel AND r.sender_id = p_sender;
    IF removed > 0 THEN
        PERFORM agentloop_audit('pairing', 'revoked', '', p_channel || ':' || p_sender, '', '',
                                p_by, '');
    END IF;
    RETURN removed > 0;
END $$;

-- Tool calls an agent's policy sends to an operator. One row per call of a run, so a run resumed
-- after a runner restart finds its call's request (and its answer) again.
CREATE TABLE tool_approvals (
    id uuid PRIMARY KEY,
    session_id uuid NOT NULL,
    session_key text NOT NULL,
    agent_id text NOT NULL,
    run_id text NOT NULL,
    tool_call_id text NOT NULL,
    tool text NOT NULL,
    arguments text NOT NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    always boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    resolved_at timestamptz,
    resolved_by text NOT NULL DEFAULT '',
    UNIQUE (run_id, tool_call_id)
);
CREATE INDEX tool_approvals_pending ON tool_approvals (created_at) WHERE status = 'pending';

-- "Approve always": the tool runs without asking for the rest of the session.
CREATE TABLE tool_grants (
    session_id uuid NOT NULL,
    tool text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    granted_by text NOT NULL DEFAULT '',
    PRIMARY KEY (session_id, tool)
);

-- A pending request whose time is up is denied as 'expired' when next read: the rule is here
-- once, whoever reads.
CREATE FUNCTION agentloop_expire_approval(p_id uuid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    expired tool_approvals;
BEGIN
    UPDATE tool_approvals a SET status = 'expired', resolved_at = now(), resolved_by = 'timeout'
    WHERE a.id = p_id AND a.status = 'pending' AND a.expires_at <= now()
    RETURNING * INTO expired;
    IF FOUND THEN
        PERFORM agentloop_audit('approval', 'expired', '', expired.tool, expired.session_id::text,
                                expired.run_id, 'timeout', 'no operator answered in time');
    END IF;
END $$;

-- Asks for (or finds again) the approval of one tool call. A session grant answers at once.
CREATE FUNCTION agentloop_request_approval(p_id uuid, p_session_id uuid, p_session_key text,
                                           p_agent_id text, p_run_id text, p_tool_call_id text,
                                           p_tool text, p_arguments text, p_ttl_ms bigint)
RETURNS SETOF tool_approvals LANGUAGE plpgsql AS $$
DECLARE
    req tool_approvals;
    granted boolean;
BEGIN
    SELECT * INTO req FROM tool_approvals a WHERE a.run_id = p_run_id AND a.tool_call_id = p_tool_call_id;
    IF NOT FOUND THEN
        granted := EXISTS (SELECT 1 FROM tool_grants g WHERE g.session_id = p_session_id AND g.tool = p_tool);
        INSERT INTO tool_approvals AS a (id, session_id, session_key, agent_id, run_id, tool_call_id,
                                         tool, arguments, status, always, expires_at, resolved_at, resolved_by)
        VALUES (p_id, p_session_id, p_session_key, p_agent_id, p_run_id, p_tool_call_id, p_tool,
                p_arguments, CASE WHEN granted THEN 'approved' ELSE 'pending' END, granted,
                now() + make_interval(secs => p_ttl_ms / 1000.0),
                CASE WHEN granted THEN now() END, CASE WHEN granted THEN 'session grant' ELSE '' END)
        ON CONFLICT (run_id, tool_call_id) DO NOTHING;
        PERFORM agentloop_audit('approval', CASE WHEN granted THEN 'approved' ELSE 'requested' END,
                                '', p_tool, p_session_id::text, p_run_id,
                                CASE WHEN granted THEN 'session grant' ELSE 'tool policy' END, '',
                                'approval:' || p_run_id || ':' || p_tool_call_id);
    END IF;
    SELECT * INTO req FROM tool_approvals a WHERE a.run_id = p_run_id AND a.tool_call_id = p_tool_call_id;
    PERFORM agentloop_expire_approval(req.id);
    RETURN QUERY SELECT * FROM tool_approvals a WHERE a.id = req.id;
END $$;

-- An operator's answer to a pending request: 'approved' (once, or `p_always` for the session) or
-- 'denied'. Returns the request as it stands; unchanged when it was no longer pending.
CREATE FUNCTION agentloop_resolve_approval(p_id uuid, p_approve boolean, p_always boolean, p_by text)
RETURNS SETOF tool_approvals LANGUAGE plpgsql AS $$
DECLARE
    req tool_approvals;
BEGIN
    PERFORM agentloop_expire_approval(p_id);
    UPDATE tool_approvals a
    SET status = CASE WHEN p_approve THEN 'approved' ELSE 'denied' END,
        always = p_approve AND p_always, resolved_at = now(), resolved_by = p_by
    WHERE a.id = p_id AND a.status = 'pending'
    RETURNING * INTO req;
    IF FOUND THEN
        IF req.always THEN
            INSERT INTO tool_grants (session_id, tool, granted_by) VALUES (req.session_id, req.tool, p_by)
            ON CONFLICT (session_id, tool) DO NOTHING;
        END IF;
        PERFORM agentloop_audit('approval', req.status || CASE WHEN req.always THEN ' always' ELSE '' END,
                                '', req.tool, req.session_id::text, req.run_id, p_by, '');
    END IF;
    RETURN QUERY SELECT * FROM tool_approvals a WHERE a.id = p_id;
END $$;
