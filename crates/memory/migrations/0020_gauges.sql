-- What waits in memory, as gauges: sessions whose lease is held, pending inputs per kind (the
-- queue mode they came with), stuck sessions and approvals waiting for an operator. Read by the
-- memory service every `memory.gauges_interval_ms`; one statement, no index of its own (an
-- index on the lease would cost every run a write to spare this reading a scan).
--
-- Stuck: the lease is held and an input has waited longer than p_stuck_ms. An input is
-- consumed when its run finishes, so this catches both a run that hangs past its timeout and a
-- session whose owner holds the lease but takes nothing.
CREATE FUNCTION agentloop_gauges(p_stuck_ms bigint)
RETURNS TABLE(name text, label text, value bigint)
LANGUAGE sql STABLE AS $$
    SELECT 'sessions_active', '', count(*)
    FROM sessions WHERE agentloop_lease_live(lease_owner, lease_expires_at)
    UNION ALL
    SELECT 'inbox_pending', k.kind, count(i.seq)
    FROM unnest(ARRAY['user', 'followup', 'steer', 'collect', 'interrupt']) AS k (kind)
    LEFT JOIN session_inbox AS i ON i.kind = k.kind AND i.consumed_at IS NULL
    GROUP BY k.kind
    UNION ALL
    SELECT 'sessions_stuck', '', count(DISTINCT i.session_id)
    FROM session_inbox AS i JOIN sessions AS s ON s.id = i.session_id
    WHERE i.consumed_at IS NULL
      AND i.enqueued_at < now() - p_stuck_ms * interval '1 millisecond'
      AND agentloop_lease_live(s.lease_owner, s.lease_expires_at)
    UNION ALL
    SELECT 'approvals_pending', '', count(*)
    FROM tool_approvals WHERE status = 'pending' AND expires_at > now()
$$;
