-- Late duplicates (docs/DESIGN.md, "Late duplicates"): the PostgreSQL store's migration
-- 20261204000067 in MySQL's terms, without what only cleanup reads (cleanup does not run on MySQL
-- yet: no `cleanup_schedules.fingerprint_days`, no index on `forget_at` or `seen_at`; they come
-- with cleanup's statements).
--
-- The fingerprint is the same 64 bits as PostgreSQL's `dedup_fingerprint(group, type, id)`, the
-- first 8 bytes of MD5(group, newline, type, newline, message id), kept as BINARY(8) rather than a
-- signed BIGINT: MySQL has no bit-string cast, and CAST(CONV(…) AS SIGNED) of the upper half of
-- the range converts with a warning that strict mode turns into an error on insert. No stored
-- function either (creating one needs SUPER or log_bin_trust_function_creators where binary
-- logging is on): the store writes the expression into its statements (`mysql/sql/late.rs`).
CREATE TABLE dedup_fingerprints (
    fingerprint   BINARY(8) NOT NULL,                                     -- bigint → the same 8 bytes, big-endian
    first_seen_at DATETIME(6) NOT NULL,                                   -- timestamptz → DATETIME(6) UTC
    forget_at     DATETIME(6) NOT NULL,                                   -- timestamptz → DATETIME(6) UTC
    PRIMARY KEY (fingerprint)                                             -- the batch lookup
) ENGINE = InnoDB;

-- Each late duplicate: the record it created, its delay after the first delivery of its id, and
-- whether the group's policy held it.
CREATE TABLE late_duplicates (
    record_id      BIGINT NOT NULL,                                       -- bigint
    consumer_group VARBINARY(255) NOT NULL,                               -- as dedup_records.consumer_group
    message_id     VARBINARY(512) NOT NULL,                               -- as dedup_records.message_id
    first_seen_at  DATETIME(6) NOT NULL,                                  -- timestamptz → DATETIME(6) UTC
    seen_at        DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),       -- now() default → UTC expression default
    delay_ms       BIGINT NOT NULL,                                       -- bigint
    held           BOOLEAN NOT NULL,                                      -- boolean → TINYINT(1)
    note_nonce     BINARY(16) NULL,                                       -- MySQL only: the noting statement's nonce, read back in place of RETURNING
    PRIMARY KEY (record_id),                                              -- one note per record
    KEY late_duplicates_note_nonce_idx (note_nonce)                       -- the read-back
) ENGINE = InnoDB;
