-- Duplicate drills (engine/src/actions/drill.rs): the PostgreSQL store's drills table
-- (migrations 20261130000052 and 20261202000055) in MySQL's terms. Read by its primary key only.
CREATE TABLE drills (
    id                BIGINT NOT NULL AUTO_INCREMENT,                           -- identity → AUTO_INCREMENT
    record_id         BIGINT NOT NULL,                                          -- the record drilled (no foreign key, as PostgreSQL)
    consumer_group    VARBINARY(255) NOT NULL,                                  -- as dedup_records.consumer_group
    message_id        VARBINARY(512) NOT NULL,                                  -- as dedup_records.message_id
    actor             VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- as audit_log.actor
    published_at      DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),          -- now() default → UTC expression default
    marker_present    BOOLEAN NOT NULL,                                         -- whether the Redis marker existed then
    duplicates_before INT NOT NULL,                                             -- the record's counters before
    conflicts_before  INT NOT NULL,
    attempts_before   INT NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
