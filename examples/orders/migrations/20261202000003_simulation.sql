-- What `dedup-console simulate` published, so `dedup-console verify` can account for every
-- message id.
CREATE TABLE IF NOT EXISTS simulation_runs (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    parameters  JSONB NOT NULL,
    published   BIGINT NOT NULL DEFAULT 0,
    duplicates  BIGINT NOT NULL DEFAULT 0,
    poison      BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS simulation_messages (
    run_id         BIGINT NOT NULL REFERENCES simulation_runs (id) ON DELETE CASCADE,
    consumer_group TEXT NOT NULL,
    -- The id the record is expected under (the synthetic POISON... id for poison without id).
    message_id     TEXT COLLATE "C" NOT NULL,
    poison         BOOLEAN NOT NULL,
    copies         INTEGER NOT NULL,
    PRIMARY KEY (run_id, consumer_group, message_id)
);
