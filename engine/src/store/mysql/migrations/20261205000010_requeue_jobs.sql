-- Bulk requeue jobs (engine/src/actions/bulk): the PostgreSQL store's requeue_jobs and
-- requeue_job_items (migrations 20261130000050 and 20261130000053) in MySQL's terms. The
-- selection is frozen at confirmation as one item row per record; one runner per job holds a
-- GET_LOCK (store/mysql/requeue_jobs.rs). MySQL has no partial index: the running jobs are read
-- by (state, id), a job's pending items by (job_id, state, seq).
CREATE TABLE requeue_jobs (
    id                BIGINT NOT NULL AUTO_INCREMENT,                           -- identity → AUTO_INCREMENT
    created_at        DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),          -- now() default → UTC expression default
    created_by        VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- as audit_log.actor
    reason            TEXT CHARACTER SET utf8mb4 NULL,                          -- free text
    filter            JSON NOT NULL,                                            -- jsonb → JSON (MariaDB: LONGTEXT with a json_valid check)
    state             VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'running', -- text + CHECK, as PostgreSQL
    paused_reason     TEXT CHARACTER SET utf8mb4 NULL,                          -- free text
    rate_per_sec      DOUBLE NOT NULL,                                          -- double precision
    canary_size       INT NOT NULL,                                             -- integer
    failure_threshold DOUBLE NOT NULL,                                          -- double precision
    total             BIGINT NOT NULL,
    done              BIGINT NOT NULL DEFAULT 0,
    skipped           BIGINT NOT NULL DEFAULT 0,
    failed            BIGINT NOT NULL DEFAULT 0,
    started_at        DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    finished_at       DATETIME(6) NULL,
    updated_at        DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    KEY requeue_jobs_state_idx (state, id),                                    -- ≈ PostgreSQL's (id) WHERE state = 'running'
    CONSTRAINT requeue_jobs_state_check CHECK (state IN ('running', 'paused', 'cancelled', 'completed')),
    CONSTRAINT requeue_jobs_rate_check CHECK (rate_per_sec > 0),
    CONSTRAINT requeue_jobs_canary_check CHECK (canary_size >= 0),
    CONSTRAINT requeue_jobs_threshold_check CHECK (failure_threshold > 0 AND failure_threshold <= 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE requeue_job_items (
    job_id         BIGINT NOT NULL,
    seq            INT NOT NULL,                                                -- order of work: record id order at the freeze
    record_id      BIGINT NOT NULL,                                             -- no foreign key, as PostgreSQL (cleanup may delete the record)
    state          VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending',
    detail         TEXT CHARACTER SET utf8mb4 NULL,                             -- why an item was skipped or failed
    record_version BIGINT NULL,                                                 -- the record's version at the freeze
    PRIMARY KEY (job_id, seq),
    KEY requeue_job_items_pending_idx (job_id, state, seq),                     -- ≈ PostgreSQL's (job_id, seq) WHERE state = 'pending'
    CONSTRAINT requeue_job_items_job_id_fkey FOREIGN KEY (job_id) REFERENCES requeue_jobs (id) ON DELETE CASCADE,
    CONSTRAINT requeue_job_items_state_check CHECK (state IN ('pending', 'done', 'skipped', 'failed'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
