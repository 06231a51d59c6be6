-- The gateway principal a session belongs to: set when the gateway creates the session for a
-- principal, NULL for sessions created any other way (NATS, the CLI, an admin). Gateway calls
-- see a session only when its owner is the caller's principal, or when the caller is an admin.
-- A nullable column without default is added without rewriting the table.
ALTER TABLE sessions ADD COLUMN owner text;

-- sessions.list for one principal. The owner never changes and updated_at is not in the
-- index, so the frequent updated_at writes stay HOT updates.
CREATE INDEX sessions_owner ON sessions (owner) WHERE owner IS NOT NULL;
