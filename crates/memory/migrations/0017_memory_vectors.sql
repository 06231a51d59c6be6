-- Hybrid memory search: each memory may carry its embedding, from the model named beside it, so
-- a search can add vector similarity to full-text rank. The vector is stored as packed
-- little-endian float32 (bytea) and scored by the memory service, not in SQL: Debian's
-- postgresql-15-pgvector is not installable on the machines this runs on, and a cosine over a
-- real[] in SQL took 84 ms for a user's 710 memories where reading the bytes and scoring them in
-- Rust takes about a millisecond. A vector of another model than the query's is never compared.
ALTER TABLE memories
    ADD COLUMN embedding bytea,
    ADD COLUMN embedding_model text,
    ADD CONSTRAINT memories_embedding_shape CHECK (
        (embedding IS NULL) = (embedding_model IS NULL)
        AND (embedding IS NULL OR (length(embedding) % 4 = 0
                                   AND length(embedding) BETWEEN 4 AND 16384))
    );

-- A counter per user and agent that every insert, update and delete of their memories moves on,
-- in the same transaction: the memory service uses the vectors it keeps of a user only while
-- the counter is where it was when they were read (one primary-key read per search, where
-- summarizing the user's 700 memories took 0.45 ms). Statement-level triggers, so a statement
-- writing many memories bumps each user once.
CREATE TABLE memory_versions (
    user_key text NOT NULL,
    agent_id text NOT NULL,
    version bigint NOT NULL DEFAULT 1,
    PRIMARY KEY (user_key, agent_id)
);

CREATE FUNCTION agentloop_bump_memory_versions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO memory_versions AS v (user_key, agent_id)
        SELECT DISTINCT o.user_key, o.agent_id FROM old_rows AS o
        ON CONFLICT (user_key, agent_id) DO UPDATE SET version = v.version + 1;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO memory_versions AS v (user_key, agent_id)
        SELECT DISTINCT n.user_key, n.agent_id FROM new_rows AS n
        ON CONFLICT (user_key, agent_id) DO UPDATE SET version = v.version + 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER memories_version_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION agentloop_bump_memory_versions();
CREATE TRIGGER memories_version_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION agentloop_bump_memory_versions();
CREATE TRIGGER memories_version_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION agentloop_bump_memory_versions();
