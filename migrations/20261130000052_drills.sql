-- Duplicate drills (engine/src/actions/drill.rs): a succeeded record's message id published
-- again, with the record's counters before, so the console can show which layer caught the copy
-- and that the handler did not run again.
CREATE TABLE drills (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record_id         BIGINT NOT NULL,
    consumer_group    TEXT NOT NULL,
    message_id        TEXT NOT NULL,
    actor             TEXT NOT NULL,
    published_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Whether the Redis marker existed when the copy was published.
    marker_present    BOOLEAN NOT NULL,
    duplicates_before INTEGER NOT NULL,
    conflicts_before  INTEGER NOT NULL,
    attempts_before   INTEGER NOT NULL,
    -- Effects in the order domain's tables under this message id (payments, reservations, SMS).
    effects_before    BIGINT NOT NULL
);
