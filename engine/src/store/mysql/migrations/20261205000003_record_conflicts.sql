-- The copies of conflicting deliveries (docs/DESIGN.md, "Reused ids and payload conflicts"): the
-- PostgreSQL store's migration 20261204000068 in MySQL's terms. One open row per record and
-- distinct payload: PostgreSQL's partial unique index (WHERE settled_at IS NULL) becomes a unique
-- key over a stored generated column that is NULL once the row is settled (InnoDB's unique keys
-- admit any number of NULLs), so the keeping statement's ON DUPLICATE KEY UPDATE fires on an open
-- row only. No index on `settled_at` yet: only cleanup (not on MySQL yet) reads it.
CREATE TABLE record_conflicts (
    id                 BIGINT NOT NULL AUTO_INCREMENT,                    -- identity → AUTO_INCREMENT, never supplied
    record_id          BIGINT NOT NULL,                                   -- the record whose id the copy carried (no foreign key, as PostgreSQL)
    consumer_group     VARBINARY(255) NOT NULL,                           -- as dedup_records.consumer_group
    message_id         VARBINARY(512) NOT NULL,                           -- as dedup_records.message_id
    kind               VARCHAR(7) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, -- text + CHECK, as PostgreSQL
    message_type       VARBINARY(255) NOT NULL,                           -- as dedup_records.message_type
    id_source          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- the `ids.from` source, as written
    payload_hash       VARBINARY(32) NOT NULL,                            -- bytea (SHA-256) → bytes
    payload            LONGBLOB NOT NULL,                                 -- bytea → LONGBLOB
    headers            JSON NULL,                                         -- jsonb → JSON (MariaDB: LONGTEXT with a json_valid check)
    content_type       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- as dedup_records
    type_property      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- as dedup_records
    source_broker      VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,   -- as dedup_records
    source_exchange    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- as dedup_records
    source_routing_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- as dedup_records
    source_queue       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- as dedup_records
    copies             INT NOT NULL DEFAULT 1,                            -- integer → INT
    first_seen_at      DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),   -- now() default → UTC expression default
    last_seen_at       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),   -- as first_seen_at
    requeued_as        VARBINARY(512) NULL,                               -- a message id
    settled_at         DATETIME(6) NULL,                                  -- timestamptz → DATETIME(6) UTC
    settled_by         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- `user:<name>`, ...
    open_hash          VARBINARY(32)
                       GENERATED ALWAYS AS (IF(settled_at IS NULL, payload_hash, NULL)) STORED, -- stand-in for the partial index's WHERE settled_at IS NULL
    PRIMARY KEY (id),                                                     -- clustered, arrival order
    UNIQUE KEY record_conflicts_open_key (record_id, open_hash),          -- ≈ UNIQUE (record_id, payload_hash) WHERE settled_at IS NULL
    CONSTRAINT record_conflicts_kind_check CHECK (kind IN ('type', 'payload')) -- as PostgreSQL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
