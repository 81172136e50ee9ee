-- Secrets every process of an engine shares, created on first use (engine/src/db/mod.rs,
-- `engine_key`): `source-headers` signs the original exchange and routing key that retry and
-- dead-letter copies carry in their headers (engine/src/source/rabbitmq), so a producer cannot
-- forge them.
CREATE TABLE engine_keys (
    name       TEXT PRIMARY KEY,
    key        BYTEA NOT NULL CHECK (octet_length(key) = 32),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
