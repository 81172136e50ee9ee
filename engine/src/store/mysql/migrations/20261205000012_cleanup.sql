-- Cleanup schedules and their runs (engine/src/actions/cleanup): the PostgreSQL store's
-- migrations 20261130000051 and 20261204000067 (fingerprint_days) in MySQL's terms, and the
-- index only cleanup reads, which migration …02 left for it (`record_conflicts.settled_at` has
-- one since …07). One runner per schedule holds a GET_LOCK (store/mysql/cleanup.rs). MariaDB
-- 10.11 and MySQL 8.0.16+ accept it.

CREATE TABLE cleanup_schedules (
    id               BIGINT NOT NULL AUTO_INCREMENT,                           -- identity → AUTO_INCREMENT
    name             VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- text; 100 characters = MAX_NAME_CHARS
    cron             VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- text; 200 characters = MAX_CRON_CHARS
    retention_days   INT NOT NULL DEFAULT 30,
    batch_size       INT NOT NULL DEFAULT 5000,
    statuses         SET('dead', 'failed', 'succeeded') CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'succeeded', -- text[] → SET: only these values, read as 'dead,succeeded' (sorted, as stored)
    consumer_group   VARBINARY(255) NULL,                                      -- as dedup_records.consumer_group; NULL: every group
    enabled          BOOLEAN NOT NULL DEFAULT TRUE,                            -- boolean → TINYINT(1)
    fingerprint_days INT NULL,                                                 -- NULL: ten times the retention
    last_run_for     DATETIME(6) NULL,                                         -- timestamptz → DATETIME(6) UTC
    next_run_at      DATETIME(6) NULL,                                         -- timestamptz → DATETIME(6) UTC
    created_by       VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- as audit_log.actor
    created_at       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),          -- now() default → UTC expression default
    updated_at       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    UNIQUE KEY cleanup_schedules_name_key (name),                              -- as PostgreSQL
    KEY cleanup_schedules_due_idx (enabled, next_run_at),                      -- the scheduler's pass
    CONSTRAINT cleanup_schedules_retention_check CHECK (retention_days BETWEEN 1 AND 3650),
    CONSTRAINT cleanup_schedules_batch_check CHECK (batch_size BETWEEN 1 AND 100000),
    CONSTRAINT cleanup_schedules_statuses_check CHECK (statuses <> ''),        -- ≈ cardinality(statuses) > 0 (the SET bounds the values)
    CONSTRAINT cleanup_schedules_fingerprint_days_check CHECK (fingerprint_days BETWEEN 0 AND 36500)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE cleanup_runs (
    id           BIGINT NOT NULL AUTO_INCREMENT,                               -- identity → AUTO_INCREMENT
    schedule_id  BIGINT NOT NULL,
    `trigger`    VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,    -- text + CHECK; a reserved word on MySQL, quoted
    tick_at      DATETIME(6) NULL,                                             -- the cron tick; NULL for manual runs (a unique key admits any number)
    actor        VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- as audit_log.actor
    cutoff       DATETIME(6) NOT NULL,
    started_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    finished_at  DATETIME(6) NULL,
    rows_deleted BIGINT NOT NULL DEFAULT 0,
    batches      INT NOT NULL DEFAULT 0,
    error        TEXT CHARACTER SET utf8mb4 NULL,                              -- free text
    PRIMARY KEY (id),
    UNIQUE KEY cleanup_runs_tick_key (schedule_id, tick_at),                   -- as PostgreSQL
    CONSTRAINT cleanup_runs_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES cleanup_schedules (id) ON DELETE CASCADE,
    CONSTRAINT cleanup_runs_trigger_check CHECK (`trigger` IN ('schedule', 'manual'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX cleanup_runs_schedule_idx ON cleanup_runs (schedule_id, id);  -- ≈ (schedule_id, id DESC)

-- A run forgets the fingerprints past their horizon (PostgreSQL: a BRIN on forget_at).
CREATE INDEX dedup_fingerprints_forget_idx ON dedup_fingerprints (forget_at);
