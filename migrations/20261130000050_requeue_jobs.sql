-- Bulk requeue jobs (engine/src/actions/bulk): the selection is frozen at confirmation as one
-- item row per record, so records arriving later are not included; a background runner (one
-- per job, by advisory lock) works through the pending items at the job's rate. Survives a
-- page reload and a server restart: everything is here.
CREATE TABLE requeue_jobs (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by        TEXT NOT NULL,
    reason            TEXT,
    -- The records filter as given (console/filter.rs RecordFilter, JSON).
    filter            JSONB NOT NULL,
    state             TEXT NOT NULL DEFAULT 'running',
    -- Why the job paused (canary failed, failure ratio, operator).
    paused_reason     TEXT,
    -- Messages per second.
    rate_per_sec      DOUBLE PRECISION NOT NULL,
    -- The first items, which must all succeed before the rest run.
    canary_size       INTEGER NOT NULL,
    -- Pause when the share of failed publishes among the recent items passes this (0..1].
    failure_threshold DOUBLE PRECISION NOT NULL,
    total             BIGINT NOT NULL,
    done              BIGINT NOT NULL DEFAULT 0,
    skipped           BIGINT NOT NULL DEFAULT 0,
    failed            BIGINT NOT NULL DEFAULT 0,
    started_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at       TIMESTAMPTZ,
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT requeue_jobs_state_check CHECK (state IN ('running', 'paused', 'cancelled', 'completed')),
    CONSTRAINT requeue_jobs_rate_check CHECK (rate_per_sec > 0),
    CONSTRAINT requeue_jobs_canary_check CHECK (canary_size >= 0),
    CONSTRAINT requeue_jobs_threshold_check CHECK (failure_threshold > 0 AND failure_threshold <= 1)
);
CREATE INDEX requeue_jobs_running_idx ON requeue_jobs (id) WHERE state = 'running';

CREATE TABLE requeue_job_items (
    job_id    BIGINT NOT NULL REFERENCES requeue_jobs (id) ON DELETE CASCADE,
    -- Order of work (record id order at freeze).
    seq       INTEGER NOT NULL,
    record_id BIGINT NOT NULL,
    state     TEXT NOT NULL DEFAULT 'pending',
    -- Why an item was skipped or failed.
    detail    TEXT,
    PRIMARY KEY (job_id, seq),
    CONSTRAINT requeue_job_items_state_check CHECK (state IN ('pending', 'done', 'skipped', 'failed'))
);
CREATE INDEX requeue_job_items_pending_idx ON requeue_job_items (job_id, seq) WHERE state = 'pending';
