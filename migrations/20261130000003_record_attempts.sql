-- One row per handler attempt of a record: the record's history as the console shows it.
CREATE TABLE record_attempts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record_id   BIGINT NOT NULL REFERENCES dedup_records (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    -- `<host>:<pid>:<worker>` of the consumer that ran it.
    worker      TEXT NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    -- NULL while a leased attempt runs (or after its worker died: then the record is stuck).
    ended_at    TIMESTAMPTZ,
    outcome     TEXT,
    error       TEXT,
    CONSTRAINT record_attempts_outcome_check
        CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'dead', 'lease_lost', 'released'))
);
CREATE INDEX record_attempts_record_idx ON record_attempts (record_id, attempt);
