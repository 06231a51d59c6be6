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

-- A user's memories of an agent summarized: how many, and a hash over each one's id and last
-- change. Every save, replace and forget changes it (each sets updated_at or removes a row), so
-- the memory service uses the vectors it keeps of a user only while Postgres reports the
-- version they were read at.
CREATE FUNCTION agentloop_memories_version(p_user text, p_agent text)
RETURNS TABLE (count bigint, hash text)
LANGUAGE sql STABLE AS $$
    SELECT count(*),
           coalesce(sum(hashtextextended(m.id::text || extract(epoch FROM m.updated_at)::text, 0)),
                    0)::text
    FROM memories AS m
    WHERE m.user_key = p_user AND m.agent_id = p_agent
$$;
