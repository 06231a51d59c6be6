-- A cap on the pending (unconsumed) inputs of one session, so a client cannot queue unbounded
-- input. Enforced by a trigger rather than in the three enqueue functions (agentloop_enqueue,
-- agentloop_enqueue_each, agentloop_enqueue_many): every one of them inserts through
-- `INSERT ... ON CONFLICT DO NOTHING` and already answers a row neither inserted nor found with
-- inserted = false and seq NULL, which the store reads as "queue full". Each enqueue locks the
-- session's row before its insert, so the count below cannot race another enqueue of the
-- same session.

-- Service settings the database itself needs; memory writes them at start from its config.
CREATE TABLE agentloop_settings (
    name text PRIMARY KEY,
    value bigint NOT NULL
);

-- Skips (returns NULL for) an input whose session already has the cap's number of pending
-- inputs. No exception: one would fail a whole batch of other sessions' enqueues. No setting,
-- or one of 0 or less, means no cap. A BEFORE trigger runs before ON CONFLICT's check, so a
-- repeated key of a full session is skipped here too, and the enqueue's lookup then finds the
-- stored row and answers it as the duplicate it is.
CREATE FUNCTION agentloop_inbox_cap() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cap bigint;
BEGIN
    -- The common case, a session with nothing pending (a conversation in turn), passes after
    -- one probe of the partial index session_inbox_pending, without reading the setting or
    -- counting: reading and counting for every input cost about 5 % of the stack's CPU per run
    -- (bench/HISTORY.md, eleventh session).
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

CREATE TRIGGER session_inbox_cap
BEFORE INSERT ON session_inbox
FOR EACH ROW EXECUTE FUNCTION agentloop_inbox_cap();
