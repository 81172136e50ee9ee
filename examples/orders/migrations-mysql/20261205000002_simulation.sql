-- What `dedup-console simulate` published, so `dedup-console verify` can account for every
-- message id (PostgreSQL's migration 20261202000003 in MySQL's terms).
CREATE TABLE IF NOT EXISTS simulation_runs (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    started_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    finished_at DATETIME(6) NULL,
    parameters  JSON NOT NULL,                                    -- jsonb → JSON (MariaDB: LONGTEXT with a json_valid check); read with JSON_EXTRACT, which both accept
    published   BIGINT NOT NULL DEFAULT 0,
    duplicates  BIGINT NOT NULL DEFAULT 0,
    poison      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS simulation_messages (
    run_id         BIGINT NOT NULL,
    consumer_group VARBINARY(255) NOT NULL,                       -- as the engine's dedup_records.consumer_group
    -- The id the record is expected under (the synthetic POISON... id for poison without id);
    -- text COLLATE "C" → bytes, as the engine's dedup_records.message_id, so the join compares bytes.
    message_id     VARBINARY(512) NOT NULL,
    poison         BOOLEAN NOT NULL,
    copies         INT NOT NULL,
    PRIMARY KEY (run_id, consumer_group, message_id),             -- 8 + 255 + 512 bytes, under InnoDB's 3072
    CONSTRAINT simulation_messages_run_id_fkey FOREIGN KEY (run_id) REFERENCES simulation_runs (id) ON DELETE CASCADE
) ENGINE = InnoDB;
