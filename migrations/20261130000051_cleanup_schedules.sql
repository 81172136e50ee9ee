-- Cleanup schedules and their runs (engine/src/actions/cleanup). A schedule deletes records of
-- the given statuses (default only succeeded) older than its retention, in bounded batches;
-- with several server instances exactly one runs a tick: an advisory lock per schedule plus the
-- compare-and-set on next_run_at, and the unique (schedule_id, tick_at) of the runs.
CREATE TABLE cleanup_schedules (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           TEXT NOT NULL,
    -- Five-field cron expression (minute hour day-of-month month day-of-week), UTC.
    cron           TEXT NOT NULL,
    retention_days INTEGER NOT NULL DEFAULT 30,
    batch_size     INTEGER NOT NULL DEFAULT 5000,
    statuses       TEXT[] NOT NULL DEFAULT '{succeeded}',
    -- NULL: every consumer group.
    consumer_group TEXT,
    enabled        BOOLEAN NOT NULL DEFAULT true,
    -- The tick the last scheduled run was for, and the next one due.
    last_run_for   TIMESTAMPTZ,
    next_run_at    TIMESTAMPTZ,
    created_by     TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT cleanup_schedules_name_key UNIQUE (name),
    CONSTRAINT cleanup_schedules_retention_check CHECK (retention_days BETWEEN 1 AND 3650),
    CONSTRAINT cleanup_schedules_batch_check CHECK (batch_size BETWEEN 1 AND 100000),
    -- Never processing records; failed and dead only when an operator asked for them.
    CONSTRAINT cleanup_schedules_statuses_check
        CHECK (cardinality(statuses) > 0 AND statuses <@ ARRAY['succeeded', 'failed', 'dead'])
);

CREATE TABLE cleanup_runs (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id  BIGINT NOT NULL REFERENCES cleanup_schedules (id) ON DELETE CASCADE,
    -- `schedule` (a cron tick) or `manual` (run now).
    trigger      TEXT NOT NULL,
    -- The cron tick a scheduled run is for; NULL for manual runs.
    tick_at      TIMESTAMPTZ,
    actor        TEXT NOT NULL,
    -- Records older than this were deleted.
    cutoff       TIMESTAMPTZ NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at  TIMESTAMPTZ,
    rows_deleted BIGINT NOT NULL DEFAULT 0,
    batches      INTEGER NOT NULL DEFAULT 0,
    error        TEXT,
    CONSTRAINT cleanup_runs_trigger_check CHECK (trigger IN ('schedule', 'manual')),
    CONSTRAINT cleanup_runs_tick_key UNIQUE (schedule_id, tick_at)
);
CREATE INDEX cleanup_runs_schedule_idx ON cleanup_runs (schedule_id, id DESC);

-- Cleanup's batches and dry runs: succeeded records by completion time. Written once per
-- completion (the status change already rules out a HOT update).
CREATE INDEX dedup_records_cleanup_idx ON dedup_records (completed_at) WHERE status = 'succeeded';
-- Failed and dead records by last change, for schedules that include them.
CREATE INDEX dedup_records_cleanup_unsettled_idx ON dedup_records (status, updated_at)
    WHERE status IN ('failed', 'dead');
