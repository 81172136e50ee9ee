-- The MySQL store's first migration (issue 25): the tables a claim writes, in the lean shape of
-- the PostgreSQL store after its migration 20261204000070 (docs/DESIGN.md, "The lean write
-- path"): `dedup_records` with only its primary key, the dedup key, the stand-in for the partial
-- index over the records not succeeded, and the claim nonce's index; append-only count deltas;
-- message types; attempt rows. Each choice is measured by engine/benches/mysql/claim_floor.sh,
-- which claims on this schema (BENCHMARKS.md, "MariaDB's claim floor beside PostgreSQL's").
-- MariaDB 10.11 accepts it; it uses nothing MySQL 8.0.16+ lacks (CHECK, expression defaults,
-- STORED generated columns) and nothing MariaDB-only.

-- Keys and compared text are VARBINARY: byte comparison, no collation, no PAD SPACE ('a' <> 'a ').
CREATE TABLE dedup_records (
    id                 BIGINT NOT NULL AUTO_INCREMENT,                -- identity → AUTO_INCREMENT, never supplied, so ODKU fires only on the dedup key
    consumer_group     VARBINARY(255) NOT NULL,                       -- text key → bytes; with message_id 767 bytes, under InnoDB's 3072-byte key limit
    message_id         VARBINARY(512) NOT NULL,                       -- text COLLATE "C" → bytes; 512 = MAX_MESSAGE_ID_BYTES (engine/src/record.rs)
    message_type       VARBINARY(255) NOT NULL,                       -- compared with the delivery's type, so bytes as well
    status             VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,  -- text + CHECK as PostgreSQL has it (no ENUM: same values, same check)
    handler_mode       VARCHAR(13) CHARACTER SET ascii COLLATE ascii_bin NULL,      -- text + CHECK, as PostgreSQL
    attempts           INT NOT NULL DEFAULT 0,                        -- integer → INT
    max_attempts       INT NOT NULL,                                  -- integer → INT
    reentries          INT NOT NULL DEFAULT 0,                        -- integer → INT
    lease_owner        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- free text, compared only as a whole: _bin
    lease_token        BINARY(16) NULL,                               -- uuid → 16 bytes
    lease_expires_at   DATETIME(6) NULL,                              -- timestamptz → DATETIME(6) in UTC (UTC_TIMESTAMP(6), never NOW())
    first_seen_at      DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), -- now() default → UTC expression default (MySQL 8.0.13+, MariaDB 10.2+)
    updated_at         DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), -- as first_seen_at; no ON UPDATE (statements set it, as PostgreSQL's do)
    completed_at       DATETIME(6) NULL,                              -- timestamptz → DATETIME(6) UTC
    next_attempt_at    DATETIME(6) NULL,                              -- timestamptz → DATETIME(6) UTC
    last_error         TEXT CHARACTER SET utf8mb4 NULL,               -- free text, never compared: default utf8mb4 collation is harmless
    error_class        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- grouped and prefix-matched ('NO_HANDLER:'): _bin
    payload_hash       VARBINARY(32) NOT NULL,                        -- bytea (SHA-256) → bytes
    payload            LONGBLOB NULL,                                 -- bytea → LONGBLOB (kept until the record succeeds)
    payload_truncated  BOOLEAN NOT NULL DEFAULT FALSE,                -- boolean → TINYINT(1)
    headers            JSON NULL,                                     -- jsonb → JSON (MariaDB: LONGTEXT with a json_valid check)
    content_type       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- text → _bin
    source_broker      VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,   -- text + CHECK, as PostgreSQL
    source_exchange    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- text → _bin
    source_routing_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- text → _bin
    source_queue       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- text → _bin
    duplicate_count    INT NOT NULL DEFAULT 0,                        -- integer → INT
    last_duplicate_at  DATETIME(6) NULL,                              -- timestamptz → DATETIME(6) UTC
    payload_conflicts  INT NOT NULL DEFAULT 0,                        -- integer → INT
    parked_at          DATETIME(6) NULL,                              -- timestamptz → DATETIME(6) UTC
    version            BIGINT NOT NULL DEFAULT 0,                     -- bigint; 0 on insert, so the read-back tells created (0) from taken over (> 0)
    poison             BOOLEAN NOT NULL DEFAULT FALSE,                -- boolean → TINYINT(1)
    type_property      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- text → _bin
    effect_started     BOOLEAN NULL,                                  -- nullable boolean, as PostgreSQL
    id_source          CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NULL,          -- "char" → CHAR(1), one byte
    claim_nonce        BINARY(16) NULL,                               -- MySQL only: the claiming statement's random nonce, read back in place of RETURNING
    unsettled_status   VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin
                       GENERATED ALWAYS AS (IF(status <> 'succeeded', status, NULL)) STORED, -- stand-in for the partial index's WHERE (MariaDB has no functional index); STORED: indexed VIRTUAL columns have had MariaDB bugs
    PRIMARY KEY (id),                                                 -- clustered, arrival order, appended at the right edge
    UNIQUE KEY dedup_records_group_message_key (consumer_group, message_id), -- the dedup key: the only unique key besides the PK (ODKU fires on any)
    KEY dedup_records_unsettled_idx (unsettled_status, id),           -- ≈ (status, id) WHERE status <> 'succeeded'; succeeded rows still write a NULL entry (InnoDB indexes NULLs)
    KEY dedup_records_claim_nonce_idx (claim_nonce, version),         -- the read-back's `WHERE claim_nonce = ?` (a batch: 500 adjacent entries); version makes created (0) index-only
    CONSTRAINT dedup_records_attempts_check CHECK (attempts >= 0 AND max_attempts > 0),                          -- as PostgreSQL
    CONSTRAINT dedup_records_handler_mode_check CHECK (handler_mode IN ('transactional', 'leased')),             -- as PostgreSQL
    CONSTRAINT dedup_records_source_broker_check CHECK (source_broker IN ('rabbitmq', 'kafka')),                 -- as PostgreSQL
    CONSTRAINT dedup_records_status_check CHECK (status IN ('processing', 'succeeded', 'failed', 'dead')),       -- as PostgreSQL
    CONSTRAINT dedup_records_lease_check CHECK (                                                                 -- as PostgreSQL: a lease exactly while processing
        (status = 'processing') = (lease_owner IS NOT NULL AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
        AND (lease_owner IS NULL) = (lease_token IS NULL) AND (lease_token IS NULL) = (lease_expires_at IS NULL))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;  -- InnoDB for row locks and transactions; _bin default so no column falls into _general_ci

-- Append-only count deltas (migration 054): inserts only, so no row two writers wait on.
CREATE TABLE record_counts (
    id             BIGINT NOT NULL AUTO_INCREMENT,                    -- PostgreSQL's heap has no key; InnoDB wants an explicit clustered key (else a hidden global row id)
    consumer_group VARBINARY(255) NOT NULL,                           -- as dedup_records.consumer_group
    status         VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, -- as dedup_records.status
    n              BIGINT NOT NULL,                                   -- the delta
    PRIMARY KEY (id)                                                  -- appended at the right edge
) ENGINE = InnoDB;

-- Every message type ever stored (console filters), inserted once per type.
CREATE TABLE message_types (
    message_type VARBINARY(255) NOT NULL,                             -- as dedup_records.message_type
    PRIMARY KEY (message_type)                                        -- the known-type probe
) ENGINE = InnoDB;

-- One row per attempt from the first failure on (a first-try success writes none).
CREATE TABLE record_attempts (
    id             BIGINT NOT NULL AUTO_INCREMENT,                    -- identity → AUTO_INCREMENT
    record_id      BIGINT NOT NULL,                                   -- bigint, references dedup_records
    attempt        INT NOT NULL,                                      -- integer → INT
    worker         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- text → _bin
    started_at     DATETIME(6) NOT NULL,                              -- timestamptz → DATETIME(6) UTC
    ended_at       DATETIME(6) NULL,                                  -- timestamptz → DATETIME(6) UTC
    outcome        VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NULL,      -- text + CHECK, as PostgreSQL
    error          TEXT CHARACTER SET utf8mb4 NULL,                   -- free text
    taken_over_by  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- text → _bin
    late_effect    BOOLEAN NOT NULL DEFAULT FALSE,                    -- boolean → TINYINT(1)
    answer_status  SMALLINT NULL,                                     -- smallint
    latency_ms     INT NULL,                                          -- integer
    answer         TEXT CHARACTER SET utf8mb4 NULL,                   -- free text
    in_progress    BOOLEAN NOT NULL DEFAULT FALSE,                    -- boolean → TINYINT(1)
    consumer_group VARBINARY(255) NULL,                               -- as dedup_records.consumer_group
    message_type   VARBINARY(255) NULL,                               -- as dedup_records.message_type
    PRIMARY KEY (id),                                                 -- clustered, arrival order
    KEY record_attempts_record_idx (record_id, attempt),              -- as PostgreSQL's; also serves the foreign key
    CONSTRAINT record_attempts_record_id_fkey FOREIGN KEY (record_id) REFERENCES dedup_records (id) ON DELETE CASCADE, -- as PostgreSQL
    CONSTRAINT record_attempts_outcome_check CHECK (outcome IS NULL OR outcome IN
        ('succeeded', 'failed', 'dead', 'lease_lost', 'released', 'deferred'))                                   -- as PostgreSQL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
