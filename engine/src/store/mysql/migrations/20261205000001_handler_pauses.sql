-- Whether each handler takes deliveries, per (consumer group, message type): the PostgreSQL
-- store's migration 20261203000061 in MySQL's terms (docs/DESIGN.md, "Pause and circuit
-- breaker"). One row per handler, shared by every process of the group, read by its primary key.
-- MariaDB 10.11 and MySQL 8.0.16+ accept it (CHECK, expression defaults).
CREATE TABLE handler_pauses (
    consumer_group VARBINARY(255) NOT NULL,                               -- as dedup_records.consumer_group
    message_type   VARBINARY(255) NOT NULL,                               -- as dedup_records.message_type
    state          VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'running', -- text + CHECK, as PostgreSQL
    since          DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),       -- timestamptz → DATETIME(6) UTC
    changed_by     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- `engine`, `user:<name>`, `cli:<os user>`
    reason         TEXT CHARACTER SET utf8mb4 NULL,                       -- free text (a failure's first line, at most 500 characters)
    error_class    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- as dedup_records.error_class
    http_status    SMALLINT NULL,                                         -- smallint
    failed_at      DATETIME(6) NULL,                                      -- timestamptz → DATETIME(6) UTC
    probe_at       DATETIME(6) NULL,                                      -- timestamptz → DATETIME(6) UTC
    version        BIGINT NOT NULL DEFAULT 1,                             -- raised by every change of state
    kind           VARCHAR(13) CHARACTER SET ascii COLLATE ascii_bin NULL, -- `http`, `leased`, `transactional`
    seen_at        DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),       -- when last registered
    PRIMARY KEY (consumer_group, message_type),                           -- the reading of a group's rows, and every write
    CONSTRAINT handler_pauses_state_check CHECK (state IN ('running', 'breaker', 'gone', 'operator')) -- as PostgreSQL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
