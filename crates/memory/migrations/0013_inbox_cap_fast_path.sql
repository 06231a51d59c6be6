-- The inbox cap's common case made cheap: an input for a session with nothing pending (a
-- conversation in turn) is let through after one probe of the partial index
-- session_inbox_pending, without reading the setting or counting. Measured: the cap as first
-- written cost about 5 % of the stack's CPU per run (bench/HISTORY.md, eleventh session).
CREATE OR REPLACE FUNCTION agentloop_inbox_cap() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cap bigint;
BEGIN
    IF NEW.consumed_at IS NOT NULL OR NOT EXISTS (
        SELECT 1 FROM session_inbox AS i
        WHERE i.session_id = NEW.session_id AND i.consumed_at IS NULL
    ) THEN
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
