-- The record's version (PostgreSQL's xmin, engine/src/actions/record.rs RECORD_VERSION_SQL) when
-- a bulk requeue froze its selection: the runner skips an item whose record changed since
-- (requeued by another job or by hand, retried, released), so two overlapping jobs, or a job and
-- a single requeue, never both republish one record. NULL for items frozen before this column.
ALTER TABLE requeue_job_items ADD COLUMN record_version BIGINT;
